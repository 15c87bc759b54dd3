"""Where the search spends its simulations (issue #22, solve_time's ``tp 96x1024``): a
candidate that overflows with recompute already everywhere it can help is simulated once,
its time left unsimulated."""

from __future__ import annotations

from pathlib import Path

from planner.profile import load_profile
from planner.shape import PlanShape
from planner.simulate import simulate_shape
from planner.solve.memory import with_recompute
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
