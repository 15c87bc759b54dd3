"""The prediction's band: quantile profiles from the spreads, the band by the documented
rule, the plan's optional ``predicted.iteration_band_ms``, and the run report's verdict."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.plan import FileRef, Plan, parse_stages, plan_from_simulation
from planner.profile import load_profile
from planner.profile.spread import has_spread, quantile_profile
from planner.runtime.report import RunReport
from planner.simulate import simulate
from planner.simulate.band import Band, prediction_band
from planner.solve import solve
from planner.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "profiles" / "gpt.json"
CPU = ROOT / "topologies" / "cpu.yaml"
NAMES = ("forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms")


def test_quantile_profiles_take_each_end_of_every_spread() -> None:
    profile = load_profile(GPT)
    low, high = quantile_profile(profile, "low"), quantile_profile(profile, "high")
    for m, lo, hi in zip(profile.measurements, low.measurements, high.measurements, strict=True):
        for t, a, b in zip(m.layers, lo.layers, hi.layers, strict=True):
            for name in NAMES:
                median = getattr(t, name)
                assert getattr(a, name) == min(median, *t.spread[name])
                assert getattr(b, name) == max(median, *t.spread[name])
            assert a.spread == {} and b.spread == {}
    assert profile.measurements[0].layers[1].spread  # the original is left alone
    # A spread that excludes its median (a hand-edited file) is widened to include it.
    odd = copy.deepcopy(profile)
    t = odd.measurements[0].layers[1]
    t.spread["forward_ms"] = [t.forward_ms * 1.1, t.forward_ms * 1.2]
    assert quantile_profile(odd, "low").measurements[0].layers[1].forward_ms == t.forward_ms
    with pytest.raises(ValueError):
        quantile_profile(profile, "middle")  # type: ignore[arg-type]


def test_the_band_is_the_schedule_simulated_at_both_ends() -> None:
    profile, topology = load_profile(GPT), load_topology(CPU)
    stages = parse_stages("0-2:cpu0;3-5:cpu1")
    result = simulate(profile, topology, stages, "1f1b", 4, 2)
    band = prediction_band(profile, topology, stages, result)
    for side, end in (("low", band.low_ms), ("high", band.high_ms)):
        again = simulate(quantile_profile(profile, side), topology, stages, "1f1b", 4, 2)
        assert end == pytest.approx(again.iteration_ms, rel=1e-12)
    assert band.low_ms < result.iteration_ms < band.high_ms
    assert band.contains(result.iteration_ms) and not band.contains(band.high_ms * 1.01)
    # 2bw is timed as a stream; its band is of the same steady-state iteration.
    stream = simulate(profile, topology, stages, "2bw", 4, 2)
    wide = prediction_band(profile, topology, stages, stream)
    assert wide.low_ms < stream.iteration_ms < wide.high_ms


def test_a_tensor_parallel_plan_has_the_band_of_its_shards_spreads() -> None:
    # The quantile profiles moved the whole layers' timings only, so a plan whose stages
    # are timed from their shards' entries had a band of zero width (a measured TP2 x PP2
    # plan of examples/hf_llama.py: "band 159.765-159.765").
    from planner.cost import synthetic_profile, synthetic_tensor_parallel

    profile = synthetic_tensor_parallel(synthetic_profile(4), degrees=(2,))
    for m in profile.measurements:
        for t in m.layers:
            shard = t.sharded["tp2"]
            shard.spread = {
                name: [getattr(shard, name) * 0.9, getattr(shard, name) * 1.2] for name in NAMES
            }
    assert has_spread(profile)
    low = quantile_profile(profile, "low").measurements[0].layers[1].sharded["tp2"]
    shard = profile.measurements[0].layers[1].sharded["tp2"]
    assert low.forward_ms == pytest.approx(0.9 * shard.forward_ms) and low.spread == {}
    stages = parse_stages("0-1:a+b;2-3:c+d")
    result = simulate(profile, None, stages, "1f1b", 4, 1)
    band = prediction_band(profile, None, stages, result)
    assert band.low_ms < result.iteration_ms < band.high_ms


def test_a_profile_without_spreads_has_a_band_of_zero_width() -> None:
    profile = load_profile(GPT)
    for m in profile.measurements:
        for t in m.layers:
            t.spread = {}
    assert not has_spread(profile)
    stages = parse_stages("0-2:cpu0;3-5:cpu1")
    result = simulate(profile, None, stages, "1f1b", 4, 2)
    band = prediction_band(profile, None, stages, result)
    assert band == Band(result.iteration_ms, result.iteration_ms)


def test_plans_carry_the_band_and_plans_without_it_round_trip_unchanged(tmp_path: Path) -> None:
    plan = solve(GPT, CPU, num_microbatches=4, time_limit=5)
    band = plan.predicted.iteration_band_ms
    assert band is not None and band[0] < band[1]
    assert band[0] <= plan.predicted.iteration_ms <= band[1]
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path).predicted.iteration_band_ms == band
    # A plan written before bands existed reads and writes back without one.
    data = json.loads(path.read_text())
    del data["predicted"]["iteration_band_ms"]
    path.write_text(json.dumps(data))
    again = Plan.load(path)
    assert again.predicted.iteration_band_ms is None
    assert again.to_dict()["predicted"] == data["predicted"]
    data["predicted"]["iteration_band_ms"] = [5.0, 1.0]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        Plan.load(path)
    assert info.value.field == "predicted.iteration_band_ms"


def test_simulate_writes_the_band_into_its_plan() -> None:
    profile = load_profile(GPT)
    stages = parse_stages("0-2:a;3-5:b")
    result = simulate(profile, None, stages, "zb", 4, 1)
    band = prediction_band(profile, None, stages, result)
    plan = plan_from_simulation(
        result, stages, profile=FileRef("p.json"), topology=FileRef(None), band_ms=band.as_list()
    )
    assert plan.to_dict()["predicted"]["iteration_band_ms"] == band.as_list()


def _report(iteration_ms: float, band: list[float] | None) -> RunReport:
    return RunReport(
        schedule="1f1b", device="cpu", backend="gloo", world_size=2, shared=False,
        placement={}, steps=3, warmup=1, microbatch_size=2, num_microbatches=4,
        iteration_ms=iteration_ms, step_ms=[iteration_ms], predicted_iteration_ms=100.0,
        losses=[], peak_memory_bytes={}, memory_kind="max_rss", stage_ms={},
        predicted_band_ms=band,
    )  # fmt: skip


def test_the_run_report_says_whether_the_measurement_is_inside_the_band() -> None:
    inside, outside, none = _report(104.0, [95.0, 105.0]), _report(106.0, [95.0, 105.0]), None
    assert inside.inside_band is True and outside.inside_band is False
    assert _report(104.0, none).inside_band is None
    out = outside.to_dict()
    assert out["predicted"]["iteration_band_ms"] == [95.0, 105.0] and out["inside_band"] is False


def test_a_tiny_stage_does_not_set_the_compute_ratio() -> None:
    from planner.plan import Plan
    from planner.profile import Layer, LayerTiming, Measurement, Profile
    from planner.runtime.calibrate import calibrated_profile
    from planner.runtime.report import explain_gap
    from planner.schedule import build_schedule

    # An embedding of 0.2 ms beside two blocks of 6 ms each (F 2 + B 4), as the demo has.
    timing = [LayerTiming(0.1, 0.1, 0.1, 0.0, 10, 10, spread={"forward_ms": [0.09, 0.11]})]
    timing += [LayerTiming(2.0, 4.0, 2.2, 1.8, 10, 10) for _ in range(2)]
    profile = Profile(
        "toy", [Layer(f"l{i}", 1, 4, 8) for i in range(3)], [Measurement(2, 10, timing)]
    )
    stages = parse_stages("0-0:a;1-1:b;2-2:c")
    plan = Plan(FileRef("x"), FileRef("y"), 2, 4, stages, build_schedule("1f1b", stages, 4))
    measured = {"F0": 0.3, "B0": 0.3, "F1": 2.1, "B1": 4.2, "F2": 2.0, "B2": 4.0}
    report = _report(100.0, None)
    report.stage_ms = measured
    explain_gap(report, profile, plan)
    assert report.compute_ratio == pytest.approx(1.05)  # not the embedding's 3.0
    # The calibrated profile keeps a band: each spread scaled with its timing.
    calibrated = calibrated_profile(profile, plan, measured)
    assert calibrated.measurements[0].layers[0].spread["forward_ms"] == pytest.approx([0.27, 0.33])
