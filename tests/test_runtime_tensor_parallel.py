"""`pipeplan run` of tensor-parallel, sequence-parallel and sharded plans (issue 22) on gloo.

Every run trains tiny versions of examples/gpt.py and examples/hf_llama.py
(tests/models/tiny_gpt.py, tiny_llama.py) for two steps with one process per plan device,
and must equal one process taking the same global batches: every loss and every parameter
element (gathered whole) within 1e-5 relative + 1e-6 absolute. SGD with momentum, as
tests/test_runtime.py uses: Adam divides each gradient element by its running magnitude,
which turns last-bit differences of near-zero elements (a row-split matmul sums in another
order) into visible ones; a plain two-stage pipeline of the tiny Llama differs from one
process by 4e-6 under Adam at lr 1e-2 for the same reason. The cases cover both models,
TP2 x PP2 (4 processes) and TP2 x PP2 x DP2 (6 and 8), 1F1B and interleaved (GPT's in the
collective count), sequence parallelism on and off, recompute (its forward's collectives
again), plain data parallelism, ZeRO-1 and FSDP (with the tensor-parallel mesh: FSDP2 over
the stage's ``dp`` slice), and neighbouring stages of different degrees (TP1 -> TP2 with
and without replicas, TP2 -> TP1: 3 or 4 processes; with sequence parallelism, resharded
along the sequence: TP2+SP -> TP1 for both (GPT with replicas too), Llama TP1 -> TP2+SP, a
4-head GPT TP2+SP -> TP4+SP: 3 to 6 processes). The collectives a run's forwards and
backwards issue must be the ones the plan's profile lists per layer and the simulator
times per microbatch. Runs that cannot be exact are refused with one line before any process starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_runtime import hard_timeout_after

from planner.cli import main
from planner.errors import InputError
from planner.fileio import sha256_file
from planner.plan import FileRef, Plan, Prediction, parse_stages
from planner.profile import Profile
from planner.profile.shard_measure import profile_with_shards
from planner.profile.tensor_parallel import parse_tensor_parallel
from planner.runtime import RunReport, run_plan
from planner.runtime.reference import train_single_process
from planner.schedule import build_schedule
from planner.simulate.group_comm import collective_ms, pass_collective_ms
from planner.stages import with_parallelism
from planner.topology import load_topology

MODELS = Path(__file__).parent / "models"
GPT, LLAMA = MODELS / "tiny_gpt.py", MODELS / "tiny_llama.py"
WIDE = MODELS / "tiny_gpt_wide.py"  # 4 heads: degree 4
MBS, M, STEPS = 2, 4, 2


@pytest.fixture(autouse=True)
def hard_timeout() -> Iterator[None]:
    with hard_timeout_after(300):  # 8 processes share 2 cores
        yield


def parallel_plan(
    text: str,
    schedule: str,
    *,
    sequence_parallel: bool = False,
    sharding: tuple[str, ...] = (),
    recompute: tuple[int, ...] = (),
    profile: FileRef | None = None,
    recompute_layers: bool = False,
) -> Plan:
    """A plan of ``text``'s stages ('+' joins a tensor-parallel group) with SP on every
    group and ``sharding[i]`` on stage ``i``; ``recompute`` stages checkpoint each layer
    where ``recompute_layers``."""
    stages = parse_stages(text, recompute=list(recompute))
    stages = [st.with_recompute(st.recompute, layers=recompute_layers) for st in stages]
    stages = with_parallelism(stages, sequence_parallel=sequence_parallel)
    if sharding:
        stages = [
            dataclasses.replace(st, sharding=s) for st, s in zip(stages, sharding, strict=True)
        ]
    return Plan(
        profile=profile or FileRef("<memory>", ""),
        topology=FileRef("<none>", ""),
        microbatch_size=MBS,
        num_microbatches=M,
        stages=stages,
        schedule=build_schedule(schedule, stages, M),
        predicted=Prediction(10.0, M * MBS / 10.0 * 1e3, 0.0, 10.0, {}, {}),
    )


def run_exactly(model: Path, plan: Plan, optimizer: str, **options: object):  # type: ignore[no-untyped-def]
    """Run ``plan`` and check it against one process: losses, every parameter element."""
    lr = 0.05
    report = run_plan(
        plan, model, steps=STEPS, warmup=0, timeout_s=240, optimizer=optimizer, lr=lr,
        return_params=True, **options,
    )  # fmt: skip
    ref = train_single_process(
        model, steps=STEPS, batch_size=MBS * M, optimizer=optimizer, lr=lr, microbatch_size=MBS
    )
    assert report.losses == pytest.approx(ref.losses, rel=1e-5, abs=1e-6)
    assert report.parameters is not None and set(report.parameters) == set(ref.parameters)
    torch.manual_seed(0)
    from planner.profile.loader import load_model_file

    initial = dict(load_model_file(model).build().named_parameters())
    for name, value in ref.parameters.items():
        torch.testing.assert_close(report.parameters[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(initial[n], p) for n, p in ref.parameters.items())  # it trained
    return report


GROUPS = "cpu0+cpu1", "cpu2+cpu3"


def _collectives(report: RunReport) -> list[object]:
    """The collectives a run recorded (not its messages to other stages)."""
    return [c for c in report.collectives if not c.peer]


def _sent(report: RunReport) -> dict[tuple[str, str, str, int], int]:
    """The bytes of each message a run sent to another stage's device, per (device, peer,
    kind, microbatch)."""
    return {(c.device, c.peer, c.kind, c.microbatch): c.bytes for c in report.collectives if c.peer}


def _gpt_tp2_profile(tmp_path: Path, *, sequence_parallel: bool) -> tuple[Profile, FileRef]:
    """The tiny GPT profiled (untimed) with its TP2 shards, saved under ``tmp_path``, and
    the reference a plan holds to it."""
    profile = profile_with_shards(
        GPT, [MBS], tensor_parallel=parse_tensor_parallel("2", sequence_parallel=sequence_parallel),
        repeat=1, warmup=0, min_time_s=0,
    )  # fmt: skip
    path = tmp_path / "tiny_gpt.json"
    profile.save(path)
    return profile, FileRef(str(path), sha256_file(path))


def _counted(report: RunReport) -> dict[tuple[str, int, int, str], list[tuple[str, int]]]:
    """The collectives a run recorded, per (device, stage, microbatch, phase), in order."""
    counted: dict[tuple[str, int, int, str], list[tuple[str, int]]] = {}
    for c in report.collectives:
        if c.peer:  # a message to another stage (_sent)
            continue
        counted.setdefault((c.device, c.stage, c.microbatch, c.phase), []).append((c.op, c.bytes))
    return counted


@pytest.mark.parametrize(
    ("model", "stages", "schedule", "sp", "sharding", "recompute", "optimizer", "each_layer"),
    [
        pytest.param(
            LLAMA, "0-2:{0};3-4:{1}", "1f1b", True, (), (0,), "momentum", False,
            id="llama-tp2-pp2-1f1b-sp-recompute",
        ),
        pytest.param(
            LLAMA, "0:{0};1:{1};2:{0};3-4:{1}", "interleaved", False, (), (), "momentum", False,
            id="llama-tp2-pp2-interleaved",
        ),
        pytest.param(
            GPT, "0-1:{0},cpu4+cpu5;2-3:{1},cpu6+cpu7", "1f1b", True, ("none", "zero1"), (),
            "momentum", False, id="gpt-tp2-pp2-dp2-sp-none-zero1",
        ),
        pytest.param(
            LLAMA, "0-2:{0},cpu4+cpu5;3-4:{1},cpu6+cpu7", "1f1b", False, ("fsdp", "zero1"),
            (0,), "momentum", True, id="llama-tp2-pp2-dp2-fsdp-zero1-recompute-each-layer",
        ),
    ],
)  # fmt: skip
def test_tensor_parallel_runs_equal_one_process(
    model: Path,
    stages: str,
    schedule: str,
    sp: bool,
    sharding: tuple[str, ...],
    recompute: tuple[int, ...],
    optimizer: str,
    each_layer: bool,
) -> None:
    plan = parallel_plan(
        stages.format(*GROUPS), schedule, sequence_parallel=sp, sharding=sharding,
        recompute=recompute, recompute_layers=each_layer,
    )  # fmt: skip
    report = run_exactly(model, plan, optimizer)
    assert report.world_size == len({d for st in plan.stages for d in st.devices})
    assert "TP group cpu0+cpu1" in report.placement["cpu1"]
    for st in plan.stages:
        if st.sharding != "none":
            assert f"{st.sharding} over 2 replicas" in report.placement[st.devices[-1]]


TOPOLOGY = """\
schema: pipeplan.topology/v1
name: four-cpus
devices:
  - {name: "cpu{0..3}", memory: 4 GiB, speed: 1.0, host: localhost, kind: cpu}
