"""An optimised order for uneven stages: search warm-up depths and deferred W passes.

1F1B's fixed warm-up (``p - s - 1``) and ZB-H1's fixed deferral (``s``) are right for
equal stages. With uneven stages a stage behind a slow one may profit from running
more forwards ahead, and a stage whose weight-gradient pass is long from deferring more
of them. :func:`optimized_schedule` starts from 1F1B and from ZB-H1 and changes one
stage's depth at a time, keeping a change when the simulated iteration gets shorter and
every device's predicted memory stays within its limit.

All candidates share one family of orders (:func:`family_order`): stage ``s`` runs
``warm[s]`` forwards, then for each microbatch ``j`` its backward (``B``, or ``I`` and
the deferred ``W(j - defer[s])``) followed by the next forward. ``warm = p - s`` with
an unsplit backward is 1F1B; ``warm = p - s, defer = s`` is ZB-H1.

Example::

    sched = optimized_schedule(stages, 16, profile=profile, microbatch_size=4,
                               topology=topology)
    sched.meta        # {'family': 'zb', 'warmup': [...], 'defer': [...], ...}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from planner.cost import stage_memory_bytes, stage_times
from planner.errors import InputError
from planner.schedule.actions import Schedule
from planner.schedule.expand import ComputeOp

if TYPE_CHECKING:
    from planner.profile.schema import Profile
    from planner.stages import StageSpec
    from planner.topology import Topology

__all__ = ["family_order", "optimized_schedule"]


def family_order(
    num_microbatches: int, warm: Sequence[int], defer: Sequence[int] | None
) -> dict[int, list[ComputeOp]]:
    """Per-stage order with the given warm-up depths; ``defer=None`` keeps B whole.

    Example::

        family_order(8, [4, 3, 2, 1], None)      # 1F1B on 4 stages
        family_order(8, [4, 3, 2, 1], [0, 1, 2, 3])   # ZB-H1
    """
    m = num_microbatches
    order: dict[int, list[ComputeOp]] = {}
    for s, w in enumerate(warm):
        w = max(1, min(w, m))
        ops: list[ComputeOp] = [("F", s, k) for k in range(w)]
        next_f, next_w = w, 0
        d = None if defer is None else defer[s]
        for j in range(m):
            if d is None:
                ops.append(("B", s, j))
            else:
                ops.append(("I", s, j))
                if j - d >= 0:
                    ops.append(("W", s, j - d))
                    next_w += 1
            if next_f < m:
                ops.append(("F", s, next_f))
                next_f += 1
        if d is not None:
            ops.extend(("W", s, k) for k in range(next_w, m))
        order[s] = ops
    return order


def _limits(
    stages: Sequence[StageSpec],
    topology: Topology | None,
    memory_limits: Mapping[str, int] | None,
) -> dict[str, float]:
    if memory_limits is not None:
        return {d: float(v) for d, v in memory_limits.items()}
    if topology is None:
        return {}
    return {d: float(topology.device(d).memory_bytes) for s in stages for d in s.devices}


def optimized_schedule(
    stages: Sequence[StageSpec],
    num_microbatches: int,
    *,
    profile: Profile | None = None,
    microbatch_size: int | None = None,
    topology: Topology | None = None,
    memory_limits: Mapping[str, int] | None = None,
    step_ms: float | None = None,
    max_simulations: int = 40,
    **_: Any,
) -> Schedule:
    """Search the order family for the shortest simulated iteration within memory.

    Example::

        optimized_schedule(stages, 8, profile=profile, microbatch_size=1)
    """
    from planner.schedule import schedule_from_order
    from planner.simulate import simulate_schedule

    if profile is None:
        raise InputError(
            "the optimized schedule needs a profile to simulate candidates", field="schedule"
        )
    for st in stages:
        if len(stages) > 1 and any(st.devices == o.devices for o in stages if o is not st):
            raise InputError(
                "the optimized schedule does not place several stages on one device; use "
                "interleaved for that",
                field="schedule",
            )
    mbs = microbatch_size if microbatch_size is not None else profile.microbatch_sizes[0]
    p, m = len(stages), num_microbatches
    limits = _limits(stages, topology, memory_limits)
    can_split = any(stage_times(profile, s.first, s.last, mbs).weight_grad_ms > 0 for s in stages)
    budget = [max_simulations]
    cache: dict[tuple[tuple[int, ...], tuple[int, ...] | None], float] = {}

    def fits(warm: Sequence[int], defer: Sequence[int] | None) -> bool:
        for s, st in enumerate(stages):
            held = min(m, warm[s] + (defer[s] if defer is not None else 0))
            need = stage_memory_bytes(profile, st.first, st.last, mbs, held, recompute=st.recompute)
            if any(need > limits.get(d, float("inf")) for d in st.devices):
                return False
        return True

    def cost(warm: tuple[int, ...], defer: tuple[int, ...] | None) -> float:
        key = (warm, defer)
        if key not in cache:
            if budget[0] <= 0 or not fits(warm, defer):
                return float("inf")
            budget[0] -= 1
            try:
                sched = schedule_from_order("optimized", stages, family_order(m, warm, defer), m)
            except InputError:  # this combination of depths deadlocks
                cache[key] = float("inf")
                return cache[key]
            res = simulate_schedule(
                profile, topology, stages, sched, mbs, step_ms=step_ms, events=False
            )
            cache[key] = res.iteration_ms
        return cache[key]

    def most_held(st: StageSpec) -> int:
        """How many microbatches fit on the stage's devices (at least one)."""
        held = 1
        while held < m and fits_stage(st, held + 1):
            held += 1
        return held

    def fits_stage(st: StageSpec, held: int) -> bool:
        need = stage_memory_bytes(profile, st.first, st.last, mbs, held, recompute=st.recompute)
        return all(need <= limits.get(d, float("inf")) for d in st.devices)

    room = [most_held(st) for st in stages]
    # Start from 1F1B's depths, cut to what fits; a stage must not run fewer warm-up
    # forwards than the next one (it would wait for a backward that needs them).
    warm0: list[int] = []
    for s in range(p):
        w = min(p - s, m, room[s])
        warm0.append(min(w, warm0[-1]) if warm0 else w)
    base_warm = tuple(warm0)
    starts: list[tuple[tuple[int, ...], tuple[int, ...] | None]] = [(base_warm, None)]
    if can_split:
        defer0 = tuple(max(0, min(s, room[s] - base_warm[s])) for s in range(p))
        starts.append((base_warm, defer0))
        starts.append((base_warm, tuple([0] * p)))
    best = min(starts, key=lambda c: cost(*c))
    best_cost = cost(*best)
    improved = True
    while improved and budget[0] > 0:
        improved = False
        for s in range(p):
            for field_ in ("warm", "defer"):
                if field_ == "defer" and best[1] is None:
                    continue
                for step in (1, -1):
                    warm, defer = list(best[0]), None if best[1] is None else list(best[1])
                    if field_ == "warm":
                        warm[s] += step
                        if not 1 <= warm[s] <= m:
                            continue
                    else:
                        assert defer is not None
                        defer[s] += step
                        if not 0 <= defer[s] < m:
                            continue
                    cand = (tuple(warm), None if defer is None else tuple(defer))
                    c = cost(*cand)
                    if c < best_cost - 1e-9:
                        best, best_cost, improved = cand, c, True
    if best_cost == float("inf"):
        raise InputError(
            "no order of the optimized family fits the devices' memory", field="schedule"
        )
    best_warm, best_defer = best
    return schedule_from_order(
        "optimized",
        stages,
        family_order(m, best_warm, best_defer),
        m,
        meta={
            "family": "1f1b" if best_defer is None else "zb",
            "warmup": list(best_warm),
            "defer": list(best_defer) if best_defer is not None else None,
            "simulated_candidates": len(cache),
        },
    )
