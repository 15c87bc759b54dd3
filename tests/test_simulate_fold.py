"""Identical data-parallel replicas simulated once (planner.simulate.fold): the folded run
gives every number the full run gives, bit for bit, and is used only where the replicas
are identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planner.cost import synthetic_profile, synthetic_tensor_parallel
from planner.profile import Profile, load_profile
from planner.shape import PlanShape
from planner.simulate import simulate_shape, timing
from planner.stages import StageSpec
from planner.topology import Topology, load_topology, topology_from_dict
from planner.topology.cluster import cluster_dict

ROOT = Path(__file__).resolve().parents[1]
FIELDS = (
    "iteration_ms",
    "makespan_ms",
    "memory_bytes",
    "busy_ms",
    "bubble_fraction",
    "lower_bound_ms",
    "static_bytes",
    "step_ms",
    "memory_limit_bytes",
    "groups",
    "device_names",
)


def _cluster(nodes: int) -> Topology:
    return topology_from_dict(cluster_dict("dgx-h100", nodes, network="fat-tree"), "<dgx>")


def _tp_profile() -> Any:
    base = synthetic_profile(
        8, output_bytes=2**22, param_bytes=2**22, saved_bytes=2**20, optimizer_state_bytes=2**23
    )
    return synthetic_tensor_parallel(base, (2, 4))


def _shape(
    groups: list[list[str]],
    schedule: str,
    m: int,
    *,
    tp: int = 1,
    sharding: str = "none",
    virtual: int = 1,
    layers: int = 8,
    mb: int = 1,
) -> PlanShape:
    """``len(groups) * virtual`` stages of equal layers, chunk ``c`` on ``groups[c % p]``."""
    chunks = len(groups) * virtual
    per = layers // chunks
    stages = tuple(
        StageSpec(
            c,
            (c * per, layers - 1 if c == chunks - 1 else (c + 1) * per - 1),
            tuple(groups[c % len(groups)]),
            tensor_parallel=tp,
            sharding=sharding,
        )
        for c in range(chunks)
    )
    return PlanShape(stages, schedule, mb, m, virtual)


def _both(profile: Any, topo: Topology | None, shape: PlanShape) -> tuple[Any, Any, bool]:
    """The folded run (if it applies), the full one, and whether it folded."""
    used = []
    fold = timing._run_folded

    def spy(*args: Any) -> Any:
        got = fold(*args)
        used.append(got is not None)
        return got

    timing._run_folded = spy  # type: ignore[assignment]
    try:
        once = simulate_shape(profile, topo, shape)
        timing._run_folded = lambda *args: None
        full = simulate_shape(profile, topo, shape)
    finally:
        timing._run_folded = fold
    return once, full, any(used)


def _same(a: Any, b: Any) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x == y, name
        if isinstance(x, dict):
            assert list(x) == list(y), name


def _names(n: int) -> list[str]:
    return [f"gpu{i}" for i in range(n)]


@pytest.mark.parametrize(
    ("schedule", "virtual"), [("1f1b", 1), ("gpipe", 1), ("zb", 1), ("2bw", 1), ("interleaved", 2)]
)
def test_replicated_pipelines_fold_to_the_same_numbers(schedule: str, virtual: int) -> None:
    profile = load_profile(ROOT / "profiles" / "gpt.json")
    topo = _cluster(2)
    names = _names(16)
    for depth, r in ((2, 8), (4, 4), (8, 2)):
        # Pipe-major (replicas together) and replica-major (stages together).
        for groups in (
            [names[k * r : (k + 1) * r] for k in range(depth)],
            [names[k::depth] for k in range(depth)],
        ):
            layers = profile.num_layers
            if depth * virtual > layers:
                continue
            shape = _shape(groups, schedule, 4 * r, virtual=virtual, layers=layers)
            once, full, folded = _both(profile, topo, shape)
            assert folded
            _same(once, full)


@pytest.mark.parametrize("sharding", ["none", "zero1", "fsdp"])
def test_tensor_parallel_groups_fold_with_sharding(sharding: str) -> None:
    profile = _tp_profile()
    topo = _cluster(2)
    names = _names(16)
    for tp in (2, 4):
        r = 16 // (2 * tp)
        groups = [names[k * r * tp : (k + 1) * r * tp] for k in range(2)]
        shape = _shape(groups, "1f1b", 2 * r, tp=tp, sharding=sharding)
        once, full, folded = _both(profile, topo, shape)
        assert folded
        _same(once, full)


def test_free_communication_folds() -> None:
    profile = load_profile(ROOT / "profiles" / "mlp.json")
    names = _names(4)
    shape = _shape([names[:2], names[2:]], "1f1b", 8, layers=profile.num_layers, mb=8)
    once, full, folded = _both(profile, None, shape)
    assert folded
    _same(once, full)


@pytest.mark.parametrize("topology", ["hetero.yaml", "nvlink-pairs.yaml", "two-node-ib.yaml"])
def test_unlike_replicas_are_simulated_in_full(topology: str) -> None:
    """Devices of other speeds or shared links: the full run, or the same numbers."""
    profile = load_profile(ROOT / "profiles" / "mlp.json")
    topo = load_topology(ROOT / "topologies" / topology)
    names = topo.device_names()
    half = len(names) // 2
    for groups in ([names[:half], names[half:]], [names[0::2], names[1::2]]):
        shape = _shape(groups, "1f1b", 4 * half, layers=profile.num_layers, mb=8)
        once, full, _ = _both(profile, topo, shape)
        _same(once, full)


def test_unequal_replicas_do_not_fold() -> None:
    profile = load_profile(ROOT / "profiles" / "mlp.json")
    names = _names(6)
    layers = profile.num_layers
    stages = (
        StageSpec(0, (0, layers // 2 - 1), tuple(names[:4])),
        StageSpec(1, (layers // 2, layers - 1), tuple(names[4:])),
    )
    shape = PlanShape(stages, "1f1b", 8, 8, 1)
    once, full, folded = _both(profile, _cluster(1), shape)
    assert not folded
    _same(once, full)


def _assert_over_limit_peaks_are_full(profile: Profile, shape: PlanShape) -> None:
    """On two 8-GPU nodes with memory one byte short of the smallest peak, the peaks the
    over-limit check reports are the full run's, device by device and in its order."""
    topo = _cluster(2)
    full = simulate_shape(profile, topo, shape).memory_bytes
    tight = topo.with_memory(min(full.values()) - 1)
    with pytest.raises(timing.OverLimit) as over:
        simulate_shape(profile, tight, shape, over_limit=True)
    assert over.value.memory == full
    assert list(over.value.memory) == list(full)


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved", 2)])
def test_over_limit_peaks_fold_to_the_full_peaks(schedule: str, virtual: int) -> None:
    """A plan over its memory: the peaks check_memory reports (each device its static
    memory plus its counterpart's rise) are the full run's, device by device."""
    profile = load_profile(ROOT / "profiles" / "gpt.json")
    names = _names(16)
    groups = [names[k * 4 : (k + 1) * 4] for k in range(2)]
    shape = _shape(groups, schedule, 16, virtual=virtual, layers=profile.num_layers)
    _assert_over_limit_peaks_are_full(profile, shape)


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
@pytest.mark.parametrize("tp", [1, 2])
def test_fsdp_over_limit_peaks_fold_to_the_full_peaks(schedule: str, virtual: int, tp: int) -> None:
    """FSDP stages (the first forward of an iteration gathers the weights): the peaks
    check_memory reports from replica 0's gathered programs are the full run's, device by
    device, on pipe-major and replica-major placements."""
    profile = _tp_profile()
    names = _names(16)
    for depth in (2, 4):
        r = 16 // (depth * tp)
        for groups in (
            [names[k * r * tp : (k + 1) * r * tp] for k in range(depth)],
            [[d for j in range(r) for d in names[(j * depth + k) * tp : (j * depth + k + 1) * tp]]
             for k in range(depth)],
        ):  # fmt: skip
            shape = _shape(groups, schedule, 2 * r, tp=tp, sharding="fsdp", virtual=virtual)
            _assert_over_limit_peaks_are_full(profile, shape)


def test_gathered_programs_are_made_once() -> None:
    """CompiledShape.gathered_once: gather_first_forwards' programs, the same object each time;
    kept_work: the gathered programs' work at the kept indices."""
    from planner.schedule import build_schedule
    from planner.simulate.program import compile_programs, gather_first_forwards
    from planner.simulate.shapes import CompiledShape

    names = _names(4)
    shape = _shape([names[:2], names[2:]], "1f1b", 4, sharding="fsdp")
    sched = build_schedule("1f1b", list(shape.stages), 4)
    compiled = CompiledShape(compile_programs(sched, list(shape.stages), names, 4))
    once = compiled.gathered_once([0, 1], 4)
    assert once is compiled.gathered_once([0, 1], 4)
    assert compiled.gathered([0, 1], 4).programs == once.programs
    assert once.programs == gather_first_forwards(compiled.programs, [0, 1], 4)
    assert once.programs != compiled.programs
    kept = compiled.kept_work((0, 2), [0, 1], 4)
    assert [list(w) for w in kept] == [list(once.work[0]), list(once.work[2])]
    assert kept is compiled.kept_work((0, 2), [0, 1], 4)