switches:
  - {name: loopback, kind: loopback}
links:
  - {between: ["cpu{0..3}", loopback], bandwidth: 3 GB/s, latency: 35 us, kind: gloo-tcp}
"""


def test_collectives_counted_at_run_time_are_the_profiles_and_the_simulators(
    tmp_path: Path,
) -> None:
    """GPT at TP2 x PP2, interleaved, sequence parallel, one layer per stage: each
    microbatch's forward and backward of each stage issue exactly the collectives the
    profile lists for that layer (operation, bytes, phase, in order), on every member, and
    the simulator's per-microbatch collective time of the stage is those collectives'
    time on the group's ring; the run is exact too."""
    profile, ref = _gpt_tp2_profile(tmp_path, sequence_parallel=True)
    plan = parallel_plan("0:{0};1:{1};2:{0};3:{1}".format(*GROUPS), "interleaved", profile=ref)
    plan = dataclasses.replace(plan, stages=with_parallelism(plan.stages, sequence_parallel=True))
    plan = dataclasses.replace(plan, schedule=build_schedule("interleaved", plan.stages, M))
    report = run_exactly(GPT, plan, "momentum", count_collectives=True)
    topology = tmp_path / "four.yaml"
    topology.write_text(TOPOLOGY)
    topo = load_topology(topology)
    counted = _counted(report)
    timings = profile.measurement(MBS).layers
    for st in plan.stages:  # stage s is layer s
        listed = timings[st.first].sharded["tp2-sp"].collectives
        group = st.replica_groups[0]
        for phase in ("forward", "backward"):
            want = [(c.op, c.bytes) for c in listed if c.phase == phase]
            for dev in group:
                for k in range(M):
                    assert counted.get((dev, st.id, k, phase), []) == want, (dev, st.id, k)
        forward_ms, backward_ms = pass_collective_ms(profile, topo, st, group, MBS)
        run_ms = {
            phase: sum(collective_ms(topo, group, c) for c in listed if c.phase == phase)
            for phase in ("forward", "backward")
        }
        assert forward_ms == pytest.approx(run_ms["forward"]) and forward_ms + backward_ms > 0
        assert backward_ms == pytest.approx(run_ms["backward"])
    assert sum(len(v) for v in counted.values()) == len(_collectives(report)) > 0


