"""``solve``'s time limit bounds the whole solve: no simulation starts after it, every phase
(the search, the peers, their seeds) stops, and the best plan simulated so far is returned
with ``solver.status == "time limit"``; none yet is one line naming ``--time-limit``.

The clock is a fake that moves one second per reading, so where the limit falls does not
depend on the machine.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.profile import Profile, load_profile
from planner.solve import solve
from planner.solve.search import Search, TimeUp
from planner.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    """``time.perf_counter`` advances one second each time it is read."""
    seconds = itertools.count(1000)
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(seconds)))


def _inputs() -> tuple[Profile, Topology]:
    profile = load_profile(ROOT / "profiles" / "gpt.json")
    return profile, load_topology(ROOT / "topologies" / "dgx1-v100.yaml")


def test_an_unlimited_solve_is_not_marked() -> None:
    profile, topo = _inputs()
    plan = solve(profile, topo, global_batch=32)
    assert plan.solver.status == "best found" and "stopped" not in plan.solver.method


def test_the_limit_stops_the_search_and_returns_the_best_plan_so_far(ticking: None) -> None:
    profile, topo = _inputs()
    free = solve(profile, topo, global_batch=32, time_limit=10**6)
    cut = solve(profile, topo, global_batch=32, time_limit=40)
    assert cut.solver.status == "time limit" and "(stopped in " in cut.solver.method
    assert cut.solver.simulations is not None and free.solver.simulations is not None
    assert 0 < cut.solver.simulations < free.solver.simulations
    assert cut.predicted is not None and free.predicted is not None
    assert cut.predicted.iteration_ms >= free.predicted.iteration_ms
    # The peers the clock left no time for say so instead of looking beaten.
    cut_rows = [b for b in cut.baselines if not b.feasible]
    assert any("time limit" in (b.reason or "") for b in cut_rows)


def test_no_plan_yet_is_one_line_naming_the_flag(ticking: None) -> None:
    profile, topo = _inputs()
    with pytest.raises(InputError, match=r"no plan that fits was found in 0.5 s") as got:
        solve(profile, topo, global_batch=32, time_limit=0.5)
    assert got.value.field == "--time-limit"


def test_no_simulation_starts_after_the_deadline(ticking: None) -> None:
    profile, topo = _inputs()
    search = Search(profile, topo, deadline=time.perf_counter() + 3)
    assert search.seconds_left() > 0
    search.check_clock("grid")
    with pytest.raises(TimeUp, match="during dp"):
        for _ in range(3):
            search.check_clock("dp")
    assert search.cut == "dp" and search.sims == 0
