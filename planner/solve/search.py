"""The search's state: every candidate simulated once, recompute settled by the simulator.

:class:`Search` holds the inputs, the cache of simulated candidates (a shape met twice is
simulated once), the count of simulations, the methods used and the ILP's outcome.
:meth:`Search.evaluate` simulates a candidate and settles its recompute flags by the
simulator's memory; :meth:`Search.cannot_beat` leaves out a candidate whose lower bound
cannot beat the best plan; :meth:`Search.pass_over` leaves unsimulated a plan a tuned peer
cannot use (whoever meets it later gets it as that peer would have simulated it).
:func:`make_shape` builds a candidate, recompute where the memory model says a stage
overflows.

The solve's time limit is checked before every simulation, the search's unit of work (a
solve spends nearly all its time in them): past ``Search.deadline`` the next simulation
raises :class:`TimeUp` instead, the phase that asked for it stops, and
:meth:`Search.found` holds every plan simulated until then.

Example::

    search = Search(profile, topology, SolveOptions(), time_limit=10)
    cand = make_shape(search, [(0, 3), (4, 7)], [("gpu0",), ("gpu1",)], "1f1b", 4, 8)
    search.evaluate(cand, "dp").per_sample_ms
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.plan import StageSpec
from planner.plan_parts import IlpInfo
from planner.profile.schema import Profile
from planner.shape import PlanShape
from planner.simulate import simulate_shape
from planner.simulate.timing import OverLimit
from planner.solve.bounds import ShareMemo, overflows_memory, search_bound_ms
from planner.solve.memory import UnitMemo, fix_recompute, recompute_units, with_recompute
from planner.solve.memory_floor import overflowing
from planner.solve.options import SolveOptions
from planner.solve.scored import Scored

if TYPE_CHECKING:
    from planner.simulate.result import SimResult
    from planner.topology import Topology

__all__ = ["KEPT_RESULTS", "Search", "TimeUp", "make_shape"]

# How many simulations Search.result_of keeps (the plan chosen, the fastest, their bands).
KEPT_RESULTS = 4


class TimeUp(Exception):  # noqa: N818 (an event, not an error: the search stops on it)
    """The solve's time limit passed before a simulation: the search stops where it is.

    Example::

        try:
            search.evaluate(cand, "grid")
        except TimeUp as stop:
            stop.phase   # 'grid'
    """

    def __init__(self, phase: str) -> None:
        super().__init__(f"the time limit passed during {phase}")
        self.phase = phase


@dataclass
class Search:
    """One solve's inputs and what it has simulated so far; the one place where plan shapes
    are scored, for pipeplan's own search and for the tuned peers alike
    (:mod:`planner.solve.peers`): one cache of simulations, one fits check
    (:meth:`simulate_as_given`), one bound per sample (:meth:`bound_per_sample`).

    Example::

        Search(profile, topology).simulate_as_given(shape, "peer DeepSpeed").fits
    """

    profile: Profile
    topology: Topology
    options: SolveOptions = field(default_factory=SolveOptions)
    time_limit: float = 60.0
    # time.perf_counter() after which no simulation starts (TimeUp); inf: no deadline.
    deadline: float = math.inf
    # The phase the deadline stopped (the origin of the simulation it refused); None: none.
    cut: str | None = None
    cache: dict[PlanShape, Scored] = field(default_factory=dict)
    sims: int = 0
    ilp: IlpInfo | None = None
    methods: list[str] = field(default_factory=list)
    # Re-cuts by (groups, schedule, microbatch size, count, chunks, full): the same
    # pipelines are re-cut for the grid, the best plan's schedules and the seeds.
    recuts: dict[tuple[Any, ...], list[PlanShape]] = field(default_factory=dict)
    # Candidates left unsimulated because their bound could not beat the plan they were
    # measured against, with that bound per sample (see :meth:`bound_per_sample`).
    bounded: dict[PlanShape, float] = field(default_factory=dict)
    # Every bound per sample worked out (shapes the search and the peers share included).
    bounds: dict[PlanShape, float] = field(default_factory=dict)
    # What the search over tensor parallelism and sharding works out once per solve (layer
    # costs per mesh, cuts per stage groups: planner.solve.mesh), keyed by what it is.
    notes: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    # The simulations :meth:`result_of` ran again, the last KEPT_RESULTS of them.
    results: dict[PlanShape, SimResult] = field(default_factory=dict)
    # Shapes a tuned peer left unsimulated (:meth:`pass_over`), with that peer's origin.
    passed: dict[PlanShape, str] = field(default_factory=dict)
    # Each recomputing stage's checkpoint unit, worked out once (memory.recompute_units).
    units: UnitMemo = field(default_factory=dict)
    # Each stage's share of the work in the bounds, worked out once (bounds.search_bound_ms).
    shares: ShareMemo = field(default_factory=ShareMemo)
    # Plans found not to fit by their memory floor, unsimulated (:meth:`refuse`).
    refused: int = 0

    def overflows(self, cand: PlanShape) -> bool:
        """Whether ``cand`` cannot fit with or without recompute: a device's weights,
        gradients and optimizer state alone exceed its memory
        (:func:`planner.solve.bounds.overflows_memory`); nothing to simulate."""
        specs = [s.with_recompute(False) for s in cand.stages]
        return overflows_memory(self.profile, self.topology, specs, cand.schedule)

    def bound_per_sample(self, cand: PlanShape) -> float:
        """A lower bound of the time per sample :meth:`evaluate` can find for ``cand``
        (:func:`planner.solve.bounds.search_bound_ms` without recompute: evaluate may
        switch it off, and recompute only adds time); infinite where it cannot fit
        (:meth:`overflows`: it never beats a plan that fits). Worked out once per shape.

        Example::

            search.bound_per_sample(shape)   # ms per sample, or inf
        """
        hit = self.bounds.get(cand)
        if hit is None:
            hit = self.bounds[cand] = self._bound_per_sample(cand)
        return hit

    def _bound_per_sample(self, cand: PlanShape) -> float:
        if self.overflows(cand):
            return math.inf  # fits with no recompute: never beats a plan that fits
        specs = [s.with_recompute(False) for s in cand.stages]
        m, mb = cand.num_microbatches, cand.microbatch_size
        bound = search_bound_ms(
            self.profile, self.topology, specs, cand.schedule, m, mb, self.shares
        )
        return bound / cand.samples

    def bound_as_given(self, cand: PlanShape) -> float:
        """A lower bound of ``cand``'s simulated time per sample with its recompute flags as
        they are (:func:`planner.solve.bounds.search_bound_ms`: recompute's second forward
        counted), what :meth:`simulate_as_given` can find; infinite where it cannot fit.

        Example::

            search.bound_as_given(shape.with_recompute([True] * len(shape.stages)))
        """
        if self.overflows(cand):
            return math.inf
        m, mb = cand.num_microbatches, cand.microbatch_size
        stages = list(cand.stages)
        bound = search_bound_ms(
            self.profile, self.topology, stages, cand.schedule, m, mb, self.shares
        )
        return bound / cand.samples

    def pass_over(self, cand: PlanShape, origin: str) -> None:
        """Leave ``cand`` unsimulated for now: a tuned peer (``origin``) whose bound shows
        it cannot become that peer's best. Whoever meets it later (another peer, the peer
        defaults, a local search) gets what the peer's simulation would have given them
        (:meth:`met` is true, :meth:`simulate_as_given` under the peer's origin, never
        settled by :meth:`evaluate`), so nothing after the peers depends on what they left
        out; only the count of simulations falls. The first peer to pass it names it.

        Example::

            search.pass_over(checkpointed_shape, "peer Megatron-LM")
        """
        if cand not in self.cache:
            self.passed.setdefault(cand, origin)

    def met(self, cand: PlanShape) -> bool:
        """Whether ``cand`` was simulated, or passed over by a peer (:meth:`pass_over`):
        either way it costs a local search nothing and :meth:`evaluate` returns it as given.

        Example::

            search.met(shape)
        """
        return cand in self.cache or cand in self.passed

    def cannot_beat(self, cand: PlanShape, best: Scored) -> bool:
        """Whether ``cand``'s bound shows it slower than ``best`` (which fits) by more than
        :meth:`Scored.key` rounds away, so it could never replace it; such a candidate is
        remembered, not simulated."""
        if not best.fits or self.met(cand):
            return False
        bound = self.bound_per_sample(cand)
        if round(bound, 9) > round(best.per_sample_ms, 9):
            self.bounded[cand] = bound
            return True
        return False

    def evaluate(self, cand: PlanShape, origin: str) -> Scored:
        """Simulate ``cand``, then settle its recompute flags by the simulator's memory:
        switch recompute on where a device overflows, off where it is not needed."""
        hit = self.cache.get(cand)
        if hit is not None:
            return hit
        if cand in self.passed:  # as a peer simulated it: as given
            return self.simulate_as_given(cand, origin)
        scored = self.simulate_as_given(cand, origin)
        if not scored.fits and scored.runs:
            over = {d for d, b in scored.memory.items() if b > self.topology.device(d).memory_bytes}
            flags = [s.recompute or any(d in over for d in s.devices) for s in cand.stages]
            retry = self.refuse_or_simulate(
                with_recompute(self.profile, cand, flags, self.units), origin
            )
            # The same shape (recompute was already where it overflows) is no retry: its
            # key equals, and comparing two overflowing keys simulates their times.
            if retry is not scored and retry.key() < scored.key():
                scored = retry
        if scored.fits:
            for k, stage in enumerate(scored.shape.stages):
                if stage.recompute:
                    flags = [s.recompute for s in scored.shape.stages]
                    flags[k] = False
                    shape = with_recompute(self.profile, scored.shape, flags, self.units)
                    retry = self.refuse_or_simulate(shape, origin)
                    if retry.key() < scored.key():
                        scored = retry
        self.cache[cand] = scored
        return scored

    def seconds_left(self) -> float:
        """Seconds until the deadline (``inf`` without one; negative once it passed).

        Example::

            search.seconds_left()
        """
        return self.deadline - time.perf_counter()

    def check_clock(self, phase: str) -> None:
        """Raise :class:`TimeUp` (and remember ``phase`` as the one cut) once the deadline
        has passed.

        Example::

            search.check_clock("ilp")
        """
        if time.perf_counter() > self.deadline:
            if self.cut is None:
                self.cut = phase
            raise TimeUp(phase)

    def found(self) -> list[Scored]:
        """Every plan simulated so far, by anyone (the search, the peers), in the order
        they were simulated: what a search the deadline stopped chooses from.

        Example::

            best = min(search.found(), key=Scored.key)
        """
        unique = {id(x): x for x in self.cache.values()}  # evaluate caches a plan twice
        return list(unique.values())

    def simulate_as_given(self, cand: PlanShape, origin: str) -> Scored:
        """Simulate ``cand`` with its recompute flags as they are (once per search);
        :class:`TimeUp` instead once the deadline has passed."""
        hit = self.cache.get(cand)
        if hit is not None:
            return hit
        origin = self.passed.pop(cand, origin)  # a peer passed it over: the peer's
        self.check_clock(origin)
        self.sims += 1
        try:
            res = simulate_shape(self.profile, self.topology, cand, over_limit=True, bound=False)
        except OverLimit as exc:
            # Memory alone settles that it does not fit; its time only where it is asked.
            device = self.topology.device
            over = {d: b for d, b in exc.memory.items() if b > device(d).memory_bytes}
            scored = Scored(cand, math.nan, False, over, None, origin, later=self._timer(cand))
            self.cache[cand] = scored
            return scored
        except InputError:
            # A schedule that cannot run this shape (e.g. interleaved with too few
            # microbatches) is simply not a candidate.
            scored = Scored(cand, math.inf, False, {}, None, origin, runs=False)
            self.cache[cand] = scored
            return scored
        device = self.topology.device
        over = {d: int(b) for d, b in res.memory_bytes.items() if b > device(d).memory_bytes}
        # Only what the search reads: the time, the fit, the devices that overflow.
        scored = Scored(cand, float(res.iteration_ms), not over, over, None, origin)
        self.cache[cand] = scored
        return scored

    def refuse(self, cand: PlanShape, origin: str) -> Scored | None:
        """``cand`` scored as not fitting without simulating it, where its memory floor
        (:func:`planner.solve.memory_floor.overflowing`: a lower bound of the simulated
        peak) already exceeds a device's memory; None where it does not (or ``cand`` was
        simulated: :meth:`simulate_as_given` returns that). The result is what the
        simulation's memory check gives (not fitting, its time simulated only where it is
        asked), but for the bytes of the devices that overflow: the floor's, of those
        whose floor overflows, so only a caller that does not read them asks here (the
        peers' sweeps and :meth:`evaluate`'s recompute retries, never its first
        simulation, which switches recompute on where devices overflow). Counted in
        :attr:`refused`, not in :attr:`sims`.

        Example::

            search.refuse(shape, "peer torchtitan") or search.simulate_as_given(shape, "x")
        """
        if cand in self.cache:
            return None
        over = overflowing(self.profile, self.topology, cand)
        if over is None:
            return None
        origin = self.passed.pop(cand, origin)  # a peer passed it over: the peer's
        self.refused += 1
        scored = Scored(cand, math.nan, False, over, None, origin, later=self._timer(cand))
        self.cache[cand] = scored
        return scored

    def refuse_or_simulate(self, cand: PlanShape, origin: str) -> Scored:
        """:meth:`refuse`, else :meth:`simulate_as_given`: for a caller that reads only
        whether ``cand`` fits and its time, not which devices overflow by how much.

        Example::

            search.refuse_or_simulate(shape, "peer Megatron-LM").fits
        """
        return self.refuse(cand, origin) or self.simulate_as_given(cand, origin)

    def _timer(self, cand: PlanShape) -> Callable[[], float]:
        """The simulated iteration of ``cand`` (infinite where the schedule cannot run
        it), for a plan that overflows whose time is asked."""

        def iteration_ms() -> float:
            try:
                res = simulate_shape(self.profile, self.topology, cand, bound=False)
                return float(res.iteration_ms)
            except InputError:
                return math.inf

        return iteration_ms

    def result_of(self, scored: Scored) -> SimResult:
        """The simulation of ``scored`` (which runs): its own where it holds one, else
        simulated again (the same numbers; not counted in :attr:`sims`), the last few
        remembered.

        Example::

            search.result_of(best).bubble_fraction
        """
        if scored.result is not None:
            return scored.result
        hit = self.results.get(scored.shape)
        if hit is None:
            hit = simulate_shape(self.profile, self.topology, scored.shape)
            self.results[scored.shape] = hit
            while len(self.results) > KEPT_RESULTS:
                del self.results[next(iter(self.results))]
        return hit


def make_shape(
    search: Search,
    ranges: Sequence[tuple[int, int]],
    devices: Sequence[Sequence[str]],
    schedule: str,
    mb: int,
    num_microbatches: int,
    recompute: Sequence[bool] | None = None,
    virtual: int = 1,
) -> PlanShape:
    """The candidate for these stages; recompute as given, or where memory needs it
    (:func:`planner.solve.memory.fix_recompute`), each recomputing stage checkpointed in
    the unit that peaks lower (:func:`planner.solve.memory.recompute_units`).

    Example::

        make_shape(search, [(0, 7)], [("gpu0", "gpu1")], "1f1b", 4, 8)
    """
    if recompute is None:
        recompute = fix_recompute(
            search.profile,
            search.topology,
            ranges,
            devices,
            schedule,
            mb,
            num_microbatches,
            virtual,
        )
    # Replicas keep the order they were chosen in: the all-reduce ring follows it.
    stages = tuple(
        StageSpec(i, (int(a), int(b)), tuple(d), bool(rc))
        for i, ((a, b), d, rc) in enumerate(zip(ranges, devices, recompute, strict=True))
    )
    stages = recompute_units(
        search.profile, stages, schedule, mb, num_microbatches, virtual, search.units
    )
    return PlanShape(stages, schedule, mb, num_microbatches, virtual)
