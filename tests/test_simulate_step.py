"""The optimizer step in the simulator: taken from the profile, overridable, in the bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from families import BUILT, GENERATED, partition

from planner.cli import main
from planner.cost import stage_step_ms, synthetic_profile
from planner.plan import parse_stages
from planner.profile import load_profile
from planner.schedule import family
from planner.simulate import lower_bound_ms, simulate
from planner.topology import uniform_topology

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("schedule", GENERATED)
def test_one_stage_iteration_grows_by_exactly_the_step(schedule: str) -> None:
    with_step = synthetic_profile(4, forward_ms=1.25, optimizer_ms=0.375)
    without = synthetic_profile(4, forward_ms=1.25)
    stages = parse_stages("0-3:a")
    a = simulate(with_step, None, stages, schedule, 6)
    b = simulate(without, None, stages, schedule, 6)
    assert stage_step_ms(with_step, 0, 3) == 1.5
    assert a.iteration_ms == b.iteration_ms + 1.5
    assert a.predicted()["step_ms"] == [1.5] and "step_ms" not in b.predicted()
    # The step is work: busy grows by it, the lower bound too (every device steps).
    assert a.busy_ms["a"] == b.busy_ms["a"] + 1.5
    assert a.lower_bound_ms == b.lower_bound_ms + 1.5 <= a.iteration_ms


def test_the_step_scales_with_device_speed_and_an_explicit_value_overrides() -> None:
    prof = synthetic_profile(4, optimizer_ms=0.5)
    stages = parse_stages("0-1:gpu0;2-3:gpu1")
    topo = uniform_topology(2, bandwidth=100e9, latency_ms=0.0, speed=2.0)
    assert stage_step_ms(prof, 0, 1, speed=2.0) == 0.5
    base = simulate(prof, topo, stages, "1f1b", 4, step_ms=0.0)
    default = simulate(prof, topo, stages, "1f1b", 4)
    # Two stages step in parallel at the end of the flush: the last to finish adds its step.
    assert default.iteration_ms == pytest.approx(base.iteration_ms + 0.5)
    assert default.step_ms == [0.5, 0.5]
    given = simulate(prof, topo, stages, "1f1b", 4, step_ms=[3.0, 0.0])
    assert given.step_ms == [3.0, 0.0]
    steps = [e for e in given.events if e.kind == "STEP"]
    assert [e.device for e in steps] == ["gpu0"]
    assert steps[0].end_ms - steps[0].start_ms == pytest.approx(3.0)
    with pytest.raises(Exception, match="one step time per stage"):
        simulate(prof, topo, stages, "1f1b", 4, step_ms=[1.0])


def test_lower_bound_counts_each_devices_steps() -> None:
    prof = synthetic_profile(4, optimizer_ms=0.25)
    stages = parse_stages("0-1:a;2-3:b")
    # Each device: 8 microbatches x (2 forward + 4 backward) + one step over 2 layers.
    assert lower_bound_ms(prof, None, stages, 8, 1, flush=False) == 8 * 6.0 + 0.5
    assert lower_bound_ms(prof, None, stages, 8, 1, flush=False, step_ms=0.0) == 48.0
    for schedule in BUILT:
        ranges = ["0", "1", "2", "3"] if family(schedule).interleaved else ["0-1", "2-3"]
        spec = partition(schedule, ranges, ["a", "b"])
        r = simulate(prof, None, parse_stages(spec), schedule, 8)
        assert r.lower_bound_ms <= r.iteration_ms + 1e-9, schedule


def test_real_profile_prediction_includes_its_measured_step() -> None:
    prof = load_profile(ROOT / "profiles" / "mlp.json")
    stages = parse_stages("0-5:cpu0")
    with_step = simulate(prof, None, stages, "1f1b", 4, 8)
    no_step = simulate(prof, None, stages, "1f1b", 4, 8, step_ms=0.0)
    total = sum(layer.optimizer_ms for layer in prof.layers)
    assert total > 0
    assert with_step.iteration_ms == pytest.approx(no_step.iteration_ms + total)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().out


def test_cli_default_uses_the_profile_and_show_reproduces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = str(ROOT / "profiles" / "mlp.json")
    plans = {}
    for name, extra in (("default", []), ("zero", ["--step-ms", "0"])):
        out = tmp_path / f"{name}.json"
        code, _ = _run(
            [
                "simulate", "--profile", prof, "--stages", "0-2:a;3-5:b",
                "--microbatches", "4", "-o", str(out), "--json", *extra,
            ],
            capsys,
        )  # fmt: skip
        assert code == 0
        plans[name] = json.loads(out.read_text())["predicted"]
        code, text = _run(["show", str(out), "--json", "--no-gantt"], capsys)
        assert code == 0
        assert json.loads(text)["iteration_ms"] == plans[name]["iteration_ms"]
    assert plans["default"]["iteration_ms"] > plans["zero"]["iteration_ms"]
    assert "step_ms" in plans["default"] and "step_ms" not in plans["zero"]


def _report_notes(step_ms: list[float] | None, given_step_ms: float | None = None) -> list[str]:
    """The notes of a run of a 40 ms prediction (``step_ms``: its optimizer steps;
    ``given_step_ms``: the plan's ``simulate --step-ms``) whose measured step spends 12 ms in
    the optimizer."""
    from types import SimpleNamespace

    from planner.plan import FileRef, Plan, Prediction
    from planner.runtime.measured import RankResult, RunResult
    from planner.runtime.report import build_report
    from planner.schedule import build_schedule

    rank = RankResult(
        rank=0,
        devices=["cpu0"],
        torch_device="cpu",
        step_seconds=[0.05],
        losses=[[1.0]],
        stage_ms={"F0": 10.0, "STEP0": 12.0},
        peak_memory_bytes=1,
    )
    stages = parse_stages("0:cpu0")
    schedule = build_schedule("1f1b", stages, 1)
    predicted = Prediction(40.0, 25.0, 0.0, 40.0, {}, {}, step_ms=step_ms)
    plan = Plan(FileRef("<memory>", ""), FileRef(None), 1, 1, stages, schedule, predicted)
    plan.step_ms = given_step_ms
    placement = SimpleNamespace(
        device_type="cpu", backend="gloo", world_size=1, shared=False, microbatch_size=1
    )
    report = build_report(RunResult([rank]), plan=plan, placement=placement, steps=1, warmup=0,
                          notes=[])  # fmt: skip
    return report.notes


def test_run_report_suggests_step_ms_only_when_the_prediction_leaves_the_step_out() -> None:
    assert any("--step-ms" in n for n in _report_notes(None))
    assert _report_notes([12.0]) == []
    assert _report_notes(None, given_step_ms=12.0) == []
