"""The memory floor (planner.solve.memory_floor): a lower bound of the simulated peak of
every device, so a plan it refuses is one the simulation finds over a device's memory too;
and the solve that refuses plans by it gives the same plan and the same peers as the solve
that simulates them, with fewer simulations."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from synthetic_profiles import eight_heavy_layers

from planner.errors import InputError
from planner.profile.schema import Profile
from planner.schedule import build_schedule
from planner.shape import PlanShape
from planner.simulate import simulate_shape
from planner.simulate.tables import memory_deltas
from planner.solve import search as search_module
from planner.solve import solve
from planner.solve.memory_floor import (
    first_backward_rises,
    memory_floor,
    order_prefix,
    overflowing,
)
from planner.solve.peer_partitions import PeerPartitions
from planner.solve.peers import TP_PEERS, PeerConfig
from planner.solve.search import Search
from planner.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.solve_identity import plan_without_times  # noqa: E402

MIB = 2**20


# Big stashes, tensor-parallel (and sequence-parallel) entries for degrees 2 and 4: most
# configurations overflow a tight device without recompute.
_profile = partial(eight_heavy_layers, saved_bytes=3072 * MIB, degrees=(2, 4))


def _tight(gib: int) -> Topology:
    """dgx1-v100 (8 GPUs) with every device's memory set to ``gib`` GiB."""
    topo = load_topology(ROOT / "topologies" / "dgx1-v100.yaml")
    return topo.with_memory(gib * 1024 * MIB, name=topo.name + "-tight")


def _shapes(profile: Profile, topo: Topology) -> list[tuple[str, PlanShape]]:
    """Every tuned peer's configuration (TP, SP, ZeRO-1, FSDP, interleaved, zero-bubble,
    GPipe, 1F1B, replicas), each plain and checkpointed, two microbatch settings."""
    parts = PeerPartitions(profile, topo)
    out: list[tuple[str, PlanShape]] = []
    for peer in TP_PEERS:
        for c in peer.configurations(parts, [(1, 8), (2, 4)]):
            if isinstance(c, PeerConfig):
                out += [(c.describe(), c.shape), (c.describe(), c.checkpointed().shape)]
    return out


def _peaks(profile: Profile, topo: Topology, shape: PlanShape) -> dict[str, int] | None:
    try:
        return simulate_shape(profile, topo, shape, bound=False).memory_bytes
    except InputError:
        return None


def test_the_floor_never_exceeds_the_simulated_peak() -> None:
    profile, topo = _profile(), _tight(12)
    shapes = _shapes(profile, topo)
    seen: set[tuple[str, str, int, bool]] = set()
    checked = equal = refused = 0
    for what, shape in shapes:
        floor = memory_floor(profile, topo, shape)
        peaks = _peaks(profile, topo, shape)
        if floor is None or peaks is None:
            continue
        checked += 1
        st = shape.stages[0]
        seen.add((shape.schedule, st.sharding, st.tensor_parallel, st.recompute))
        assert floor.keys() == peaks.keys(), what
        for d, b in floor.items():
            assert b <= peaks[d], (what, d, b, peaks[d])
        equal += max(floor.values()) == max(peaks.values())
        over = overflowing(profile, topo, shape)
        if over is not None:
            refused += 1
            # A refused plan is one the simulation finds over the same devices' memory.
            limit = topo.device
            assert all(peaks[d] > limit(d).memory_bytes for d in over), what
    # Not vacuous: every schedule, sharding, degree and recompute of the sweep is met,
    # the floor is often the peak itself, and it refuses plans.
    assert {s for s, *_ in seen} >= {"1f1b", "gpipe", "interleaved", "zb"}
    assert {sh for _, sh, _, _ in seen} == {"none", "zero1", "fsdp"}
    assert {t for _, _, t, _ in seen} == {1, 2, 4}
    assert {r for *_, r in seen} == {False, True}
    assert checked > 100 and equal > checked // 2 and refused > 10, (checked, equal, refused)


def test_no_floor_for_what_the_simulator_refuses_or_searches() -> None:
    profile, topo = _profile(), _tight(12)
    shape = next(s for _, s in _shapes(profile, topo) if s.schedule == "interleaved")
    short = PlanShape(shape.stages, shape.schedule, shape.microbatch_size, 1, 2)
    assert _peaks(profile, topo, short) is None  # one microbatch for two replicas: refused
    assert memory_floor(profile, topo, short) is None
    searched = PlanShape(shape.stages[:1], "optimized", 1, 8)
    assert memory_floor(profile, topo, searched) is None


def _plan_dict(profile: Profile, topo: Topology) -> tuple[dict[str, Any], int]:
    data = plan_without_times(solve(profile, topo, num_microbatches=8))
    return data, data["solver"].pop("simulations")


def test_refusing_by_the_floor_changes_nothing_but_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile, topo = _profile(), _tight(12)
    refused: list[str] = []
    refuse = Search.refuse

    def noted(self: Search, cand: PlanShape, origin: str) -> Any:
        got = refuse(self, cand, origin)
        if got is not None:
            refused.append(origin)
        return got

    monkeypatch.setattr(Search, "refuse", noted)
    with_floor, sims = _plan_dict(profile, topo)
    assert refused, "the floor refused nothing: the comparison below would show nothing"
    monkeypatch.setattr(search_module, "overflowing", lambda *_: None)
    without, all_sims = _plan_dict(profile, topo)
    assert with_floor == without
    assert sims < all_sims


def test_the_cut_orders_give_the_whole_orders_rises() -> None:
    profile, topo = _profile(), _tight(12)
    compared = 0
    for _, shape in _shapes(profile, topo)[::7]:
        stages = list(shape.stages)
        m, v = shape.num_microbatches, shape.virtual_stages
        prefix = order_prefix(shape.schedule, stages, m, v)
        if prefix is None or memory_floor(profile, topo, shape) is None:
            continue
        assert order_prefix(shape.schedule, stages, m, v) is prefix  # kept
        whole = build_schedule(shape.schedule, stages, m, virtual_stages=v).order
        assert whole is not None
        deltas = memory_deltas(profile, stages, shape.microbatch_size)
        assert first_backward_rises(stages, prefix, *deltas) == first_backward_rises(
            stages, whole, *deltas
        )
        assert all(whole[r][: len(ops)] == ops for r, ops in prefix.items())
        compared += sum(len(ops) < len(whole[r]) for r, ops in prefix.items())
    assert compared > 10  # the cuts are shorter than the orders