def _refused(plan: Plan | Path, match: str, model: Path = GPT, **options: object) -> InputError:
    with pytest.raises(InputError, match=match) as info:
        run_plan(plan, model, steps=1, warmup=0, timeout_s=30, **options)  # type: ignore[arg-type]
    assert "\n" not in info.value.one_line()
    return info.value


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal must come before any process starts."""
    from planner.runtime import runner

    monkeypatch.setattr(runner, "launch_local", lambda *a, **k: pytest.fail("launched"))


@pytest.mark.usefixtures("no_launch")
def test_what_cannot_run_exactly_is_refused_before_any_process_starts() -> None:
    tp = "0-1:cpu0+cpu1;2-3:cpu2+cpu3"
    _refused(parallel_plan(tp, "1f1b"), "shared mode", device_map="cpu0=0,cpu1=1,cpu2=0,cpu3=1")
    _refused(parallel_plan(tp, "2bw"), "under 2bw")
    _refused(parallel_plan(tp, "1f1b"), "fp16", precision="fp16")
    sharded = "0-1:cpu0,cpu1;2-3:cpu2,cpu3"
    _refused(parallel_plan(sharded, "zb", sharding=("fsdp", "fsdp")), "zero bubble")


@pytest.mark.usefixtures("no_launch")
def test_a_tied_parameter_the_profile_lists_is_refused_before_launch(tmp_path: Path) -> None:
    from planner.profile import profile_model

    profile = profile_model(MODELS / "tied.py", [MBS], repeat=1, warmup=0, min_time_s=0)
    profile_path = tmp_path / "tied.json"
    profile.save(profile_path)
    ref = FileRef(str(profile_path), sha256_file(profile_path))
    plan = parallel_plan("0-2:cpu0;3-5:cpu1,cpu2", "1f1b", sharding=("none", "fsdp"), profile=ref)
    path = tmp_path / "plan.json"
    plan.save(path)
    error = _refused(path, "holds the tied parameter 'embed.weight'", model=MODELS / "tied.py")
    assert error.file == str(path) and error.field == "stages[1]"


def test_a_sharded_stage_holding_a_tied_parameter_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Without the plan's profile the launcher cannot know the ties: the rank that finds
    one in the model refuses, and the run exits 2 with one line naming the plan file."""
    plan = parallel_plan("0-2:cpu0,cpu1;3-5:cpu2", "1f1b", sharding=("zero1", "none"))
    path = tmp_path / "plan.json"
    plan.save(path)
    with pytest.raises(SystemExit) as info:
        main(["run", str(path), "--model", str(MODELS / "tied.py"), "--steps", "1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "tied parameter" in err and f"{path}: stages[0]" in err


def test_a_tensor_parallel_stage_is_compared_with_its_shards_times() -> None:
    """stage compute / profiled: a TP stage's measured forward and backward against its
    shards' profiled times (tp2, or tp2-sp), a plain stage's against its whole layers."""
    from planner.cost import synthetic_profile, synthetic_tensor_parallel
    from planner.runtime.calibrate import stage_ratios

    profile = synthetic_tensor_parallel(synthetic_profile(4, microbatch_size=MBS), (2,))
    measured = {"F0": 2.0, "B0": 4.0, "F1": 2.0, "B1": 4.0}  # a stage: two layers, 1 + 2 ms
    for sp in (False, True):
        plan = parallel_plan("0-1:cpu0+cpu1;2-3:cpu2+cpu3", "1f1b", sequence_parallel=sp)
        assert stage_ratios(profile, plan, measured) == {0: (2.0, 2.0), 1: (2.0, 2.0)}
    plain = parallel_plan("0-1:cpu0;2-3:cpu1", "1f1b")
    assert stage_ratios(profile, plain, measured) == {0: (1.0, 1.0), 1: (1.0, 1.0)}


def test_calibrating_from_a_tensor_parallel_run_is_refused_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_launch: None
) -> None:
    from planner.cost import synthetic_profile, synthetic_tensor_parallel

    profile = synthetic_tensor_parallel(synthetic_profile(4, microbatch_size=MBS), (2,))
    profile_path = tmp_path / "p.json"
    profile.save(profile_path)
    ref = FileRef(str(profile_path), sha256_file(profile_path))
    plan = parallel_plan("0-1:cpu0+cpu1;2-3:cpu2+cpu3", "1f1b", profile=ref)
    path = tmp_path / "plan.json"
    plan.save(path)
    out = tmp_path / "calibrated.json"
    with pytest.raises(SystemExit) as info:
        main(["run", str(path), "--model", str(GPT), "--calibrate", str(out)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{path}: --calibrate" in err and "stage 0 is tensor parallel" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("model", "stages"),
    [
        pytest.param(GPT, "0-1:cpu0,cpu1;2-3:cpu2+cpu3", id="gpt-dp2-tp1-to-tp2"),
        pytest.param(LLAMA, "0-2:cpu0;3-4:cpu1+cpu2", id="llama-tp1-to-tp2"),
    ],
)
def test_stages_of_different_degrees_run_equal_one_process(model: Path, stages: str) -> None:
    """Replicated values cross a boundary between degrees: each receiver takes them from
    one sender (member ``j mod t``), one sender may serve several receivers."""
    plan = parallel_plan(stages, "1f1b")
    assert len({st.tensor_parallel for st in plan.stages}) == 2
    report = run_exactly(model, plan, "momentum")
    assert report.world_size == len({d for st in plan.stages for d in st.devices})


@pytest.mark.parametrize(
    ("model", "stages"),
    [
        # GPT TP2+SP -> TP1 alone: that run is the one the pieces test below checks exact.
        pytest.param(GPT, "0-1:cpu0+cpu1,cpu2+cpu3;2-3:cpu4,cpu5", id="gpt-tp2sp-dp2-to-tp1-dp2"),
        pytest.param(LLAMA, "0-2:cpu0;3-4:cpu1+cpu2", id="llama-tp1-to-tp2sp"),
        # The cut after layers.0 carries the mask, positions and rotary tables whole beside
        # the split hidden states: from the first member only.
        pytest.param(LLAMA, "0-1:cpu0+cpu1;2-4:cpu2", id="llama-tp2sp-to-tp1"),
        pytest.param(WIDE, "0-1:cpu0+cpu1;2-3:cpu2+cpu3+cpu4+cpu5", id="gpt-tp2sp-to-tp4sp"),
    ],
)
def test_sequence_parallel_stages_of_different_degrees_run_equal_one_process(
    model: Path, stages: str
) -> None:
    """Sequence parallelism next to another degree: each member receives the sequence
    range it needs from the members holding it (the values split along the sequence
    joined, the others whole from one), and the gradients go back the same way."""
    plan = parallel_plan(stages, "1f1b", sequence_parallel=True)
    assert any(st.sequence_parallel for st in plan.stages)
    report = run_exactly(model, plan, "momentum")
    assert report.world_size == len({d for st in plan.stages for d in st.devices})


def test_a_tp2_stage_before_a_plain_one_counts_the_simulators_collectives(
    tmp_path: Path,
) -> None:
    """GPT at TP2 -> TP1, 1F1B (3 processes): exact, and each microbatch's forward and
    backward on each member of the TP2 stage issue the collectives its layers' profile
    lists, which the simulator times; the plain stage issues none."""
    profile, ref = _gpt_tp2_profile(tmp_path, sequence_parallel=False)
    plan = parallel_plan("0-1:cpu0+cpu1;2-3:cpu2", "1f1b", profile=ref)
    report = run_exactly(GPT, plan, "momentum", count_collectives=True)
    topology = tmp_path / "four.yaml"
    topology.write_text(TOPOLOGY)
    topo = load_topology(topology)
    counted = _counted(report)
    first = plan.stages[0]
    timings = profile.measurement(MBS).layers
    listed = [c for layer in (0, 1) for c in timings[layer].sharded["tp2"].collectives]
    group = first.replica_groups[0]
    for phase in ("forward", "backward"):
        want = [(c.op, c.bytes) for c in listed if c.phase == phase]
        for dev in group:
            for k in range(M):
                assert counted.get((dev, 0, k, phase), []) == want, (dev, k, phase)
    assert not any(dev == "cpu2" for dev, *_ in counted)
    sim_ms = pass_collective_ms(profile, topo, first, group, MBS)
    run_ms = [
        sum(collective_ms(topo, group, c) for c in listed if c.phase == phase)
        for phase in ("forward", "backward")
    ]
    assert sim_ms == pytest.approx(tuple(run_ms)) and sum(run_ms) > 0
    assert sum(len(v) for v in counted.values()) == len(_collectives(report))


def test_a_tp2_sp_stage_before_a_plain_one_counts_the_simulators_collectives_and_pieces(
    tmp_path: Path,
) -> None:
    """GPT at TP2+SP -> TP1, 1F1B (3 processes): exact; each member of the TP2 stage issues
    the collectives its layers' tp2-sp profile lists, which the simulator times; and every
    message crossing the cut is one of the simulator's pieces with its bytes (each member
    sends its half of the sequence, the first also the positions; the plain stage sends
    each member its half's gradient)."""
    from planner.simulate.reshard import piece_bytes, split_parts

    profile, ref = _gpt_tp2_profile(tmp_path, sequence_parallel=True)
    plan = parallel_plan("0-1:cpu0+cpu1;2-3:cpu2", "1f1b", sequence_parallel=True, profile=ref)
    report = run_exactly(GPT, plan, "momentum", count_collectives=True)
    assert report.world_size == 3
    counted = _counted(report)
    first, second = plan.stages
    timings = profile.measurement(MBS).layers
    listed = [c for layer in (0, 1) for c in timings[layer].sharded["tp2-sp"].collectives]
    for phase in ("forward", "backward"):  # the backward runs the layers in reverse
        want = sorted((c.op, c.bytes) for c in listed if c.phase == phase)
        for dev in first.devices:
            for k in range(M):
                assert sorted(counted.get((dev, 0, k, phase), [])) == want, (dev, k, phase)
    assert not any(dev == "cpu2" for dev, *_ in counted)
    parts = split_parts(profile, first, second, MBS)
    forward = piece_bytes(first.devices, second.devices, (True, False), parts)
    # The gradients: of the split hidden states alone (the whole value beside them, the
    # positions, is an integer tensor), where the simulator charges the cut's bytes both
    # ways (as for every boundary, planner.cost.boundary_bytes).
    backward = piece_bytes(second.devices, first.devices, (False, True), (parts[0], 0))
    assert parts[1] > 0 and piece_bytes(second.devices, first.devices, (False, True), parts)
    want_sent = {
        **{(a, b, "SEND_F", k): n for a, b, n in forward for k in range(M)},
        **{(a, b, "SEND_B", k): n for a, b, n in backward for k in range(M)},
    }
    assert _sent(report) == want_sent
    assert sum(n for *_, n in forward) == profile.cut_bytes(MBS, 1) > 0


def test_resharded_pieces_join_to_the_whole_and_an_odd_sequence_is_refused() -> None:
    """Without launching: TP2+SP -> TP4+SP pieces of a [b, 8, h] hidden state (split) and
    a [1, 8] position tensor (whole) join to each receiver's quarter and the whole
    positions; the messages' shapes are learned per peer rank; a sequence of 6 does not
    divide into quarters: one line naming both stages and the length."""
    from planner.runtime.placement import Placement
    from planner.runtime.reshard import Reshard

    stages = with_parallelism(parse_stages("0:a+b;1:c+d+e+f"), sequence_parallel=True)
    devices = [d for st in stages for d in st.devices]
    placement = Placement(devices, {d: i for i, d in enumerate(devices)}, len(devices), "cpu")
    whole = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(2, 8, 3)
    positions = torch.arange(8).reshape(1, 8)
    handed = [(whole[:, :4], positions, None), (whole[:, 4:], positions, None)]
    reshard = Reshard(stages, placement, rank=2)  # device c
    reshard.learn(1, handed, (True, False, False))
    assert reshard.received(1, handed, 0)[0].equal(whole[:, :2])
    assert reshard.received(1, handed, 3)[0].equal(whole[:, 6:])
    assert reshard.received(1, handed, 3)[1].equal(positions)
    assert [s.shape for s in reshard.specs[("F", 1, 0)]] == [(2, 2, 3), (1, 8)]
    assert [s.shape for s in reshard.specs[("B", 0, 0)]] == [(2, 2, 3)]
    assert ("F", 1, 1) not in reshard.specs  # b serves e and f
    odd = [(whole[:, :3], positions), (whole[:, 3:6], positions)]
    with pytest.raises(InputError, match="sequence length 6 does not divide") as info:
        Reshard(stages, placement, rank=2).learn(1, odd, (True, False))
    assert "stage 0 (" in str(info.value) and "stage 1 (" in str(info.value)
    assert "\n" not in info.value.one_line()
