"""Runtime pieces that need no processes: placement, message order, calibration, 2bw."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from planner.errors import InputError
from planner.plan import FileRef, Plan, parse_stages
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.runtime.calibrate import calibrated_profile, stage_ratios
from planner.runtime.comm import message_key, message_order
from planner.runtime.measured import CountedCollective
from planner.runtime.optimizer import StreamedTwoBW
from planner.runtime.placement import place
from planner.runtime.report import RunReport, explain_gap
from planner.schedule import ActionType, build_schedule


def test_cpu_places_one_process_per_device_in_stage_order() -> None:
    stages = parse_stages("0-1:b,a;2:c")
    p = place(stages, "cpu")
    assert p.devices == ["b", "a", "c"] and p.rank_of == {"b": 0, "a": 1, "c": 2}
    assert p.backend == "gloo" and not p.shared


def test_fewer_gpus_than_devices_share_in_contiguous_blocks() -> None:
    stages = parse_stages("0:g0;1:g1;2:g2;3:g3")
    one = place(stages, "cuda", gpus=1)
    assert one.world_size == 1 and one.shared and set(one.rank_of.values()) == {0}
    two = place(stages, "cuda", gpus=2)
    assert two.rank_of == {"g0": 0, "g1": 0, "g2": 1, "g3": 1} and two.backend == "nccl"
    enough = place(stages, "cuda", gpus=8)
    assert enough.world_size == 4 and not enough.shared


def test_device_map_is_checked() -> None:
    stages = parse_stages("0:a;1:b")
    assert place(stages, "cpu", device_map="a=0,b=0").shared
    for bad, words in [("a=0", "no rank given for b"), ("a=0,b=2", "0..n-1"), ("a=0,b=0,z=1", "z")]:
        with pytest.raises(InputError, match=words):
            place(stages, "cpu", device_map=bad)
    with pytest.raises(InputError, match="no CUDA device"):
        place(stages, "cuda", gpus=0)


def test_message_order_lists_every_cross_process_message_once() -> None:
    stages = parse_stages("0:a;1:b;2:a;3:b")
    sched = build_schedule("interleaved", stages, 4)
    order = message_order(sched.devices, stages, {"a": 0, "b": 1})
    sends = [
        message_key(x)
        for acts in sched.devices.values()
        for x in acts
        if x.kind in (ActionType.SEND_ACT, ActionType.SEND_GRAD)
    ]
    listed = order[(0, 1)] + order[(1, 0)]
    assert sorted(listed) == sorted(sends) and len(set(listed)) == len(listed)
    # Each sender's messages keep its own action order (one device per process).
    a_sends = [message_key(x) for x in sched.devices["a"] if x.kind.value.startswith("SEND")]
    assert order[(0, 1)] == a_sends
    # Two devices in one process exchange nothing over the network.
    assert message_order(sched.devices, stages, {"a": 0, "b": 0}) == {}


def _profile() -> Profile:
    timing = [LayerTiming(1.0, 2.0, 1.2, 0.8, 10, 10) for _ in range(4)]
    layers = [Layer(f"l{i}", 1, 4, 8) for i in range(4)]
    return Profile("toy", layers, [Measurement(2, 10, timing)])


def test_calibration_scales_each_stage_to_what_was_measured() -> None:
    stages = parse_stages("0-1:a;2-3:b", recompute=[1])
    plan = Plan(FileRef("x"), FileRef("y"), 2, 4, stages, build_schedule("1f1b", stages, 4))
    # stage 0 profiles F=2, B=4; stage 1 (recompute) F=2, B=4+2
    out = calibrated_profile(
        _profile(), plan, {"F0": 3.0, "B0": 8.0, "F1": 2.0, "I1": 3.0, "W1": 3.0, "STEP0": 5.0}
    )
    t = out.measurements[0].layers
    assert t[0].forward_ms == pytest.approx(1.5) and t[0].backward_ms == pytest.approx(4.0)
    assert t[2].forward_ms == pytest.approx(1.0) and t[2].backward_ms == pytest.approx(2.0)
    assert out.settings.calibrated is not None and out.settings.calibrated.step_ms == 5.0
    assert _profile().measurements[0].layers[0].forward_ms == 1.0  # the input is untouched


def test_calibration_of_a_zero_bubble_run_compares_its_halves_with_the_profiled_halves() -> None:
    """A zb run's ``I + W`` is what the simulator predicted from the layers' profiled halves
    (torch's split backward costs more than the whole one), not the whole backward: a run
    at exactly the predicted speed calibrates to 1.0. The first stage runs its whole
    backward as ``I`` (nothing to split off), so its halves are the whole backward."""
    timing = [LayerTiming(1.0, 2.0, 1.5, 1.0, 10, 10) for _ in range(4)]  # I + W = 1.25 x B
    profile = Profile(
        "toy", [Layer(f"l{i}", 1, 4, 8) for i in range(4)], [Measurement(2, 10, timing)]
    )
    stages = parse_stages("0-1:a;2-3:b")
    plan = Plan(FileRef("x"), FileRef("y"), 2, 4, stages, build_schedule("zb", stages, 4))
    measured = {"F0": 2.0, "I0": 4.0, "W0": 0.0, "F1": 2.0, "I1": 3.0, "W1": 2.0}
    assert stage_ratios(profile, plan, measured) == {0: (1.0, 1.0), 1: (1.0, 1.0)}
    slower = {**measured, "I1": 3.6, "W1": 2.4}  # 6.0 against the halves' 5.0
    assert stage_ratios(profile, plan, slower)[1] == (1.0, pytest.approx(1.2))


def test_calibration_scales_the_layers_shards_and_refuses_a_tensor_parallel_plan() -> None:
    """A plain plan's measured speed scales each layer's tensor-parallel shards as well (a
    later solve may split the layer); a TP plan's measured times hold its collectives,
    which scaling the shards by would count twice: refused, as `run --calibrate` does."""
    from planner.cost import synthetic_profile, synthetic_tensor_parallel

    profile = synthetic_tensor_parallel(synthetic_profile(4, forward_ms=1.0), (2,))
    stages = parse_stages("0-1:a;2-3:c")
    plan = Plan(FileRef("x"), FileRef("y"), 1, 4, stages, build_schedule("1f1b", stages, 4))
    out = calibrated_profile(profile, plan, {"F0": 3.0, "B0": 6.0, "F1": 4.0, "B1": 8.0})
    for i, rf in ((0, 1.5), (2, 2.0)):  # stage 0 profiles F = 2 x 1.0, stage 1 likewise
        before, after = profile.measurements[0].layers[i], out.measurements[0].layers[i]
        assert after.forward_ms == pytest.approx(rf * before.forward_ms)
        shard, scaled = before.sharded["tp2"], after.sharded["tp2"]
        assert scaled.forward_ms == pytest.approx(round(rf * shard.forward_ms, 4))
    grouped = parse_stages("0-1:a+b;2-3:c")
    tp_plan = Plan(FileRef("x"), FileRef("y"), 1, 4, grouped, build_schedule("1f1b", grouped, 4))
    with pytest.raises(InputError, match="stage 0 is tensor parallel"):
        calibrated_profile(profile, tp_plan, {"F0": 3.0, "B0": 6.0})


def test_streamed_2bw_versions() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = StreamedTwoBW([w], "sgd", lr=0.5)
    v0, v1 = opt.weights(0), opt.weights(1)
    assert v0[0] is not v1[0] and v0[0].item() == v1[0].item() == 1.0
    with pytest.raises(RuntimeError, match="not ready"):
        opt.weights(2)
    v0[0].grad = torch.tensor([2.0])  # gradient of iteration 0, computed with W(0)
    opt.step(0)  # W(1) = W(0) - 0.5 * 2 = 0
    assert opt.weights(2)[0].item() == 0.0 and opt.weights(1)[0].item() == 1.0


def _stage(stage_id: int, recompute: bool) -> tuple[object, torch.Tensor]:
    from planner.runtime.stage import StageRuntime

    class Block(torch.nn.Module):  # split stages return a tuple of outputs
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.b(torch.tanh(self.a(x))),)

    torch.manual_seed(0)
    module = Block()
    stage = StageRuntime(
        module, stage_id=stage_id, is_last=False, recompute=recompute, num_microbatches=1, loss=None
    )
    return stage, torch.randn(4, 8)


@pytest.mark.parametrize(
    ("stage_id", "recompute", "w_has_work"), [(0, False, False), (1, True, False), (1, False, True)]
)
def test_zero_bubble_i_and_w_split_as_the_cost_model_charges(
    stage_id: int, recompute: bool, w_has_work: bool
) -> None:
    # The cost model gives the first stage and recompute stages I = whole backward, W = 0;
    # a middle stage without recompute really leaves its weight gradients to W.
    from planner.cost import stage_times, synthetic_profile

    first = 0 if stage_id == 0 else 2
    t = stage_times(synthetic_profile(6), first, first + 1, 1, recompute=recompute)
    assert (t.weight_grad_ms > 0) == w_has_work
    stage, x = _stage(stage_id, recompute)
    out = stage.forward(0, [x])
    stage.backward_input(0, [torch.ones_like(out[0])])
    after_i = [p.grad is not None for p in stage.params]
    assert all(after_i) != w_has_work
    stage.backward_weight(0)
    assert all(p.grad is not None for p in stage.params)


def test_worker_env_puts_this_planner_first_on_the_path() -> None:
    from planner.runtime.launch import worker_env

    env = worker_env({"PYTHONPATH": "/elsewhere"})
    first, rest = env["PYTHONPATH"].split(os.pathsep)
    assert rest == "/elsewhere" and (Path(first) / "planner" / "runtime" / "launch.py").exists()


def _report(iteration_ms: float, stage_ms: dict[str, float]) -> RunReport:
    return RunReport(
        schedule="1f1b", device="cpu", backend="gloo", world_size=2, shared=False,
        placement={}, steps=3, warmup=1, microbatch_size=2, num_microbatches=4,
        iteration_ms=iteration_ms, step_ms=[iteration_ms], predicted_iteration_ms=100.0,
        losses=[], peak_memory_bytes={}, memory_kind="max_rss", stage_ms=stage_ms,
    )  # fmt: skip


def test_run_report_says_whether_compute_explains_the_gap() -> None:
    stages = parse_stages("0-1:a;2-3:b")
    plan = Plan(FileRef("x"), FileRef("y"), 2, 4, stages, build_schedule("1f1b", stages, 4))
    # Profiled per stage: F = 2, B = 4.
    slow = _report(130.0, {"F0": 2.6, "B0": 5.2, "F1": 2.0, "B1": 4.0})
    explain_gap(slow, _profile(), plan)
    assert slow.compute_ratio == pytest.approx(1.3)
    assert "how fast the stages computed" in slow.notes[-1]
    elsewhere = _report(130.0, {"F0": 2.0, "B0": 4.0, "F1": 2.0, "B1": 4.0})
    explain_gap(elsewhere, _profile(), plan)
    assert "outside the stages' compute" in elsewhere.notes[-1]
    # Compute 1.6x slow more than explains a 1.2x slower run (the demo's case).
    slower = _report(120.0, {"F0": 3.2, "B0": 6.4, "F1": 2.0, "B1": 4.0})
    explain_gap(slower, _profile(), plan)
    assert "how fast the stages computed" in slower.notes[-1]
    # A faster run with slower compute is not explained by compute.
    faster = _report(80.0, {"F0": 2.6, "B0": 5.2, "F1": 2.0, "B1": 4.0})
    explain_gap(faster, _profile(), plan)
    assert "outside the stages' compute" in faster.notes[-1]
    close = _report(110.0, {"F0": 2.6, "B0": 5.2})
    explain_gap(close, _profile(), plan)
    assert close.notes == [] and close.compute_ratio == pytest.approx(1.3)


def test_worker_config_travels_as_json_and_checks_its_plan() -> None:
    from planner.profile.model_check import ProfiledSplit
    from planner.records import read_record, record_dict
    from planner.runtime.settings import Training, WorkerConfig

    stages = parse_stages("0-1:a;2-3:b")
    plan = Plan(FileRef("x"), FileRef(None), 2, 4, stages, build_schedule("1f1b", stages, 4))
    split = ProfiledSplit("export", "blocks.*", ("a", "b", "c", "d"))
    training = Training("sgd", "bf16", 1, split)
    config = WorkerConfig(plan, "/m.py", place(stages, "cpu"), 3, 1, 60.0, "/tmp/r", training, 0.1)
    again = read_record(WorkerConfig, json.loads(json.dumps(record_dict(config))), file="c.json")
    assert record_dict(again) == record_dict(config) and again.training == training
    assert again.plan.schedule.devices == plan.schedule.devices and again.lr == 0.1
    broken = record_dict(config)
    broken["plan"]["schedule"]["devices"]["b"].reverse()
    with pytest.raises(InputError) as info:
        read_record(WorkerConfig, broken, file="c.json")
    assert info.value.file == "the run's plan"
    assert info.value.field is not None and info.value.field.startswith("schedule.devices.b")
    broken = record_dict(config)
    broken["training"]["split"]["layer_names"] = "abcd"
    with pytest.raises(InputError) as info:
        read_record(WorkerConfig, broken, file="c.json")
    assert (info.value.file, info.value.field) == ("c.json", "training.split.layer_names")


def _grouped_plan(recompute: tuple[int, ...] = ()) -> tuple[Plan, Profile]:
    from planner.cost import synthetic_profile, synthetic_tensor_parallel

    stages = parse_stages("0-1:a+b;2-3:c+d", recompute=list(recompute))
    plan = Plan(FileRef("x"), FileRef("y"), 1, 4, stages, build_schedule("1f1b", stages, 4))
    # Per layer and degree 2: F 0.5, B 1.0; two all-reduces of 100 B forward, two backward.
    return plan, synthetic_tensor_parallel(synthetic_profile(4), degrees=(2,))


def test_a_tensor_parallel_gap_is_not_put_on_compute_alone() -> None:
    # A TP stage's measured F and B hold its group's collectives, which the profiled shard
    # times do not; the note said "how fast the stages computed ... --calibrate folds it
    # into a profile", and run refuses --calibrate for TP plans.
    plan, profile = _grouped_plan()
    slow = _report(700.0, {"F0": 7.0, "B0": 14.0, "F1": 1.0, "B1": 2.0})
    explain_gap(slow, profile, plan)
    assert slow.compute_ratio == pytest.approx(7.0)
    note = slow.notes[-1]
    assert "tensor-parallel stages 0, 1 also hold their group's collectives" in note
    assert "--calibrate" not in note and "--trace" in note
    elsewhere = _report(700.0, {"F0": 1.0, "B0": 2.0, "F1": 1.0, "B1": 2.0})
    explain_gap(elsewhere, profile, plan)
    assert "outside the stages' compute" in elsewhere.notes[-1]


def _counted(plan: Plan, profile: Profile) -> list[CountedCollective]:
    """What every member's F and B would issue if each did what the profile lists."""
    layers = profile.measurement(1).layers
    out = []
    for device, actions in plan.schedule.devices.items():
        for a in actions:
            if a.kind.name not in ("F", "B"):
                continue
            st = plan.stages[a.stage]
            phase = "forward" if a.kind.name == "F" else "backward"
            listed = [
                c
                for t in layers[st.first : st.last + 1]
                for c in t.sharded["tp2"].collectives
                if c.phase == phase or (st.recompute and a.kind.name == "B")
            ]
            for c in listed:
                out.append(
                    CountedCollective(
                        device, a.kind.name, a.stage, a.microbatch, c.op, c.bytes, phase
                    )
                )
    return out


def test_counted_collectives_are_put_beside_the_profiles() -> None:
    from planner.runtime.collective_report import collective_summary, describe_collectives

    plan, profile = _grouped_plan(recompute=(1,))
    counted = _counted(plan, profile)
    rows = collective_summary(counted, plan, profile)
    assert [(r.stage, r.group, r.phase) for r in rows] == [
        (0, "a+b", "forward"), (0, "a+b", "backward"), (1, "c+d", "forward"), (1, "c+d", "backward")
    ]  # fmt: skip
    assert all(r.match and r.uniform for r in rows)
    assert describe_collectives(rows[0].counted) == "4 x all_reduce 100 B"
    # Stage 1 recomputes: its backward runs the forward's collectives again.
    assert describe_collectives(rows[3].listed) == "8 x all_reduce 100 B"
    # One member's microbatch missing one collective: not uniform, not the profile's.
    dropped = [
        c for c in counted if (c.device, c.stage, c.microbatch, c.phase) == ("b", 0, 2, "forward")
    ]
    rows = collective_summary([c for c in counted if c is not dropped[0]], plan, profile)
    assert not rows[0].uniform and rows[0].match is False and rows[1].match
    # Nothing counted for a stage (no collective ran) is a mismatch too, not a pass.
    rows = collective_summary([c for c in counted if c.stage == 0], plan, profile)
    assert rows[2].counted == [] and rows[2].match is False
    # Without the profile: only whether every member and microbatch issued the same.
    rows = collective_summary(counted, plan, None)
    assert rows[0].listed is None and rows[0].match is None and rows[0].uniform


def test_run_count_collectives_reaches_run_plan_and_the_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from planner.cli import main
    from planner.runtime import runner
    from planner.runtime.collective_report import collective_summary

    plan, profile = _grouped_plan()
    seen: dict[str, object] = {}

    def fake_run_plan(*args: object, **kwargs: object) -> RunReport:
        seen.update(kwargs)
        report = _report(100.0, {})
        report.collective_rows = collective_summary(_counted(plan, profile), plan, profile)
        return report

    monkeypatch.setattr(runner, "run_plan", fake_run_plan)
    for flags, counted in (([], False), (["--count-collectives"], True)):
        with pytest.raises(SystemExit) as done:
            main(["run", "plan.json", "--model", "m.py", *flags])
        assert done.value.code == 0 and seen["count_collectives"] is counted
    out = capsys.readouterr().out
    assert "collectives per microbatch" in out and "4 x all_reduce 100 B" in out and "yes" in out
    with pytest.raises(SystemExit):
        main(["run", "plan.json", "--model", "m.py", "--count-collectives", "--json"])
    rows = json.loads(capsys.readouterr().out)["collectives"]
    assert rows[0]["counted"] == [{"op": "all_reduce", "bytes": 100, "count": 4}]
    assert rows[0]["match"] is True and len(rows) == 4


def test_cpu_receives_are_posted_ahead_as_far_as_their_bytes_allow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gloo sends at once only to a posted receive: a CPU rank posts ahead within
    ``ahead_bytes`` (every receive of a small step at its start), CUDA one ahead."""
    import torch.distributed as dist

    from planner.runtime.comm import P2P, ValueSpec

    posted: list[int] = []

    class Work:
        def wait(self) -> None: ...

        def is_completed(self) -> bool:
            return True

    def irecv(buf: torch.Tensor, src: int) -> Work:
        posted.append(src)
        return Work()

    monkeypatch.setattr(dist, "irecv", irecv)
    order = {(1, 0): [("F", 1, k) for k in range(4)]}
    specs = [[ValueSpec(True, (4, 8), torch.float32)], []]  # 128 bytes a message
    for ahead, after_prefetch, after_first in ((0, 1, 2), (300, 2, 3), (1 << 20, 4, 4)):
        posted.clear()
        p2p = P2P(0, order, specs, torch.device("cpu"), ahead_bytes=ahead)
        p2p.prefetch()
        assert len(posted) == after_prefetch, ahead
        p2p.recv(("F", 1, 0), 1).wait()
        assert len(posted) == after_first, ahead
        for k in range(1, 4):
            p2p.recv(("F", 1, k), 1).wait()
        assert len(posted) == 4 and p2p.posted_bytes == 0
