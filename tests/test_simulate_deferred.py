"""STEPs deferred on compiled programs (planner.simulate.deferred): a solver loop's lean
run (``bound=False``) of an fp16 or tied-parameter plan gives the numbers the expanded
action lists give, bit for bit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_simulate_fold import _shape

from planner.cost import synthetic_profile, synthetic_tensor_parallel
from planner.profile import TiedParameter, load_profile
from planner.schedule import build_schedule
from planner.shape import PlanShape
from planner.simulate import simulate_shape
from planner.simulate.deferred import defer_steps
from planner.simulate.program import compile_programs
from planner.simulate.timing import with_deferred_steps
from planner.stages import StageSpec
from planner.topology import Topology, topology_from_dict
from planner.topology.cluster import cluster_dict

ROOT = Path(__file__).resolve().parents[1]


def _cluster(nodes: int) -> Topology:
    return topology_from_dict(cluster_dict("dgx-h100", nodes, network="fat-tree"), "<dgx>")


def _same(profile: Any, topo: Topology, shape: PlanShape) -> None:
    lean = simulate_shape(profile, topo, shape, bound=False)
    full = simulate_shape(profile, topo, shape)
    assert lean.iteration_ms == full.iteration_ms
    assert lean.memory_bytes == full.memory_bytes
    assert list(lean.memory_bytes) == list(full.memory_bytes)
    assert lean.busy_ms == full.busy_ms


@pytest.mark.parametrize(
    ("schedule", "virtual"), [("1f1b", 1), ("gpipe", 1), ("zb", 1), ("interleaved", 2)]
)
def test_fp16_lean_runs_match_the_expanded_lists(schedule: str, virtual: int) -> None:
    profile = replace(load_profile(ROOT / "profiles" / "gpt.json"), precision="fp16")
    names = [f"gpu{i}" for i in range(16)]
    layers = profile.num_layers
    for depth, r in ((2, 8), (3, 4), (3, 1)):
        groups = [names[k * r : (k + 1) * r] for k in range(depth)]
        if depth * virtual > layers:
            continue
        shape = _shape(groups, schedule, 6 * r, virtual=virtual, layers=layers)
        _same(profile, _cluster(2), shape)


def test_fp16_tensor_parallel_lean_runs_match() -> None:
    base = synthetic_profile(8, output_bytes=2**22, param_bytes=2**22, saved_bytes=2**20)
    profile = replace(synthetic_tensor_parallel(base, (2, 4)), precision="fp16")
    names = [f"gpu{i}" for i in range(16)]
    for tp, schedule, virtual in ((2, "1f1b", 1), (4, "zb", 1), (2, "interleaved", 2)):
        r = 16 // (2 * tp)
        groups = [names[k * r * tp : (k + 1) * r * tp] for k in range(2)]
        shape = _shape(groups, schedule, 4 * r, virtual=virtual, tp=tp, layers=8)
        _same(profile, _cluster(2), shape)


def test_deferred_programs_are_the_expanded_lists_compiled() -> None:
    names = [f"gpu{i}" for i in range(4)]
    stages = [StageSpec(c, (c, c), (names[c % 2], names[2 + c % 2])) for c in range(4)]
    profile = replace(synthetic_profile(4), precision="fp16")
    expanded = with_deferred_steps(
        profile, stages, build_schedule("interleaved", stages, 8, virtual_stages=2)
    )
    devices = list(expanded.devices)
    want = compile_programs(expanded, stages, devices, 8)
    order = build_schedule("interleaved", stages, 8, virtual_stages=2)  # not expanded
    got = defer_steps(compile_programs(order, stages, devices, 8), frozenset(range(4)), 8)
    assert got is not None
    # The same compute, all-reduce and step entries in the same order (the expanded
    # lists' sends and receives are entries of their own there).
    assert [[e[:4] for e in p if e[0] not in (4, 5)] for p in want] == [
        [e[:4] for e in p] for p in got
    ]


def test_a_refused_move_gives_none() -> None:
    # STEP2 before B2.0: deferring it past its own stage's backward is refused.
    prog = [(1, 0, 0, 1, -1, -1, -1), (9, 2, -1, 29, -1, -1, -1), (1, 2, 0, 21, -1, -1, -1)]
    assert defer_steps([prog], frozenset({2}), 1) is None
    assert defer_steps([prog], frozenset({0}), 1) == [prog]


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved", 2)])
def test_tied_parameter_lean_runs_match(schedule: str, virtual: int) -> None:
    base = load_profile(ROOT / "profiles" / "gpt.json")
    last = base.num_layers - 1
    profile = replace(base, tied_parameters=[TiedParameter("w", (0, last), 2**20, 2**22)])
    names = [f"gpu{i}" for i in range(16)]
    for depth, r in ((2, 8), (3, 2)):
        groups = [names[k * r : (k + 1) * r] for k in range(depth)]
        shape = _shape(groups, schedule, 6 * r, virtual=virtual, layers=base.num_layers)
        _same(profile, _cluster(2), shape)
