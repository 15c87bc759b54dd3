"""Where the search over tensor parallelism spends its simulations (issue #22, solve_time's
``tp 96x1024``): a candidate that overflows with recompute already everywhere it can help
is simulated once, its time left unsimulated; the degree descent runs after the other
schedules and the interleaved re-cuts, so an interleaved best ends it at no cost."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from synthetic_profiles import pcie_mixed_profile

from planner.profile import load_profile
from planner.shape import PlanShape
from planner.simulate import simulate_shape
from planner.solve.local import distinct_starts
from planner.solve.memory import with_recompute
from planner.solve.mesh_search import mesh_schedules
from planner.solve.options import INTERLEAVED_SEEDS
from planner.solve.scored import Scored
from planner.solve.search import Search
from planner.stages import StageSpec
from planner.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]


def test_an_overflowing_candidate_with_recompute_everywhere_is_simulated_once() -> None:
    """gpt on two CPUs with memory cut to a fifth of the plain pipeline's peak: recompute
    on both stages still overflows, so the retry with recompute where it overflows is the
    candidate itself; nothing asks for its time (only comparing two overflowing plans does)."""
    profile = load_profile(ROOT / "profiles" / "gpt.json")
    topo = load_topology(ROOT / "topologies" / "cpu.yaml")
    a, b = topo.device_names()[:2]
    n, mb = profile.num_layers, profile.microbatch_sizes[0]
    stages = (StageSpec(0, (0, n // 2 - 1), (a,)), StageSpec(1, (n // 2, n - 1), (b,)))
    plain = PlanShape(stages, "1f1b", mb, 8, 1)
    peak = max(simulate_shape(profile, topo, plain).memory_bytes.values())
    tight = topo.with_memory(int(peak * 0.2), name="cpu-tight")
    search = Search(profile, tight)
    shape = with_recompute(profile, plain, [True, True], search.units)
    got = search.evaluate(shape, "test")
    assert not got.fits and got.runs
    assert search.sims == 1 and search.cache[shape] is got
    assert got.later is not None  # its time was never simulated


def test_the_degree_descent_starts_after_the_schedules_of_the_seeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the descent starts, every other schedule and interleaved re-cut of the plans the
    schedules step is seeded with was simulated or left out by its bound (before, the
    descent ran first and on big instances its mixed plan, which cannot be interleaved,
    was the only seed)."""
    ms = importlib.import_module("planner.solve.mesh_search")  # also a function's name

    schedules = ["1f1b", "zb", "interleaved"]
    search = Search(pcie_mixed_profile(), load_topology(ROOT / "topologies" / "pcie.yaml"))
    tried: list[list[bool]] = []
    descent = ms._degree_descent

    def spy(search: Search, scored: list[Scored]) -> list[Scored]:
        mine = [x for x in scored if x.origin != "mesh schedule"]
        seeds = distinct_starts(mine, INTERLEAVED_SEEDS)
        variants = [c for s in seeds for c in mesh_schedules(search, s.shape, schedules)]
        assert any(c.virtual_stages > 1 for c in variants)
        tried.append([c in search.cache or c in search.bounded for c in variants])
        return descent(search, scored)

    monkeypatch.setattr(ms, "_degree_descent", spy)
    ms.mesh_search(search, [(1, 8)], schedules)
    (met,) = tried
    assert all(met)
