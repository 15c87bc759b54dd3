"""Tied parameters (one weight used by layers of several stages, as GPT-2's lm_head/wte).

Without the exchange each stage trains its own copy: on tests/models/tied.py, 1f1b over
two processes, the head's copy of ``embed.weight`` gets only the head's gradient and the
embedding's copy only the embedding's, so after one step they already differ from
single-process training (which applies the sum to the one weight). These tests run the
real runtime and compare every parameter, the tied ones under their canonical names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from families import SYNCHRONOUS, partition
from test_runtime import check_same, hard_timeout, make_plan, reference  # noqa: F401

from planner.cost import (
    stage_memory_bytes,
    stage_param_bytes,
    stage_static_bytes,
    stage_tied_parameters,
    synthetic_profile,
)
from planner.errors import InputError
from planner.plan import parse_stages
from planner.profile import TiedParameter, find_tied_parameters, load_profile, profile_from_dict
from planner.profile.loader import load_model_file
from planner.profile.measure import profile_model
from planner.profile.split import split_model
from planner.runtime import run_plan
from planner.runtime.tied import own_copies
from planner.schedule import build_schedule, family
from planner.schedule.actions import Action, ActionType
from planner.schedule.tied import defer_tied_steps
from planner.simulate import simulate, tied_exchange_ms
from planner.topology import uniform_topology

HERE = Path(__file__).parent
TIED = HERE / "models" / "tied.py"  # layers: 0 embed, 1-4 blocks.0..3, 5 head
EMBED = TiedParameter("embed.weight", (0, 5), param_count=88, param_bytes=352)
SHARED = TiedParameter("blocks.0.fc.weight", (1, 3), param_count=64, param_bytes=256)


def _split() -> Any:
    user = load_model_file(TIED)
    torch.manual_seed(0)
    return split_model(user.build(), num_inputs=1)


# -- finding and recording ties -------------------------------------------------------


def test_find_tied_parameters_by_identity() -> None:
    split = _split()
    assert split.names == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    assert find_tied_parameters(split) == [EMBED, SHARED]
    # Each tied parameter is still counted once, in its first layer.
    counts = [sum(p.numel() for p in ps) for ps in split.layer_parameters()]
    assert counts == [88, 72, 72, 8, 72, 0]
    untied = split_model(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)), 1)
    assert find_tied_parameters(untied) == []


def test_profile_records_ties_and_round_trips(tmp_path: Path) -> None:
    profile = profile_model(TIED, [2], repeat=1, warmup=0, min_time_s=0)
    assert profile.tied_parameters == [EMBED, SHARED]
    path = tmp_path / "p.json"
    profile.save(path)
    data = json.loads(path.read_text())
    assert data["tied_parameters"][0] == {
        "name": "embed.weight",
        "layers": [0, 5],
        "param_count": 88,
        "param_bytes": 352,
    }
    assert load_profile(path).tied_parameters == [EMBED, SHARED]


def _profile_dict(**tied: Any) -> dict[str, Any]:
    data = synthetic_profile(4).to_dict()
    data.update(tied)
    return data


def test_schema_absent_means_none_and_param_count_is_optional() -> None:
    assert profile_from_dict(_profile_dict()).tied_parameters == []
    assert "tied_parameters" not in synthetic_profile(4).to_dict()
    data = _profile_dict(tied_parameters=[{"name": "w", "layers": [3, 0], "param_bytes": 40}])
    (tie,) = profile_from_dict(data).tied_parameters
    assert tie == TiedParameter("w", (0, 3), param_count=10, param_bytes=40)  # float32


@pytest.mark.parametrize(
    ("tied", "field", "expected"),
    [
        ({"name": "w", "layers": [0], "param_bytes": 4}, "tied_parameters[0].layers", "2 or more"),
        (
            {"name": "w", "layers": [1, 1], "param_bytes": 4},
            "tied_parameters[0].layers",
            "distinct",
        ),
        ({"name": "w", "layers": [0, 4], "param_bytes": 4}, "tied_parameters[0].layers", "0..3"),
        ({"name": "w", "layers": [0, True], "param_bytes": 4}, "tied_parameters[0].layers", "0..3"),
        ({"name": "w", "layers": [0, 1]}, "tied_parameters[0].param_bytes", "missing"),
        (
            {"name": "w", "layers": [0, 1], "param_bytes": -1},
            "tied_parameters[0].param_bytes",
            "-1",
        ),
        ({"name": "", "layers": [0, 1], "param_bytes": 4}, "tied_parameters[0].name", "name"),
        ({"layers": [0, 1], "param_bytes": 4}, "tied_parameters[0].name", "missing"),
    ],
)
def test_schema_rejects_bad_ties(tied: dict[str, Any], field: str, expected: str) -> None:
    with pytest.raises(InputError, match=expected) as info:
        profile_from_dict(_profile_dict(tied_parameters=[tied]), source="p.json")
    assert info.value.field == field and info.value.file == "p.json"
    assert "\n" not in info.value.one_line()


def test_schema_rejects_a_non_list_and_repeated_names() -> None:
    with pytest.raises(InputError) as info:
        profile_from_dict(_profile_dict(tied_parameters={"name": "w"}))
    assert info.value.field == "tied_parameters"
    twice = [{"name": "w", "layers": [0, 1], "param_bytes": 4}] * 2
    with pytest.raises(InputError, match="listed twice"):
        profile_from_dict(_profile_dict(tied_parameters=twice))


# -- the cost model and the simulator -------------------------------------------------

TIE_BYTES = 400


def _tied_profile(optimizer: str = "adam") -> Any:
    """Six identical layers (param 1000 B, Adam state 2000 B); layers 0 and 5 share 400 B."""
    profile = synthetic_profile(6, optimizer_ms=0.5)
    profile.optimizer = optimizer
    profile.tied_parameters = [TiedParameter("w", (0, 5), TIE_BYTES // 4, TIE_BYTES)]
    return profile


def test_cost_counts_a_tie_on_every_holder_stage() -> None:
    tied, plain = _tied_profile(), synthetic_profile(6, optimizer_ms=0.5)
    # The first layer's own param_bytes already counts it: nothing more there.
    assert stage_static_bytes(tied, 0, 2) == stage_static_bytes(plain, 0, 2)
    assert stage_param_bytes(tied, 0, 2) == stage_param_bytes(plain, 0, 2)
    assert stage_static_bytes(tied, 1, 4) == stage_static_bytes(plain, 1, 4)  # not held
    # The holder of layer 5 pays weights + gradient + Adam's two moments of a copy.
    assert stage_static_bytes(tied, 3, 5) == stage_static_bytes(plain, 3, 5) + 4 * TIE_BYTES
    assert stage_param_bytes(tied, 3, 5) == stage_param_bytes(plain, 3, 5) + TIE_BYTES
    # One stage with both uses holds one copy.
    assert stage_static_bytes(tied, 0, 5) == stage_static_bytes(plain, 0, 5)
    # 2bw keeps a second version of the copy too.
    grow = stage_memory_bytes(tied, 3, 5, 1, 2, weight_versions=2)
    assert grow == stage_memory_bytes(plain, 3, 5, 1, 2, weight_versions=2) + 5 * TIE_BYTES
    sgd = _tied_profile("sgd")
    assert stage_static_bytes(sgd, 3, 5) == stage_static_bytes(plain, 3, 5) + 2 * TIE_BYTES
    assert [t.name for t in stage_tied_parameters(tied, 4, 5)] == ["w"]
    assert stage_tied_parameters(tied, 1, 4) == []


def test_cost_refuses_an_unknown_optimizer_for_a_copy() -> None:
    with pytest.raises(InputError, match="tied parameters"):
        stage_static_bytes(_tied_profile("lamb"), 3, 5)


def test_simulator_memory_and_step_of_holder_stages() -> None:
    topo = uniform_topology(3, bandwidth=1e6, latency_ms=0.2)  # slow: the exchange shows
    exchange = topo.allreduce_ms(["gpu0", "gpu1"], TIE_BYTES)
    assert exchange > 0.1
    stages = "0-2:gpu0;3-5:gpu1"
    tied = simulate(_tied_profile(), topo, stages, "1f1b", 4)
    plain = simulate(synthetic_profile(6, optimizer_ms=0.5), topo, stages, "1f1b", 4)
    assert tied.memory_bytes["gpu0"] == plain.memory_bytes["gpu0"]
    assert tied.memory_bytes["gpu1"] == plain.memory_bytes["gpu1"] + 4 * TIE_BYTES
    assert tied.step_ms == pytest.approx([0.5 * 3 + exchange, 0.5 * 3 + exchange])
    assert plain.step_ms == pytest.approx([1.5, 1.5])
    # Both devices end on their STEP, each longer by the exchange.
    assert tied.iteration_ms == pytest.approx(plain.iteration_ms + exchange)
    steps = {(e.device, e.stage): e.end_ms - e.start_ms for e in tied.events if e.kind == "STEP"}
    assert steps == pytest.approx({("gpu0", 0): 1.5 + exchange, ("gpu1", 1): 1.5 + exchange})


def test_simulator_replicated_holder_and_free_cases() -> None:
    topo = uniform_topology(3, bandwidth=1e6, latency_ms=0.2)
    profile = _tied_profile()
    stages = "0-2:gpu0,gpu1;3-5:gpu2"
    result = simulate(profile, topo, stages, "1f1b", 4)
    # The tie is exchanged among all three devices; the replicas' ALLREDUCE leaves it out.
    everyone = topo.allreduce_ms(["gpu0", "gpu1", "gpu2"], TIE_BYTES)
    replicas = topo.allreduce_ms(["gpu0", "gpu1"], 3 * 1000 - TIE_BYTES)
    durations = {(e.kind, e.device): e.end_ms - e.start_ms for e in result.events}
    assert durations[("ALLREDUCE", "gpu0")] == pytest.approx(replicas)
    assert durations[("STEP", "gpu1")] == pytest.approx(1.5 + everyone)
    assert durations[("STEP", "gpu2")] == pytest.approx(1.5 + everyone)
    specs = parse_stages(stages)
    sched = build_schedule("1f1b", specs, 4)
    assert tied_exchange_ms(profile, topo, specs, sched) == pytest.approx(
        {(0, "gpu0"): everyone, (0, "gpu1"): everyone, (1, "gpu2"): everyone}
    )
    # One device holding every copy, or free communication: no exchange cost.
    one = simulate(profile, topo, "0-2:gpu0;3-5:gpu0", "interleaved", 4)
    assert one.step_ms == pytest.approx([1.5, 1.5])
    free = simulate(profile, None, "0-2:gpu0;3-5:gpu1", "1f1b", 4)
    assert free.step_ms == pytest.approx([1.5, 1.5])
    assert tied_exchange_ms(profile, None, specs, sched) == {}


# -- the runtime ----------------------------------------------------------------------


def test_own_copies_copies_only_what_an_earlier_stage_holds() -> None:
    split = _split()
    claimed: set[int] = set()
    first = own_copies(split.stage(0, 2), claimed)
    assert first.layers[0] is split.layers[0]  # nothing held before: unchanged
    last = own_copies(split.stage(3, 5), claimed)
    model = dict(split.model.named_parameters())
    mine = dict(last.named_parameters())
    for name, original in [
        ("layers.2.head.weight", "embed.weight"),
        ("layers.0.blocks.2.fc.weight", "blocks.0.fc.weight"),
    ]:  # held by the first stage: a copy, equal but not the same object
        assert mine[name] is not model[original] and torch.equal(mine[name], model[original])
    for name in ("layers.0.blocks.2.fc.bias", "layers.1.blocks.3.fc.weight"):
        assert mine[name] is model[name.split(".", 2)[2]]  # no earlier holder: the model's own


def _texts(devices: dict[str, list[Action]]) -> dict[str, str]:
    """Compute actions and STEPs only."""
    keep = (ActionType.B, ActionType.I, ActionType.W, ActionType.OPTIMIZER_STEP)
    return {d: " ".join(str(a) for a in acts if a.kind in keep) for d, acts in devices.items()}


def test_steps_of_holder_stages_wait_for_the_devices_backward_work() -> None:
    # Interleaved 1F1B steps stage 2 on cpu0 before stage 0's last backwards: STEP2 moves
    # after B0.3 (stages 0 and 2 share a weight: the exchange needs both gradients).
    stages = parse_stages("0-1:cpu0;2:cpu1;3:cpu0;4-5:cpu1")
    sched = build_schedule("interleaved", stages, 4)
    assert "STEP2 B0.2 B0.3 STEP0" in _texts(sched.devices)["cpu0"]
    moved = _texts(defer_tied_steps(sched.devices, frozenset({0, 2, 3}), 4))
    assert moved["cpu0"].endswith("B2.3 B0.2 B0.3 STEP2 STEP0")
    # STEP3 waits for stage 1's backwards too: cpu0's B0.2 needs them, and cpu0 may
    # already wait in the exchange (which cpu1 would enter at STEP3).
    assert moved["cpu1"].endswith("B3.3 B1.2 B1.3 STEP3 STEP1")
    assert defer_tied_steps(sched.devices, frozenset(), 4) == sched.devices
    gpipe = build_schedule("gpipe", stages[:2], 4).devices
    assert defer_tied_steps(gpipe, frozenset({0, 1}), 4) == gpipe
    # Each iteration of a stream separately: nothing moves across iterations.
    two = parse_stages("0-2:cpu0;3-5:cpu1")
    stream = build_schedule("2bw", two, 2, iterations=3).devices
    assert defer_tied_steps(stream, frozenset({0, 1}), 2) == stream
    # A move past the stage's own compute would change the result: refused.
    bad = {"cpu0": [Action.parse(t) for t in ("B0.0", "STEP2", "F2.1", "B2.1", "B0.1")]}
    with pytest.raises(InputError, match="works on stage 2"):
        defer_tied_steps(bad, frozenset({0, 2}), 2)


def test_simulator_times_the_deferred_steps() -> None:
    profile = synthetic_profile(6, optimizer_ms=0.5)
    profile.tied_parameters = [TiedParameter("w", (1, 3), 250, 1000)]  # stages 0 and 2
    result = simulate(profile, None, "0-1:gpu0;2:gpu1;3:gpu0;4-5:gpu1", "interleaved", 4)
    ends = {(e.kind, e.stage, e.microbatch): e.end_ms for e in result.events}
    steps = {e.stage: e.start_ms for e in result.events if e.kind == "STEP"}
    assert steps[2] >= ends[("B", 0, 3)]
    stages = "0-1:gpu0;2:gpu1;3:gpu0;4-5:gpu1"
    plain = simulate(synthetic_profile(6, optimizer_ms=0.5), None, stages, "interleaved", 4)
    early = {e.stage: e.start_ms for e in plain.events if e.kind == "STEP"}
    assert early[2] < ends[("B", 0, 3)]


def _tied_run(schedule: str) -> tuple[str, str, int, dict[str, Any]]:
    # Two chunks per device (interleaved, loop-placed): cpu0 holds stages 0 and 2, which
    # share blocks.0.fc.weight; the embedding is shared between stage 0 and stage 3 on
    # the other device. One stage per device: the embedding crosses the cut.
    # An odd number of microbatches where the family allows it (chunks need a multiple of
    # the devices).
    chunked = family(schedule).interleaved
    ranges = ["0-1", "2", "3", "4-5"] if chunked else ["0-2", "3-5"]
    return (schedule, partition(schedule, ranges, ["cpu0", "cpu1"]), 4 if chunked else 3, {})


# Every synchronous family, then a replicated holder stage and shared mode under 1F1B.
RUNS = [
    *(_tied_run(name) for name in SYNCHRONOUS),
    ("1f1b", "0-2:cpu0,cpu1;3-5:cpu2", 4, {}),  # a replicated holder stage
    # shared mode: cpu0 and cpu1 (both hold blocks.0.fc.weight) are one process.
    ("1f1b", "0-1:cpu0;2-3:cpu1;4-5:cpu2", 3, {"device_map": "cpu0=0,cpu1=0,cpu2=1"}),
]


@pytest.mark.parametrize(
    ("schedule", "stages", "m", "extra"),
    RUNS,
    ids=[*SYNCHRONOUS, "replicated", "shared"],
)
def test_tied_training_equals_one_process(
    schedule: str, stages: str, m: int, extra: dict[str, Any]
) -> None:
    plan = make_plan(stages, schedule, m, 2)
    report = run_plan(
        plan, TIED, steps=2, warmup=1, timeout_s=60, optimizer="momentum", lr=0.1,
        return_params=True, **extra,
    )  # fmt: skip
    losses, params = reference(TIED, 3, 2 * m, "momentum", 0.1)
    assert {"embed.weight", "blocks.0.fc.weight"} <= set(params)
    assert "head.weight" not in params and "blocks.2.fc.weight" not in params
    check_same(report, losses, params)


def test_tied_2bw_stream_follows_its_update_rule() -> None:
    plan = make_plan("0-2:cpu0;3-5:cpu1", "2bw", 4, 2)
    report = run_plan(
        plan, TIED, steps=3, warmup=0, timeout_s=60, optimizer="sgd", lr=0.1, return_params=True
    )
    losses, params = reference(TIED, 3, 8, "sgd", 0.1, two_bw=True)
    check_same(report, losses, params)
