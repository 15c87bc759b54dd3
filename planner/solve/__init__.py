"""``solve``: the best pipeline plan for a profile on a topology, judged by the simulator.

The search, for every profiled microbatch size that fits the requested batch:

1. **Exhaustive** when the instance is tiny (every contiguous partition x every sequence of
   disjoint, ordered device lists is simulated), so small cases are exactly optimal.
2. Otherwise **candidates**: the exact chain DP (:mod:`planner.partition.dp`) over device
   orderings from :mod:`planner.partition.mapping`, for every number of stages and uniform
   replication degree; on heterogeneous devices or networks the **ILP**
   (:mod:`planner.partition.ilp`) for joint partition + mapping, warm-started from the DP;
   and the **peers** (:mod:`planner.solve.peers`: each tuned over its users' sweep, and the
   peer defaults in device order), scored by the same search.
3. The simulator times the most promising candidates (recompute settled by its memory:
   on exactly where a device would overflow), a **local search** (move cuts, swap, replace,
   add, reorder or move replicas, split, merge) improves the best few, and every allowed
   schedule is tried on the winner. The plan with the lowest simulated time per sample
   whose every device fits in memory wins.

Everything is deterministic: fixed iteration orders, evaluation budgets counted in
simulations (never wall time), ties broken on the plan itself, CBC single-threaded.

The modules, bottom to top: ``options`` (:class:`SolveOptions`, the fixed sizes), ``scored``
(``Scored``: a simulated :class:`~planner.shape.PlanShape`), ``memory`` (in-flight
microbatches, recompute), ``bounds`` (lower bounds per plan), ``search`` (``Search``: the
one cache, fits check and bound that score every shape, the search's and the peers'),
``arguments``, ``exhaustive``, ``dp_candidates``, ``recut`` (re-cuts over fixed groups,
interleaved), ``grid``, ``ilp_candidate``, ``local`` (local search), ``own_search``;
``peer_partitions`` (the peers' partitioners, cached and placed), ``peers`` (each peer a
generator of plan shapes), ``peer_report`` (the peers, their seeds and rows);
``infeasible``, ``to_plan``, ``entry`` (:func:`solve`).

Example::

    plan = solve(profile, topology, global_batch=32, time_limit=10)
    plan.predicted.iteration_ms, [s.layers for s in plan.stages]
"""

from planner.solve.entry import solve
from planner.solve.exhaustive import exhaustive_size
from planner.solve.options import SCHEDULE_CHOICES, SolveOptions
from planner.solve.peer_report import baseline_outcomes, baseline_partitions

__all__ = [
    "SCHEDULE_CHOICES",
    "SolveOptions",
    "baseline_outcomes",
    "baseline_partitions",
    "exhaustive_size",
    "solve",
]
