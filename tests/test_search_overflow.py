"""A candidate that overflows a device's memory is simulated as far as its memory: the search
counts and caches it as before, and its time, where anything asks for it, is the full
simulation's."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.profile import Profile, load_profile
from planner.shape import PlanShape
from planner.simulate import simulate_shape
from planner.simulate.timing import OverLimit
from planner.solve.scored import LaterTime
from planner.solve.search import Search
from planner.stages import StageSpec
from planner.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]


def _tight() -> tuple[Profile, Topology, PlanShape]:
    """gpt on two CPUs with memory cut to 60% of a two-stage pipeline's peak."""
    profile = load_profile(ROOT / "profiles" / "gpt.json")
    topo = load_topology(ROOT / "topologies" / "cpu.yaml")
    names = topo.device_names()[:2]
    n = profile.num_layers
    mb = profile.microbatch_sizes[0]
    stages = (
        StageSpec(0, (0, n // 2 - 1), (names[0],)),
        StageSpec(1, (n // 2, n - 1), (names[1],)),
    )
    shape = PlanShape(stages, "1f1b", mb, 8, 1)
    peak = max(simulate_shape(profile, topo, shape).memory_bytes.values())
    tight = topo.with_memory(int(peak * 0.6), name=topo.name + "-tight")
    return profile, tight, shape


def test_over_limit_raises_every_devices_peak() -> None:
    profile, topo, shape = _tight()
    full = simulate_shape(profile, topo, shape)
    with pytest.raises(OverLimit) as exc:
        simulate_shape(profile, topo, shape, over_limit=True)
    assert exc.value.memory == full.memory_bytes


def test_an_overflowing_candidate_is_counted_and_timed_when_asked() -> None:
    profile, topo, shape = _tight()
    search = Search(profile, topo)
    got = search.simulate_as_given(shape, "test")
    assert search.sims == 1 and search.cache[shape] is got
    assert not got.fits and got.runs and got.later is not None
    assert isinstance(got.key()[1], LaterTime)
    assert not got.infinite() and got.later is not None  # finite, without simulating
    full = simulate_shape(profile, topo, shape)
    assert got.iteration_ms == full.iteration_ms and got.later is None
    assert got.memory == {
        d: b for d, b in full.memory_bytes.items() if b > topo.device(d).memory_bytes
    }


def test_later_times_compare_as_the_rounded_times() -> None:
    profile, topo, shape = _tight()
    search = Search(profile, topo)
    got = search.simulate_as_given(shape, "test")
    late = LaterTime(got)
    exact = round(simulate_shape(profile, topo, shape).iteration_ms / shape.samples, 9)
    assert late == exact and late <= exact and late >= exact
    assert late < exact + 1 and exact - 1 < late and not late > exact
