"""The ILP's candidate: joint partition + mapping (:mod:`planner.partition.ilp`, PuLP/CBC)
at the best plan's microbatch size and stage count, warm-started from it or from the DP.

Run where devices or links differ (the DP is exact otherwise), up to
:data:`planner.solve.options.ILP_MAX_DEVICES` devices and
:data:`planner.solve.options.ILP_MAX_CELLS` layers x stages; its outcome is recorded in
``search.ilp`` for the plan's ``solver.ilp``.

Example::

    scored = run_ilp(search, best, ["1f1b"], time_limit=10.0)
    search.ilp.status if search.ilp else None
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.partition.dp import LayerCosts, layer_costs
from planner.partition.ilp import solve_ilp
from planner.plan_parts import IlpInfo
from planner.solve.dp_candidates import DpCand, dp_candidates
from planner.solve.memory import in_flight, weight_versions
from planner.solve.options import ILP_MAX_CELLS, ILP_MAX_DEVICES
from planner.solve.scored import Scored
from planner.solve.search import Search, make_shape

__all__ = ["run_ilp"]


def _ilp_candidate(
    search: Search,
    costs: LayerCosts,
    schedule: str,
    num_microbatches: int,
    warm: DpCand | None,
    num_stages: int,
    time_limit: float,
) -> tuple[list[tuple[int, int]], list[str], list[bool]] | None:
    """The ILP's ranges, device per stage and recompute (None if it found none)."""
    stashed = [in_flight(schedule, num_stages, k, num_microbatches) for k in range(num_stages)]
    warm_start = None
    if warm is not None and all(len(g) == 1 for g in warm.groups):
        warm_start = (list(warm.ranges), [g[0] for g in warm.groups], list(warm.recompute))
    res = solve_ilp(
        costs,
        search.topology,
        num_stages=num_stages,
        in_flight=stashed,
        num_microbatches=num_microbatches,
        weight_versions=weight_versions(schedule),
        time_limit=time_limit,
        warm_start=warm_start,
    )
    search.ilp = IlpInfo(
        status=res.status,
        gap=res.gap,
        seconds=round(res.seconds, 3),
        objective_ms=res.objective_ms,
        bound_ms=res.bound_ms,
        num_stages=num_stages,
    )
    if res.ranges is None or res.devices is None or res.recompute is None:
        return None
    return res.ranges, res.devices, res.recompute


def run_ilp(
    search: Search, best: Scored, primary: Sequence[str], time_limit: float
) -> Scored | None:
    """Joint partition + mapping by the ILP at the best candidate's microbatch size and
    stage count, warm-started from it (or from the DP in device order).

    Example::

        run_ilp(search, min(scored, key=Scored.key), ["1f1b"], 10.0)
    """
    if not best.fits:
        return None
    c = best.shape
    n = search.profile.num_layers
    names = search.topology.device_names()
    s = min(max(len(c.stages), 2), n, len(names))
    if len(names) > ILP_MAX_DEVICES or n * s > ILP_MAX_CELLS:
        search.methods.append("ilp skipped (too large)")
        return None
    costs = layer_costs(search.profile, c.microbatch_size)
    sched = c.schedule if c.schedule in primary else primary[0]
    m = c.num_microbatches
    warm: DpCand | None = None
    if len(c.stages) == s and all(len(st.devices) == 1 for st in c.stages):
        warm = DpCand(
            0.0,
            tuple(st.layers for st in c.stages),
            tuple(st.devices for st in c.stages),
            tuple(st.recompute for st in c.stages),
        )
    else:
        in_order = dp_candidates(search, costs, [names], sched, m)
        warm = next((w for w in in_order if len(w.ranges) == s and len(w.groups[0]) == 1), None)
    search.methods.append("ilp")
    got = _ilp_candidate(search, costs, sched, m, warm, s, time_limit)
    if got is None:
        return None
    ranges, devs, _ = got
    cand = make_shape(search, ranges, [(d,) for d in devs], sched, c.microbatch_size, m)
    return search.evaluate(cand, "ilp")
