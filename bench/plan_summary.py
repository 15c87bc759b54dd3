"""What the solver benchmarks report of a solved plan: its shape, its time against the
bounds, and against the best tuned peer (shared by solver_scaling.py and scaling_on_paper.py).

Example::

    row.update(plan_summary(profile, topology, solve(profile, topology)))
"""

from __future__ import annotations

from typing import Any

from planner.plan import Plan
from planner.profile import Profile
from planner.solve.bounds import search_bound_ms
from planner.topology import Topology

__all__ = ["plan_summary"]


def plan_summary(profile: Profile, topo: Topology, plan: Plan) -> dict[str, Any]:
    """Stages, schedule, bounds and the best tuned peer of a solved plan."""
    pred, solver = plan.predicted, plan.solver
    assert pred is not None and pred.global_lower_bound_ms is not None  # solve writes both
    assert solver is not None and solver.without_peers is not None
    it = pred.iteration_ms
    bound = search_bound_ms(
        profile,
        topo,
        plan.stages,
        plan.schedule.name,
        plan.num_microbatches,
        plan.microbatch_size,
    )
    # Feasible peers have a time; the fastest (the first of equals) is the best.
    tuned = [(b.iteration_ms, b) for b in plan.baselines if b.tuned and b.feasible]
    timed = [(ms, b) for ms, b in tuned if ms is not None]
    best_ms, best = min(timed, key=lambda x: x[0]) if timed else (None, None)
    alone = solver.without_peers.iteration_ms
    return {
        "stages": len(plan.stages),
        "replicas": len(plan.stages[0].devices),
        "schedule": plan.schedule.name,
        "vs_lower_bound": round(it / pred.global_lower_bound_ms, 3),
        "vs_plan_bound": round(it / bound, 3),
        "best_peer": None if best is None else f"{best.name}: {best.configuration}",
        "vs_best_peer": None if best_ms is None else round(best_ms / it, 3),
        "search_alone": None if best_ms is None else round(best_ms / alone, 3),
        "iteration_ms": round(it, 2),
        "simulations": solver.simulations,
    }
