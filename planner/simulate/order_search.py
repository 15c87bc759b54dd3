"""An optimised order for uneven stages: search warm-up depths and deferred W passes.

1F1B's fixed warm-up (``p - s - 1``) and ZB-H1's fixed deferral (``s``) are right for
equal stages. With uneven stages a stage behind a slow one may profit from running
more forwards ahead, and a stage whose weight-gradient pass is long from deferring more
of them. :func:`optimized_schedule` starts from 1F1B and from ZB-H1 and changes one
stage's depth at a time, keeping a change when the simulated iteration gets shorter and
every device's predicted memory stays within its limit.

All candidates share one family of orders
(:func:`planner.schedule.order_family.family_order`): stage ``s`` runs ``warm[s]``
forwards, then for each microbatch ``j`` its backward (``B``, or ``I`` and the deferred
``W(j - defer[s])``) followed by the next forward. ``warm = p - s`` with an unsplit
backward is 1F1B; ``warm = p - s, defer = s`` is ZB-H1.

Example::

    sched = optimized_schedule(stages, 16, profile=profile, microbatch_size=4,
                               topology=topology)
    sched.meta        # {'family': 'zb', 'warmup': [...], 'defer': [...], ...}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from planner.cost import stage_times
from planner.errors import InputError
from planner.schedule import Schedule, checked_virtual_stages, schedule_from_order
from planner.schedule.order_family import family_order
from planner.simulate.shards import check_parallel_stages, member_memory_bytes, shard_view
from planner.simulate.timing import simulate_schedule

if TYPE_CHECKING:
    from planner.profile.schema import Profile
    from planner.stages import StageSpec
    from planner.topology import Topology

__all__ = ["optimized_schedule"]


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


Depths = tuple[tuple[int, ...], tuple[int, ...] | None]
"""One candidate of the family: (warm-up depth per stage, W deferral per stage or None)."""


def optimized_schedule(
    stages: Sequence[StageSpec],
    num_microbatches: int,
    *,
    profile: Profile | None = None,
    microbatch_size: int | None = None,
    topology: Topology | None = None,
    memory_limits: Mapping[str, int] | None = None,
    step_ms: float | Sequence[float] | None = None,
    max_simulations: int = 40,
) -> Schedule:
    """Search the order family for the shortest simulated iteration within memory.

    Example::

        optimized_schedule(stages, 8, profile=profile, microbatch_size=1)
    """
    checked_virtual_stages("optimized", stages, num_microbatches)
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
    if not all(st.is_plain for st in stages):  # before a member's memory is asked for
        check_parallel_stages(profile, stages, flush=True)
    mbs = microbatch_size if microbatch_size is not None else profile.microbatch_sizes[0]
    search = _OrderSearch(
        profile,
        topology,
        stages,
        num_microbatches,
        mbs,
        _limits(stages, topology, memory_limits),
        step_ms,
        max_simulations,
    )
    best, best_cost = search.climb(search.starts())
    if best_cost == float("inf"):
        raise InputError(
            "no order of the optimized family fits the devices' memory", field="schedule"
        )
    best_warm, best_defer = best
    return schedule_from_order(
        "optimized",
        stages,
        family_order(num_microbatches, best_warm, best_defer),
        num_microbatches,
        meta={
            "family": "1f1b" if best_defer is None else "zb",
            "warmup": list(best_warm),
            "defer": list(best_defer) if best_defer is not None else None,
            "simulated_candidates": len(search.cache),
        },
    )


class _OrderSearch:
    """Candidates' memory checks and simulated times, within a budget of simulations."""

    def __init__(
        self,
        profile: Profile,
        topology: Topology | None,
        stages: Sequence[StageSpec],
        num_microbatches: int,
        microbatch_size: int,
        limits: Mapping[str, float],
        step_ms: float | Sequence[float] | None,
        max_simulations: int,
    ) -> None:
        self.profile, self.topology, self.stages = profile, topology, stages
        self.m, self.mbs, self.limits, self.step_ms = (
            num_microbatches,
            microbatch_size,
            limits,
            step_ms,
        )
        self.budget = max_simulations
        self.cache: dict[Depths, float] = {}

    def fits_stage(self, st: StageSpec, held: int) -> bool:
        """Whether ``held`` microbatches' activations fit on the stage's devices (a member's
        shard, its sharded state and FSDP's gathered weights where it has them)."""
        need = member_memory_bytes(self.profile, st, self.mbs, held)
        return all(need <= self.limits.get(d, float("inf")) for d in st.devices)

    def fits(self, warm: Sequence[int], defer: Sequence[int] | None) -> bool:
        return all(
            self.fits_stage(st, min(self.m, warm[s] + (defer[s] if defer is not None else 0)))
            for s, st in enumerate(self.stages)
        )

    def cost(self, cand: Depths) -> float:
        """The candidate's simulated iteration (inf: over memory, deadlocks, or no budget)."""
        if cand not in self.cache:
            warm, defer = cand
            if self.budget <= 0 or not self.fits(warm, defer):
                return float("inf")
            self.budget -= 1
            try:
                order = family_order(self.m, warm, defer)
                sched = schedule_from_order("optimized", self.stages, order, self.m)
            except InputError:  # this combination of depths deadlocks
                self.cache[cand] = float("inf")
                return self.cache[cand]
            res = simulate_schedule(
                self.profile,
                self.topology,
                self.stages,
                sched,
                self.mbs,
                step_ms=self.step_ms,
                events=False,
            )
            self.cache[cand] = res.iteration_ms
        return self.cache[cand]

    def starts(self) -> list[Depths]:
        """1F1B's depths cut to what fits, and (if W can be split off) ZB-H1's and no deferral."""
        p, m = len(self.stages), self.m
        room = []
        for st in self.stages:
            held = 1  # how many microbatches fit on the stage's devices (at least one)
            while held < m and self.fits_stage(st, held + 1):
                held += 1
            room.append(held)
        # A stage must not run fewer warm-up forwards than the next one (it would wait
        # for a backward that needs them).
        warm0: list[int] = []
        for s in range(p):
            w = min(p - s, m, room[s])
            warm0.append(min(w, warm0[-1]) if warm0 else w)
        base = tuple(warm0)
        starts: list[Depths] = [(base, None)]
        can_split = any(
            stage_times(shard_view(self.profile, s), s.first, s.last, self.mbs).weight_grad_ms > 0
            for s in self.stages
        )
        if can_split:
            starts.append((base, tuple(max(0, min(s, room[s] - base[s])) for s in range(p))))
            starts.append((base, tuple([0] * p)))
        return starts

    def climb(self, starts: Sequence[Depths]) -> tuple[Depths, float]:
        """Change one stage's depth by one while the simulated iteration gets shorter
        (each change is tried from the best found so far, kept as soon as it helps)."""
        best = min(starts, key=self.cost)
        best_cost = self.cost(best)
        improved = True
        while improved and self.budget > 0:
            improved = False
            for s in range(len(self.stages)):
                for field_ in ("warm", "defer"):
                    for step in (1, -1):
                        cand = self._moved(best, s, field_, step)
                        if cand is None:
                            continue
                        c = self.cost(cand)
                        if c < best_cost - 1e-9:
                            best, best_cost, improved = cand, c, True
        return best, best_cost

    def _moved(self, best: Depths, s: int, field_: str, step: int) -> Depths | None:
        """``best`` with stage ``s``'s warm-up or deferral moved by ``step`` (None: invalid)."""
        warm, defer = list(best[0]), None if best[1] is None else list(best[1])
        if field_ == "warm":
            warm[s] += step
            if not 1 <= warm[s] <= self.m:
                return None
        else:
            if defer is None:
                return None
            defer[s] += step
            if not 0 <= defer[s] < self.m:
                return None
        return (tuple(warm), None if defer is None else tuple(defer))
