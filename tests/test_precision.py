"""Mixed precision on the CPU: bf16 and fp16 autocast through profile, solve and run.

A pipeline computes each microbatch as a single process with gradient accumulation does,
so in bf16 and fp16 it is compared with that loop (planner.runtime.reference with
``microbatch_size``), tightly; against one pass over the whole batch, which rounds
differently in 16 bits, with a bf16-sized tolerance. fp16 must skip exactly the steps
``torch.amp.GradScaler`` skips, on every stage at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_runtime import hard_timeout, make_plan  # noqa: F401
from test_show import _run

from planner.errors import InputError
from planner.profile.measure import profile_model
from planner.runtime import run_plan
from planner.runtime.loss_scale import AgreedLossScaler
from planner.runtime.reference import train_single_process
from planner.runtime.runner import run_precision
from planner.runtime.settings import RunSettings, Training
from planner.schedule import build_schedule

HERE = Path(__file__).parent
BF16 = HERE / "models" / "autocast_check.py"  # its loss insists on bf16 logits
FP16 = HERE / "models" / "fp16_overflow.py"  # fp16; the first steps overflow
ROOT = HERE.parent


def _close(report, ref, rtol: float, atol: float) -> None:  # type: ignore[no-untyped-def]
    assert report.losses == pytest.approx(ref.losses, rel=rtol, abs=atol)
    assert report.parameters is not None and set(report.parameters) == set(ref.parameters)
    for name, value in ref.parameters.items():
        torch.testing.assert_close(report.parameters[name], value, rtol=rtol, atol=atol)


# -- the loss scaler ----------------------------------------------------------------------


def test_scaler_follows_gradscaler_rule() -> None:
    scaler = AgreedLossScaler(torch.device("cpu"), growth_interval=2)
    assert scaler.get_scale() == 2.0**16
    g = torch.tensor([2.0**16, 2.0**17])
    assert scaler.unscale_and_agree([g]) is False  # finite: unscaled in place, step taken
    assert g.tolist() == [1.0, 2.0] and scaler.get_scale() == 2.0**16
    assert scaler.unscale_and_agree([torch.tensor([1.0])]) is False  # 2 clean steps: grow
    assert scaler.get_scale() == 2.0**17
    assert scaler.unscale_and_agree([torch.tensor([1.0, float("inf")])]) is True
    assert scaler.get_scale() == 2.0**16  # backed off
    assert scaler.unscale_and_agree([torch.tensor([float("nan")])]) is True
    assert scaler.skipped == [False, False, True, True]
    assert float(scaler.scale(torch.tensor(3.0))) == 3.0 * 2.0**15


# -- bf16 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "stages", "recompute"),
    [("1f1b", "0-2:cpu0;3-6:cpu1", ()), ("zb", "0-3:cpu0;4-6:cpu1", (0,))],
)
def test_bf16_run_equals_single_process_bf16(
    schedule: str, stages: str, recompute: tuple[int, ...]
) -> None:
    steps, warmup, m, mbs = 2, 1, 4, 2
    plan = make_plan(stages, schedule, m, mbs, recompute)
    report = run_plan(
        plan, BF16, steps=steps, warmup=warmup, timeout_s=60, optimizer="adam", lr=1e-2,
        precision="bf16", return_params=True,
    )  # fmt: skip
    assert report.precision == "bf16" and report.skipped_steps == []
    kwargs = {"steps": steps + warmup, "batch_size": m * mbs, "optimizer": "adam", "lr": 1e-2}
    accumulated = train_single_process(BF16, precision="bf16", microbatch_size=mbs, **kwargs)
    _close(report, accumulated, rtol=1e-5, atol=1e-6)
    whole = train_single_process(BF16, precision="bf16", **kwargs)
    _close(report, whole, rtol=2e-2, atol=2e-3)  # one bf16 pass over the batch rounds apart


def test_bf16_profile_halves_what_crosses_the_cuts() -> None:
    bf16 = profile_model(BF16, [4], repeat=1, warmup=0, min_time_s=0, precision="bf16")
    fp16 = profile_model(FP16, [4], repeat=1, warmup=0, min_time_s=0, precision="fp16")
    assert bf16.precision == "bf16" and fp16.precision == "fp16"
    assert fp16.measurement(4).layers[0].output_bytes == 4 * 32 * 2  # fp16 Linear output
    linear = [0, 2, 4]  # Linear layers make bf16 outputs under autocast; GELU keeps them
    for k in linear:
        out = bf16.measurement(4).layers[k].output_bytes
        assert out == 4 * 32 * 2  # 4 rows x 32 features x 2 bytes
    # Weights, gradients and optimizer state stay fp32 (the master weights).
    assert bf16.layers[0].param_bytes == (16 * 32 + 32) * 4
    assert bf16.layers[0].optimizer_state_bytes == 2 * bf16.layers[0].param_bytes


# -- fp16 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "stages"),
    [("1f1b", "0-1:cpu0;2-4:cpu1"), ("gpipe", "0:cpu0;1-2:cpu1;3-4:cpu2")],
)
def test_fp16_skips_the_steps_gradscaler_skips(schedule: str, stages: str) -> None:
    steps, warmup, m, mbs = 4, 1, 4, 2
    plan = make_plan(stages, schedule, m, mbs)
    report = run_plan(
        plan, FP16, steps=steps, warmup=warmup, timeout_s=60, optimizer="adam", lr=1e-2,
        precision="fp16", return_params=True,
    )  # fmt: skip
    ref = train_single_process(
        FP16, steps=steps + warmup, batch_size=m * mbs, optimizer="adam", lr=1e-2,
        precision="fp16", microbatch_size=mbs,
    )  # fmt: skip
    skipped = [i for i, s in enumerate(ref.skipped) if s]
    assert 0 < len(skipped) < steps + warmup  # some steps overflow, later ones train
    assert report.skipped_steps == skipped
    _close(report, ref, rtol=1e-5, atol=1e-6)


def test_fp16_with_a_replicated_stage_and_shared_devices() -> None:
    plan = make_plan("0-1:cpu0,cpu1;2-4:cpu2", "1f1b", 4, 2)
    report = run_plan(
        plan, FP16, steps=3, warmup=1, timeout_s=60, optimizer="sgd", lr=1e-3,
        precision="fp16", device_map="cpu0=0,cpu1=1,cpu2=1", return_params=True,
    )  # fmt: skip
    ref = train_single_process(
        FP16, steps=4, batch_size=8, optimizer="sgd", lr=1e-3, precision="fp16",
        microbatch_size=2,
    )  # fmt: skip
    assert report.skipped_steps == [i for i, s in enumerate(ref.skipped) if s]
    _close(report, ref, rtol=1e-5, atol=1e-6)


def test_fp16_refuses_2bw_and_a_precision_other_than_the_profiles() -> None:
    stages = make_plan("0-1:cpu0;2-4:cpu1", "2bw", 4, 2).stages
    two_bw = build_schedule("2bw", stages, 4)
    with pytest.raises(InputError, match="2bw schedule"):
        run_precision(
            RunSettings(5, Training(precision="fp16")), None, "plan.json", schedule=two_bw
        )
    profiled = RunSettings(5, Training(precision="bf16"), profile_path="p.json")
    with pytest.raises(InputError, match="measured at bf16, not fp16") as info:
        run_precision(profiled, "fp16", "plan.json")
    assert info.value.one_line().startswith("plan.json")
    assert run_precision(profiled, None) == "bf16"
    assert run_precision(RunSettings(5), None) == "fp32"


def test_fp16_2bw_is_refused_before_a_plan_is_made() -> None:
    """solve and simulate refuse what run would refuse, instead of writing such a plan."""
    from dataclasses import replace

    from planner.cost import synthetic_profile
    from planner.simulate import simulate
    from planner.solve import solve
    from planner.topology import load_topology

    fp16 = replace(synthetic_profile(4), precision="fp16")
    with pytest.raises(InputError, match="2bw schedule") as info:
        simulate(fp16, None, "0-1:a;2-3:b", "2bw", 4)
    assert info.value.field == "schedule"
    assert simulate(fp16, None, "0-1:a;2-3:b", "1f1b", 4).iteration_ms > 0
    topology = load_topology(ROOT / "topologies" / "cpu.yaml")
    with pytest.raises(InputError, match="2bw schedule") as info:
        solve(fp16, topology, schedule="2bw")
    assert info.value.field == "--schedule"


# -- the whole chain from the command line ---------------------------------------------


def test_bf16_profile_solve_run_from_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """profile, solve and run as the command line calls them (main, in this process: the
    ``-m planner.cli`` entry point is test_show's and test_hf_models')."""
    monkeypatch.chdir(ROOT)
    profile, plan = tmp_path / "p.json", tmp_path / "plan.json"
    code, _, err = _run(
        capsys, "profile", str(BF16), "-b", "2", "--precision", "bf16", "--repeat", "1",
        "--warmup", "0", "--min-time", "0", "-o", str(profile), "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(profile.read_text())["precision"] == "bf16"
    code, _, err = _run(
        capsys, "solve", "--profile", str(profile), "--topology", "topologies/cpu.yaml",
        "--microbatches", "4", "-o", str(plan),
    )  # fmt: skip
    assert code == 0, err
    code, out, err = _run(capsys, "run", str(plan), "--model", str(BF16), "--steps", "1", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["precision"] == "bf16" and len(report["losses"]) == 2
    code, _, err = _run(capsys, "run", str(plan), "--model", str(BF16), "--precision", "fp32")
    assert code == 2
    assert "measured at bf16, not fp32" in err and "Traceback" not in err


# -- the simulator --------------------------------------------------------------------


def test_simulator_times_fp16_agreement_and_deferred_steps() -> None:
    from dataclasses import replace

    from planner.cost import synthetic_profile
    from planner.plan import parse_stages
    from planner.schedule.actions import ActionType
    from planner.simulate import overflow_agreement_ms, simulate, simulate_schedule
    from planner.topology import uniform_topology

    fp32 = synthetic_profile(4, optimizer_ms=2.0)
    fp16 = replace(fp32, precision="fp16")
    topology = uniform_topology(2, latency_ms=0.5)
    stages = parse_stages("0:gpu0;1:gpu1;2:gpu0;3:gpu1")
    schedule = build_schedule("interleaved", stages, 4)
    agreement = overflow_agreement_ms(fp16, topology, stages, schedule)
    assert agreement == {(2, "gpu0"): pytest.approx(1.0), (3, "gpu1"): pytest.approx(1.0)}
    assert overflow_agreement_ms(fp32, topology, stages, schedule) == {}
    assert overflow_agreement_ms(fp16, None, stages, schedule) == {}
    # Interleaved steps stage 2 before gpu0's last backwards of stage 0; fp16 moves it after.
    order = [a.kind for a in schedule.devices["gpu0"]]
    assert order.index(ActionType.OPTIMIZER_STEP) < max(
        i for i, k in enumerate(order) if k is ActionType.B
    )
    slow = simulate_schedule(fp16, topology, stages, schedule, 1)
    fast = simulate_schedule(fp32, topology, stages, schedule, 1)
    assert slow.iteration_ms > fast.iteration_ms
    steps = [e for e in slow.events if e.kind == "STEP" and e.device == "gpu0"]
    backs = [e for e in slow.events if e.kind == "B" and e.device == "gpu0"]
    assert min(e.start_ms for e in steps) >= max(e.end_ms for e in backs)
    plain = simulate(fp16, topology, parse_stages("0-1:gpu0;2-3:gpu1"), "1f1b", 4)
    assert (
        plain.iteration_ms
        > simulate(fp32, topology, parse_stages("0-1:gpu0;2-3:gpu1"), "1f1b", 4).iteration_ms
    )
