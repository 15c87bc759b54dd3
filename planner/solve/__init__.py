"""``solve``: the best pipeline plan for a profile on a topology, judged by the simulator.

The search, for every profiled microbatch size that fits the requested batch:

1. **Exhaustive** when the instance is tiny (every contiguous partition x every sequence of
   disjoint, ordered device lists is simulated), so small cases are exactly optimal.
2. Otherwise **candidates**: the exact chain DP (:mod:`planner.partition.dp`) over device
   orderings from :mod:`planner.partition.mapping`, for every number of stages and uniform
   replication degree; on heterogeneous devices or networks the **ILP**
   (:mod:`planner.partition.ilp`) for joint partition + mapping, warm-started from the DP;
   and the **baselines** (uniform, parameter-, time-balanced, PipeDream), placed in device
   order.
3. The simulator times the most promising candidates (recompute settled by its memory:
   on exactly where a device would overflow), a **local search** (move cuts, swap, replace,
   add, reorder or move replicas, split, merge) improves the best few, and every allowed
   schedule is tried on the winner. The plan with the lowest simulated time per sample
   whose every device fits in memory wins.

Everything is deterministic: fixed iteration orders, evaluation budgets counted in
simulations (never wall time), ties broken on the plan itself, CBC single-threaded.

Example::

    plan = solve(profile, topology, global_batch=32, time_limit=10)
    plan.predicted.iteration_ms, [s.layers for s in plan.stages]
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.cost import stage_compute_ms, stage_memory_bytes
from planner.errors import InfeasibleError, InputError
from planner.partition.dp import (
    ChainPartition,
    LayerCosts,
    Linear,
    Slot,
    layer_costs,
    partition_chain,
    partition_chain_depths,
)
from planner.partition.mapping import (
    candidate_paths,
    identical_devices,
    links_between,
    slots_along,
    uniform_network,
)
from planner.partition.peers import PeerBest, PeerJudge
from planner.plan import Plan, StageSpec, plan_from_simulation
from planner.plan_parts import Baseline, FileRef, IlpInfo, SolverInfo, WithoutPeers
from planner.profile.schema import Profile, as_profile
from planner.schedule.families import FAMILIES, family
from planner.topology import as_topology

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "SCHEDULE_CHOICES",
    "SolveOptions",
    "baseline_outcomes",
    "baseline_partitions",
    "exhaustive_size",
    "solve",
]

SCHEDULE_CHOICES = ("auto", *(n for n, f in FAMILIES.items() if not f.searched))
# Synchronous schedules "auto" tries, most conventional first (ties keep the earlier one).
_AUTO = ("1f1b", "gpipe", "zb", "interleaved")

# The ILP's model grows with stages x devices^2; beyond this the DP + local search decide.
_ILP_MAX_DEVICES = 32
_ILP_MAX_CELLS = 48 * 32
# Stage counts tried by per-count DPs (where one backward DP cannot answer them all).
_MAX_FRONT_DPS = 8
# Plans re-cut into interleaved chunks, and the chunks per device tried.
_INTERLEAVED_SEEDS = 6
_VIRTUAL = (2, 3, 4)
# Plans the local search starts from, and the fewest simulations it gets from the best.
_LOCAL_STARTS = 3
_LOCAL_FLOOR = 24

StageKey = tuple[tuple[int, int], tuple[str, ...], bool]


@dataclass(frozen=True)
class Candidate:
    """A fully specified plan to simulate."""

    stages: tuple[StageKey, ...]
    schedule: str
    microbatch_size: int
    num_microbatches: int
    virtual_stages: int = 1

    def specs(self) -> list[StageSpec]:
        return [
            StageSpec(id=i, layers=r, devices=list(d), recompute=rc)
            for i, (r, d, rc) in enumerate(self.stages)
        ]

    @property
    def samples(self) -> int:
        return self.microbatch_size * self.num_microbatches


@dataclass
class Scored:
    """A simulated candidate."""

    cand: Candidate
    iteration_ms: float
    fits: bool
    memory: dict[str, int]
    result: Any
    origin: str

    @property
    def per_sample_ms(self) -> float:
        return self.iteration_ms / self.cand.samples

    def key(self) -> tuple[Any, ...]:
        # Fit first, then speed; then fewer devices, then the plan itself, for determinism.
        used = sum(len(d) for _, d, _ in self.cand.stages)
        return (
            not self.fits,
            round(self.per_sample_ms, 9),
            used,
            _AUTO.index(self.cand.schedule) if self.cand.schedule in _AUTO else 9,
            repr(self.cand),
        )


@dataclass
class SolveOptions:
    """Knobs of the search beyond the contract's flags (defaults are what the CLI uses)."""

    exhaustive_limit: int = 4000  # simulate everything when the space is at most this big
    top_candidates: int = 6  # DP candidates simulated per (microbatch size, schedule)
    local_search_evals: int = 400  # simulator calls the local search may spend
    use_ilp: bool | None = None  # None: only where the DP is not exact
    baselines: bool = True


@dataclass
class _Search:
    profile: Profile
    topology: Topology
    options: SolveOptions
    time_limit: float
    cache: dict[Candidate, Scored] = field(default_factory=dict)
    sims: int = 0
    ilp: IlpInfo | None = None
    methods: list[str] = field(default_factory=list)
    # Re-cuts by (groups, schedule, microbatch size, count, chunks, full): the same
    # pipelines are re-cut for the grid, the best plan's schedules and the seeds.
    recuts: dict[tuple[Any, ...], list[Candidate]] = field(default_factory=dict)
    # Candidates left unsimulated because their bound could not beat the plan they were
    # measured against, with that bound per sample (see :meth:`bound_per_sample`).
    bounded: dict[Candidate, float] = field(default_factory=dict)

    def bound_per_sample(self, cand: Candidate) -> float:
        """A lower bound of the time per sample :meth:`evaluate` can find for ``cand``
        (:func:`planner.partition.bounds.search_bound_ms` without recompute: evaluate may
        switch it off, and recompute only adds time); infinite where it cannot fit
        (:func:`planner.partition.bounds.overflows_memory`: it never beats a plan that
        fits)."""
        from planner.partition.bounds import overflows_memory, search_bound_ms

        hit = self.bounded.get(cand)
        if hit is not None:
            return hit
        specs = [StageSpec(i, r, list(d), False) for i, (r, d, _) in enumerate(cand.stages)]
        if overflows_memory(self.profile, self.topology, specs, cand.schedule):
            return math.inf  # fits with no recompute: never beats a plan that fits
        m, mb = cand.num_microbatches, cand.microbatch_size
        bound = search_bound_ms(self.profile, self.topology, specs, cand.schedule, m, mb)
        return bound / cand.samples

    def cannot_beat(self, cand: Candidate, best: Scored) -> bool:
        """Whether ``cand``'s bound shows it slower than ``best`` (which fits) by more than
        :meth:`Scored.key` rounds away, so it could never replace it; such a candidate is
        remembered, not simulated."""
        if not best.fits or cand in self.cache:
            return False
        bound = self.bound_per_sample(cand)
        if round(bound, 9) > round(best.per_sample_ms, 9):
            self.bounded[cand] = bound
            return True
        return False

    def evaluate(self, cand: Candidate, origin: str) -> Scored:
        """Simulate ``cand``, then settle its recompute flags by the simulator's memory:
        switch recompute on where a device overflows, off where it is not needed."""
        hit = self.cache.get(cand)
        if hit is not None:
            return hit
        scored = self._simulate(cand, origin)
        if not scored.fits and scored.result is not None:
            over = {d for d, b in scored.memory.items() if b > self.topology.device(d).memory_bytes}
            flags = [rc or any(d in over for d in devs) for _, devs, rc in cand.stages]
            retry = self._simulate(_with_recompute(cand, flags), origin)
            if retry.key() < scored.key():
                scored = retry
        if scored.fits:
            for k, (_, _, rc) in enumerate(scored.cand.stages):
                if rc:
                    flags = [f for _, _, f in scored.cand.stages]
                    flags[k] = False
                    retry = self._simulate(_with_recompute(scored.cand, flags), origin)
                    if retry.key() < scored.key():
                        scored = retry
        self.cache[cand] = scored
        return scored

    def _simulate(self, cand: Candidate, origin: str) -> Scored:
        hit = self.cache.get(cand)
        if hit is not None:
            return hit
        from planner.simulate import simulate

        self.sims += 1
        opts: dict[str, Any] = {"events": False}
        if cand.virtual_stages > 1:
            opts["virtual_stages"] = cand.virtual_stages
        try:
            res = simulate(
                self.profile,
                self.topology,
                cand.specs(),
                schedule=cand.schedule,
                num_microbatches=cand.num_microbatches,
                microbatch_size=cand.microbatch_size,
                **opts,
            )
        except InputError:
            # A schedule that cannot run this shape (e.g. interleaved with too few
            # microbatches) is simply not a candidate.
            scored = Scored(cand, math.inf, False, {}, None, origin)
            self.cache[cand] = scored
            return scored
        memory = {d: int(b) for d, b in res.memory_bytes.items()}
        fits = all(b <= self.topology.device(d).memory_bytes for d, b in memory.items())
        scored = Scored(cand, float(res.iteration_ms), fits, memory, res, origin)
        self.cache[cand] = scored
        return scored


def _with_recompute(cand: Candidate, flags: Sequence[bool]) -> Candidate:
    stages = tuple((r, d, bool(f)) for (r, d, _), f in zip(cand.stages, flags, strict=True))
    return Candidate(
        stages, cand.schedule, cand.microbatch_size, cand.num_microbatches, cand.virtual_stages
    )


def _in_flight(
    schedule: str, num_stages: int, stage: int, m: int, virtual: int = 1, rounds: int = 1
) -> int:
    """Microbatches stage ``stage`` of ``num_stages`` keeps stashed over its replicas (per
    chunk when interleaved: the device's count spread over its ``virtual`` chunks);
    ``rounds`` as :func:`planner.schedule.replicas.replica_round` gives it."""
    from planner.schedule import in_flight_microbatches

    if virtual > 1:
        p = num_stages // virtual
        total = in_flight_microbatches(
            schedule, p, stage % p, m, virtual_stages=virtual, rounds=rounds
        )
        return -(-int(total) // virtual)
    return int(in_flight_microbatches(schedule, num_stages, stage, m, rounds=rounds))


def _weight_versions(schedule: str) -> int:
    return family(schedule).weight_versions


def _fix_recompute(
    profile: Profile,
    topology: Topology,
    ranges: Sequence[tuple[int, int]],
    devices: Sequence[Sequence[str]],
    schedule: str,
    mb: int,
    m: int,
    virtual: int = 1,
) -> tuple[bool, ...]:
    """Recompute exactly the stages whose activations do not fit (recompute is never faster)."""
    from planner.schedule.replicas import replica_round

    s = len(ranges)
    rounds = replica_round([len(d) for d in devices], m)
    flags = []
    for k, ((a, b), devs) in enumerate(zip(ranges, devices, strict=True)):
        limit = min(topology.device(d).memory_bytes for d in devs) / virtual
        held = -(-_in_flight(schedule, s, k, m, virtual, rounds) // len(devs))
        mem = stage_memory_bytes(
            profile, a, b, mb, held, weight_versions=_weight_versions(schedule)
        )
        flags.append(mem > limit)
    return tuple(flags)


def _make(
    search: _Search,
    ranges: Sequence[tuple[int, int]],
    devices: Sequence[Sequence[str]],
    schedule: str,
    mb: int,
    m: int,
    recompute: Sequence[bool] | None = None,
    virtual: int = 1,
) -> Candidate:
    if recompute is None:
        recompute = _fix_recompute(
            search.profile, search.topology, ranges, devices, schedule, mb, m, virtual
        )
    # Replicas keep the order they were chosen in: the all-reduce ring follows it.
    stages = tuple(
        ((int(a), int(b)), tuple(d), bool(rc))
        for (a, b), d, rc in zip(ranges, devices, recompute, strict=True)
    )
    return Candidate(stages, schedule, mb, m, virtual)


# ----------------------------------------------------------------------------- settings


def _batch_settings(
    profile: Profile,
    global_batch: int | None,
    microbatches: int | None,
    num_devices: int,
) -> list[tuple[int, int]]:
    """(microbatch size, number of microbatches) pairs to search."""
    sizes = profile.microbatch_sizes
    if global_batch is not None and microbatches is not None:
        if global_batch % microbatches:
            raise InputError(
                f"global batch {global_batch} is not divisible by {microbatches} microbatches",
                field="--global-batch",
            )
        mb = global_batch // microbatches
        if mb not in sizes:
            raise InputError(
                f"global batch {global_batch} / {microbatches} microbatches = microbatch size "
                f"{mb}, which was not profiled; profiled sizes are {sizes}",
                field="--microbatches",
            )
        return [(mb, microbatches)]
    if global_batch is not None:
        pairs = [(mb, global_batch // mb) for mb in sizes if global_batch % mb == 0]
        if not pairs:
            raise InputError(
                f"global batch {global_batch} is not divisible by any profiled microbatch "
                f"size {sizes}; choose a multiple of one of them",
                field="--global-batch",
            )
        return pairs
    m = microbatches if microbatches is not None else max(4, 2 * num_devices)
    return [(mb, m) for mb in sizes]


def _check_args(
    topology: Topology,
    global_batch: int | None,
    microbatches: int | None,
    schedule: str,
    time_limit: float,
) -> None:
    if not topology.devices:
        raise InputError("the topology has no devices", field="devices")
    if not time_limit > 0:
        raise InputError(
            f"expected a positive number of seconds, got {time_limit}", field="--time-limit"
        )
    for name, value in (("--global-batch", global_batch), ("--microbatches", microbatches)):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise InputError(f"expected a positive integer, got {value}", field=name)
    if schedule not in SCHEDULE_CHOICES:
        raise InputError(
            f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULE_CHOICES)}",
            field="--schedule",
        )


# --------------------------------------------------------------------------- exhaustive


def _device_groupings(names: Sequence[str], s: int) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every sequence of ``s`` disjoint non-empty device lists. The order inside a list
    matters too: replica ``k % r`` runs microbatch ``k`` and the all-reduce ring follows it."""
    for k in range(s, len(names) + 1):
        for order in itertools.permutations(names, k):
            for cuts in itertools.combinations(range(1, k), s - 1):
                bounds = [0, *cuts, k]
                yield tuple(tuple(order[bounds[i] : bounds[i + 1]]) for i in range(s))


def _partitions(n: int, s: int) -> Iterator[list[tuple[int, int]]]:
    for cuts in itertools.combinations(range(n - 1), s - 1):
        bounds = [-1, *cuts, n - 1]
        yield [(bounds[k] + 1, bounds[k + 1]) for k in range(s)]


def exhaustive_size(num_layers: int, num_devices: int) -> int:
    """How many (partition, device lists) pairs the exhaustive search would simulate.

    Example::

        exhaustive_size(6, 3)   # 165
    """
    total = 0
    for s in range(1, min(num_layers, num_devices) + 1):
        parts = math.comb(num_layers - 1, s - 1)
        # Choose and order k devices, then cut the sequence into s non-empty lists.
        maps = sum(
            math.perm(num_devices, k) * math.comb(k - 1, s - 1) for k in range(s, num_devices + 1)
        )
        total += parts * maps
    return total


def _exhaustive(
    search: _Search, schedules: Sequence[str], settings: Sequence[tuple[int, int]]
) -> list[Scored]:
    names = search.topology.device_names()
    n = search.profile.num_layers
    out = []
    for mb, m in settings:
        for sched in schedules:
            if sched == "interleaved":
                continue
            for s in range(1, min(n, len(names)) + 1):
                for ranges in _partitions(n, s):
                    for groups in _device_groupings(names, s):
                        cand = _make(search, ranges, groups, sched, mb, m)
                        out.append(search.evaluate(cand, "exhaustive"))
    return out


# --------------------------------------------------------------------------- candidates


def _stage_counts(max_stages: int, num_layers: int) -> list[int]:
    """Numbers of stages worth trying: all up to 8, then powers of two and the maximum."""
    top = min(max_stages, num_layers)
    counts = set(range(1, min(top, 8) + 1))
    p = 16
    while p < top:
        counts.add(p)
        p *= 2
    counts.add(top)
    for extra in (top * 3 // 4, top // 2 + 1):
        if extra >= 1:
            counts.add(extra)
    return sorted(counts)


def _replication_degrees(num_devices: int) -> list[int]:
    degrees = {r for r in range(1, num_devices + 1) if num_devices % r == 0}
    degrees |= {r for r in (2, 3, 4) if r <= num_devices}
    return sorted(degrees)


@dataclass(frozen=True)
class _DpCand:
    estimate: float
    ranges: tuple[tuple[int, int], ...]
    groups: tuple[tuple[str, ...], ...]
    recompute: tuple[bool, ...]


def _depth_only(schedule: str, top: int, m: int, rounds: int = 1) -> list[int] | None:
    """The in-flight count by distance from the last stage, if that is all it depends on."""
    from_end = [_in_flight(schedule, top, top - 1 - q, m, rounds=rounds) for q in range(top)]
    for s in range(1, top):
        if any(
            _in_flight(schedule, s, s - 1 - q, m, rounds=rounds) != from_end[q] for q in range(s)
        ):
            return None
    return from_end


def _dp_partitions(
    costs: LayerCosts,
    slots: Sequence[Slot],
    links: Sequence[Linear],
    schedule: str,
    m: int,
) -> Iterator[tuple[int, ChainPartition]]:
    """The DP's best partition for each number of stages worth trying on these slots."""
    n = costs.num_layers
    counts = _stage_counts(len(slots), n)
    wv = _weight_versions(schedule)
    kind = [(sl.speed, sl.memory_bytes, sl.replicas, sl.allreduce) for sl in slots]
    same = all(k == kind[0] for k in kind) and all(lk == links[0] for lk in links)
    from planner.schedule.replicas import replica_round

    rounds = replica_round([sl.replicas for sl in slots], m)
    from_end = _depth_only(schedule, min(len(slots), n), m, rounds) if same else None
    if from_end is not None:
        # Identical slots and links: one backward DP answers every number of stages.
        parts = partition_chain_depths(
            costs,
            slots[0],
            max_stages=len(from_end),
            in_flight_from_end=from_end,
            num_microbatches=m,
            link=links[0] if links else None,
            weight_versions=wv,
        )
        for s in counts:
            got = parts[s - 1]
            if got is not None:
                yield s, got
        return
    # One DP per number of stages costs O(S * L^2): on long paths try fewer, spread out.
    limit = _MAX_FRONT_DPS if len(slots) <= 16 else 3
    if len(counts) > limit:
        step = len(counts) / limit
        counts = sorted({counts[int(i * step)] for i in range(limit)} | {counts[-1]})
    for s in counts:
        in_flight = [_in_flight(schedule, s, k, m, rounds=rounds) for k in range(s)]
        part = partition_chain(
            costs,
            slots[:s],
            in_flight=in_flight,
            num_microbatches=m,
            links=links[: s - 1],
            weight_versions=wv,
        )
        if part is not None:
            yield s, part


def _dp_candidates(
    search: _Search,
    costs: LayerCosts,
    paths: Sequence[Sequence[str]],
    schedule: str,
    m: int,
) -> list[_DpCand]:
    """DP partitions over every candidate device path and replication degree, best
    estimated iteration time first."""
    topo = search.topology
    found: dict[tuple[Any, ...], _DpCand] = {}
    for path in paths:
        for r in _replication_degrees(len(path)):
            if r > m:
                continue
            all_slots = slots_along(topo, path, replicas=r)
            if not all_slots:
                continue
            all_links = links_between(topo, all_slots)
            for s, part in _dp_partitions(costs, all_slots, all_links, schedule, m):
                # Steady state at the bottleneck plus one pass of fill and drain; each
                # replica sees m / r microbatches of r times the per-slot cost.
                est = (m - r) * part.bottleneck_ms + r * sum(part.stage_ms)
                groups = tuple(sl.devices for sl in all_slots[:s])
                key = (tuple(part.ranges), groups)
                cand = _DpCand(est, tuple(part.ranges), groups, tuple(part.recompute))
                if key not in found or found[key].estimate > est:
                    found[key] = cand
    return sorted(found.values(), key=lambda c: (c.estimate, c.ranges, c.groups))


def _grid_shapes(
    search: _Search, cands: Sequence[_DpCand], schedule: str, mb: int, m: int
) -> list[Candidate]:
    """The sweep a practitioner runs, with the DP's partitions: for every pipeline depth
    ``d`` and ``N / d`` replicas per stage that use all ``N`` devices, the DP's best
    estimate over the device orderings tried, and its compute-only split (:func:`_recut`)."""
    total = len(search.topology.devices)
    seen: set[tuple[int, int]] = set()
    out: list[Candidate] = []
    for c in cands:  # best estimate first
        shape = (len(c.groups), len(c.groups[0]))
        if shape[0] * shape[1] != total or shape in seen:
            continue
        if any(len(g) != shape[1] for g in c.groups):
            continue
        seen.add(shape)
        out.append(_make(search, c.ranges, c.groups, schedule, mb, m, recompute=c.recompute))
        out.extend(_recut(search, c.groups, schedule, mb, m, full=False))
    return out


def _grid_interleaved(
    search: _Search, grid: Sequence[Candidate], scored: Sequence[Scored]
) -> list[Candidate]:
    """Interleaved re-cuts of the grid's 1F1B pipelines whose busiest device (compute,
    all-reduce, step) could still beat the best plan found, the most promising
    :data:`_INTERLEAVED_SEEDS` first: by the busy time plus the fill and drain
    (:func:`planner.partition.bounds.pipeline_bound_ms`) shrunk by the most chunks per
    device the layers allow, as interleaving shrinks it."""
    from planner.partition.bounds import busy_bound_ms, pipeline_bound_ms

    best = min((x.per_sample_ms for x in scored if x.fits), default=math.inf)
    n = search.profile.num_layers
    ranked = []
    for i, c in enumerate(grid):
        p = len(c.stages)
        if c.schedule != "1f1b" or p < 2 or n < 2 * p:
            continue
        args = (search.profile, search.topology, c.specs(), c.num_microbatches, c.microbatch_size)
        busy = busy_bound_ms(*args)
        if busy / c.samples >= best:
            continue
        v = max(x for x in _VIRTUAL if x * p <= n)
        drain = max(pipeline_bound_ms(*args) - busy, 0.0)
        ranked.append(((busy + drain / v) / c.samples, i, c))
    ranked.sort(key=lambda x: (x[0], x[1]))
    scale = len(search.topology.devices) * max((c.num_microbatches for c in grid), default=1)
    count = _INTERLEAVED_SEEDS if scale <= 2048 else _INTERLEAVED_SEEDS // 2
    out: list[Candidate] = []
    for _, _, c in ranked[:count]:
        out.extend(_interleaved(search, c))
    return out


def _by_bound(
    search: _Search,
    cands: Sequence[Candidate],
    scored: Sequence[Scored],
    origin: str,
    keep: int = 1,
) -> list[Scored]:
    """Simulate ``cands`` in the order of a lower bound of their time per sample
    (:func:`planner.partition.bounds.search_bound_ms`) while the bound can still beat the
    ``keep``-th best distinct plan found so far (local search starts from the best
    ``keep``); the rest cannot be among them, so leaving them out loses nothing, and the
    local search starts from the same plans however tight the bound."""
    from planner.partition.bounds import search_bound_ms

    best: dict[tuple[Any, ...], float] = {}  # per distinct plan, as _distinct_starts
    for x in scored:
        if x.fits:
            _note_time(best, x)
    ranked = []
    for i, c in enumerate(dict.fromkeys(cands)):
        bound = search_bound_ms(
            search.profile,
            search.topology,
            c.specs(),
            c.schedule,
            c.num_microbatches,
            c.microbatch_size,
        )
        ranked.append((bound / c.samples, i, c))
    ranked.sort(key=lambda x: (x[0], x[1]))
    out = []
    for bound, _, c in ranked:
        times = sorted(best.values())
        if len(times) >= keep and bound >= times[keep - 1]:
            break
        got = search.evaluate(c, origin)
        out.append(got)
        if got.fits:
            _note_time(best, got)
    return out


def _note_time(best: dict[tuple[Any, ...], float], x: Scored) -> None:
    shape = tuple((r, d) for r, d, _ in x.cand.stages)
    best[shape] = min(best.get(shape, math.inf), x.per_sample_ms)


def _ilp_candidate(
    search: _Search,
    costs: LayerCosts,
    schedule: str,
    m: int,
    warm: _DpCand | None,
    num_stages: int,
    time_limit: float,
) -> tuple[list[tuple[int, int]], list[str], list[bool]] | None:
    from planner.partition.ilp import solve_ilp

    in_flight = [_in_flight(schedule, num_stages, k, m) for k in range(num_stages)]
    warm_start = None
    if warm is not None and all(len(g) == 1 for g in warm.groups):
        warm_start = (list(warm.ranges), [g[0] for g in warm.groups], list(warm.recompute))
    res = solve_ilp(
        costs,
        search.topology,
        num_stages=num_stages,
        in_flight=in_flight,
        num_microbatches=m,
        weight_versions=_weight_versions(schedule),
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


def baseline_partitions(
    profile: Profile, topology: Topology, microbatch_size: int
) -> list[tuple[str, list[tuple[int, int]], list[int]]]:
    """``(name, ranges, replicas per stage)`` of every peer default, for ``min(layers,
    devices)`` stages (PipeDream chooses its own stages and replicas). Those whose own
    algorithm gives no partition here are left out; :func:`baseline_outcomes` says why.

    Example::

        for name, ranges, replicas in baseline_partitions(profile, topology, 4): ...
    """
    return [
        (name, ranges, replicas)
        for name, ranges, replicas, _ in baseline_outcomes(profile, topology, microbatch_size)
        if ranges
    ]


def baseline_outcomes(
    profile: Profile, topology: Topology, microbatch_size: int
) -> list[tuple[str, list[tuple[int, int]], list[int], str | None]]:
    """Every peer default as ``(name, ranges, replicas, reason)``
    (:func:`planner.partition.peers.default_outcomes`).

    Example::

        for name, ranges, replicas, reason in baseline_outcomes(profile, topology, 4): ...
    """
    from planner.partition.peers import default_outcomes

    return default_outcomes(profile, topology, microbatch_size)


def _baseline_candidates(
    search: _Search, schedule: str, mb: int, m: int, judge: PeerJudge
) -> list[tuple[str, Candidate | str]]:
    """The baselines' partitions placed in device order (one device per stage, or
    PipeDream's replicas on consecutive devices); recompute where memory needs it. A
    baseline whose algorithm fails comes back as the reason instead of a candidate.
    (``judge``: the tuned peers', whose PipeDream stages the defaults reuse.)"""
    from planner.partition.peers import default_outcomes

    names = search.topology.device_names()
    out: list[tuple[str, Candidate | str]] = []
    outcomes = default_outcomes(search.profile, search.topology, mb, judge=judge)
    for label, ranges, replicas, reason in outcomes:
        if reason is not None:
            out.append((label, reason))
            continue
        groups = []
        pos = 0
        for r in replicas:
            groups.append(tuple(names[pos : pos + r]))
            pos += r
        if pos > len(names):
            continue
        out.append((label, _make(search, ranges, groups, schedule, mb, m)))
    return out


# ---------------------------------------------------------------------------------- peers


@dataclass
class _PeerReport:
    """The tuned peers (their best configurations) and the peer defaults, simulated."""

    tuned: list[PeerBest]
    defaults: dict[str, Scored]
    failed: dict[str, str]  # defaults whose own algorithm gives no partition


def _peer_report(
    search: _Search, settings: Sequence[tuple[int, int]], schedule: str
) -> _PeerReport:
    """Each peer tuned over its sweep (with the user's schedule where one is given), and the
    peer defaults: one stage per device in device order (PipeDream: its replicas), 1F1B or
    the requested schedule, recompute where memory needs it, the best microbatch size."""
    from planner.partition.peers import PeerConfig, tune_peers

    override = None if schedule == "auto" else (schedule,)

    def simulate_peer(config: PeerConfig) -> tuple[float, bool]:
        # Through the search's own cache: a shape both simulate is simulated once.
        stages = tuple((r, devs, config.recompute) for r, devs in config.stages)
        cand = Candidate(
            stages,
            config.schedule,
            config.microbatch_size,
            config.num_microbatches,
            config.virtual_stages,
        )
        got = search._simulate(cand, f"peer {config.peer}")
        return got.iteration_ms, got.fits

    judge = PeerJudge(search.profile, search.topology, simulator=simulate_peer)
    tuned = tune_peers(search.profile, search.topology, settings, schedules=override, judge=judge)
    base_sched = "1f1b" if schedule in ("auto", "interleaved") else schedule
    defaults: dict[str, Scored] = {}
    failed: dict[str, str] = {}
    for mb, m in settings:
        for label, cand in _baseline_candidates(search, base_sched, mb, m, judge):
            if isinstance(cand, str):
                failed.setdefault(label, cand)
                continue
            got = search.evaluate(cand, f"peer default {label}")
            if label not in defaults or got.key() < defaults[label].key():
                defaults[label] = got
    return _PeerReport(tuned, defaults, failed)


def _seeded_by_peers(
    search: _Search, peers: _PeerReport, own: Sequence[Scored], schedules: Sequence[str]
) -> list[Scored]:
    """The peers' best plans as candidates (never worse than a configuration a peer's
    user would pick); where one beats the search's own, local search improves it."""
    seeds = list(peers.defaults.values())
    for best in peers.tuned:
        if best.best is None or not best.feasible:
            continue
        c = best.best.config
        stages = tuple((r, devs, c.recompute) for r, devs in c.stages)
        m, v = c.num_microbatches, c.virtual_stages
        cand = Candidate(stages, c.schedule, c.microbatch_size, m, v)
        seeds.append(search.evaluate(cand, f"peer {best.peer}"))
    seeds = [x for x in seeds if x.cand.schedule in schedules and x.fits]
    mine = [x for x in own if x.fits]
    if not seeds:
        return []
    top = min(seeds, key=Scored.key)
    if mine and min(mine, key=Scored.key).key()[:3] <= top.key()[:3]:
        return seeds
    search.methods.append("peer seed")
    budget = _local_budget(search.options.local_search_evals, top)
    return [*seeds, _local_search(search, top, budget)]


def _peer_rows(peers: _PeerReport | None, samples: int) -> list[Baseline]:
    """The plan's ``baselines``: each tuned peer's best configuration, then the peer
    defaults; times scaled to the plan's samples per iteration (like for like)."""
    if peers is None:
        return []
    rows: list[Baseline] = []
    for best in peers.tuned:
        if best.best is None or not best.feasible:
            rows.append(
                Baseline(
                    best.peer,
                    None,
                    False,
                    kind="tuned peer",
                    reason=best.describe(),
                    configurations=best.configurations,
                    simulations=best.simulations,
                )
            )
            continue
        c = best.best.config
        rows.append(
            Baseline(
                best.peer,
                best.per_sample_ms * samples,
                True,
                kind="tuned peer",
                configuration=c.describe(),
                partition=c.partition,
                depth=c.depth,
                data_parallel=c.data_parallel,
                microbatch_size=c.microbatch_size,
                num_microbatches=c.num_microbatches,
                schedule=c.schedule,
                virtual_stages=c.virtual_stages,
                recompute=c.recompute,
                configurations=best.configurations,
                simulations=best.simulations,
            )
        )
    failed = {k: v for k, v in peers.failed.items() if k not in peers.defaults}
    for label in sorted([*peers.defaults, *failed]):
        name = f"{label} (peer default)"
        if label not in peers.defaults:
            # The peer's own algorithm gives no partition (e.g. torchgpipe on zero-time
            # layers): an infeasible row that says why, rather than a failed solve.
            rows.append(Baseline(name, None, False, kind="peer default", reason=failed[label]))
            continue
        b = peers.defaults[label]
        ms = b.per_sample_ms * samples if math.isfinite(b.iteration_ms) else None
        rows.append(Baseline(name, ms, b.fits, kind="peer default"))
    return rows


# --------------------------------------------------------------------------- local search


def _neighbours(
    cand: Candidate, names: Sequence[str], n: int
) -> Iterator[tuple[list[tuple[int, int]], list[tuple[str, ...]]]]:
    ranges = [r for r, _, _ in cand.stages]
    groups = [d for _, d, _ in cand.stages]
    s = len(ranges)
    # Move one cut by one or two layers.
    for k in range(s - 1):
        for delta in (-1, 1, -2, 2):
            cut = ranges[k][1] + delta
            if ranges[k][0] <= cut < ranges[k + 1][1]:
                new = list(ranges)
                new[k] = (ranges[k][0], cut)
                new[k + 1] = (cut + 1, ranges[k + 1][1])
                yield new, list(groups)
    if cand.virtual_stages > 1:
        return
    # Swap the devices of two stages.
    for i in range(s):
        for j in range(i + 1, s):
            g = list(groups)
            g[i], g[j] = g[j], g[i]
            yield list(ranges), g
    # Move a stage onto an unused device, or give it one more replica.
    used = {d for g in groups for d in g}
    free = [d for d in names if d not in used]
    for i in range(s):
        for d in free:
            if len(groups[i]) == 1:
                g = list(groups)
                g[i] = (d,)
                yield list(ranges), g
            g = list(groups)
            g[i] = (*groups[i], d)
            yield list(ranges), g
    # Reorder a stage's replicas (who runs which microbatch, the ring's order).
    for i in range(s):
        g0 = groups[i]
        if len(g0) > 1:
            for a in range(len(g0) - 1):  # neighbours in the ring: r - 1 moves, not r^2
                order = list(g0)
                order[a], order[a + 1] = order[a + 1], order[a]
                g = list(groups)
                g[i] = tuple(order)
                yield list(ranges), g
    # Move one replica to another stage (for neighbours, with the cut between them moved
    # by a layer either way: more devices usually want more layers).
    for i in range(s):
        if len(groups[i]) < 2:
            continue
        for x in groups[i]:
            for j in range(s):
                if j == i:
                    continue
                g = list(groups)
                g[i] = tuple(y for y in groups[i] if y != x)
                g[j] = (*groups[j], x)
                yield list(ranges), g
                if abs(i - j) == 1:
                    k = min(i, j)
                    for delta in (-1, 1, -2, 2):
                        cut = ranges[k][1] + delta
                        if ranges[k][0] <= cut < ranges[k + 1][1]:
                            new = list(ranges)
                            new[k] = (ranges[k][0], cut)
                            new[k + 1] = (cut + 1, ranges[k + 1][1])
                            yield new, list(g)
    # Split a stage in two onto a free device; merge two neighbours.
    if free:
        for i in range(s):
            a, b = ranges[i]
            if a < b and len(groups[i]) == 1:
                mid = (a + b) // 2
                new = ranges[:i] + [(a, mid), (mid + 1, b)] + ranges[i + 1 :]
                yield new, groups[: i + 1] + [(free[0],)] + groups[i + 1 :]
    for i in range(s - 1):
        new = ranges[:i] + [(ranges[i][0], ranges[i + 1][1])] + ranges[i + 2 :]
        yield new, groups[: i + 1] + groups[i + 2 :]


def _distinct_starts(scored: Sequence[Scored], count: int) -> list[Scored]:
    """The best ``count`` feasible plans with different partitions or device groups."""
    out: list[Scored] = []
    seen: set[tuple[Any, ...]] = set()
    for x in sorted(scored, key=Scored.key):
        if not x.fits:
            break
        shape = tuple((r, d) for r, d, _ in x.cand.stages)
        if shape in seen:
            continue
        seen.add(shape)
        out.append(x)
        if len(out) == count:
            break
    return out


def _local_search(search: _Search, start: Scored, budget: int) -> Scored:
    """First-improvement descent over :func:`_neighbours` from ``start``, for ``budget``
    new neighbours. A neighbour whose bound cannot beat the current best is counted but
    not simulated (:meth:`_Search.cannot_beat`): simulated it would not have been taken,
    so the descent is the same, for fewer simulations.

    Example::

        better = _local_search(search, start, 24)
    """
    best = start
    names = search.topology.device_names()
    n = search.profile.num_layers
    spent = 0
    improved = True
    while improved and spent < budget:
        improved = False
        for ranges, groups in _neighbours(best.cand, names, n):
            if spent >= budget:
                break
            c = best.cand
            cand = _make(
                search,
                ranges,
                groups,
                c.schedule,
                c.microbatch_size,
                c.num_microbatches,
                virtual=c.virtual_stages,
            )
            if cand in search.cache:
                scored = search.cache[cand]
            else:
                # A candidate met before costs nothing (as when it was simulated then).
                spent += cand not in search.bounded
                if search.cannot_beat(cand, best):
                    continue
                scored = search.evaluate(cand, "local search")
            # Strictly better (fit, time, devices): ties on the plan itself are no progress.
            if scored.key()[:3] < best.key()[:3]:
                best = scored
                improved = True
                break
    return best


# --------------------------------------------------------------------------- the search


def _lower_bound_ms(profile: Profile, topology: Topology, mb: int, m: int) -> float:
    """No plan beats every device computing an equal share of the work, never idle."""
    f, b = stage_compute_ms(profile, 0, profile.num_layers - 1, mb)
    total_speed = sum(d.speed for d in topology.devices)
    return m * (f + b) / total_speed


def _interleaved(search: _Search, c: Candidate) -> list[Candidate]:
    """Interleaved versions of a plan whose stages have equally many replicas: its stages'
    device groups in order, each holding ``v`` chunks (``v`` in :data:`_VIRTUAL`), the
    layers re-cut by the DP over the ``v * p`` chunks (with its all-reduce term and
    without it: see :func:`_recut`)."""
    sizes = {len(d) for _, d, _ in c.stages}
    if len(sizes) != 1 or c.virtual_stages > 1:
        return []
    (r,) = sizes
    p = len(c.stages)
    n = search.profile.num_layers
    m = c.num_microbatches
    if p < 2 or m % p or (m // r) % p:
        return []
    groups = [d for _, d, _ in c.stages]
    out = []
    for v in _VIRTUAL:
        if n < v * p:
            break
        out.extend(_recut(search, groups * v, "interleaved", c.microbatch_size, m, v))
    return out


def _recut(
    search: _Search,
    groups: Sequence[tuple[str, ...]],
    schedule: str,
    mb: int,
    m: int,
    virtual: int = 1,
    *,
    full: bool = True,
) -> list[Candidate]:
    """:func:`_cut_over` once per search for each set of arguments (a copy of the list).

    Example::

        _recut(search, [("gpu0",), ("gpu1",)], "1f1b", 4, 8)
    """
    key = (tuple(groups), schedule, mb, m, virtual, full)
    hit = search.recuts.get(key)
    if hit is None:
        hit = search.recuts[key] = _cut_over(search, groups, schedule, mb, m, virtual, full=full)
    return list(hit)


def _cut_over(
    search: _Search,
    groups: Sequence[tuple[str, ...]],
    schedule: str,
    mb: int,
    m: int,
    virtual: int = 1,
    *,
    full: bool = True,
) -> list[Candidate]:
    """The DP's partitions of all layers over these stage groups (``virtual`` chunks per
    group), twice: with the DP's full model (compute, a per-microbatch share of each
    stage's all-reduce, the transfer to the next group), and with compute alone. In the
    simulator a stage's all-reduce runs once, after its last backward, so it adds to the
    drain rather than to every microbatch, and the replicas' transfers run side by side
    and overlap compute; on many replicas the full model skews the split towards cheap
    all-reduces and cuts, which the compute-only split does not. ``full=False``: only the
    compute-only split (the caller has the other). Plus the equal-layer split."""
    r = len(groups[0])
    path = [d for g in groups for d in g]
    slots = slots_along(search.topology, path, replicas=r)
    slots = [
        type(sl)(sl.devices, sl.speed, sl.memory_bytes / virtual, sl.allreduce) for sl in slots
    ]
    bare = [type(sl)(sl.devices, sl.speed, sl.memory_bytes) for sl in slots]
    variants = [slots, bare] if full else [bare]
    k = len(slots)
    in_flight = [_in_flight(schedule, k, i, m, virtual, r) for i in range(k)]
    costs = layer_costs(search.profile, mb)
    out: list[Candidate] = []
    if len(slots) <= search.profile.num_layers:
        # Equal layer counts: on uniform layers the DP's ties (where the light chunks go)
        # matter to the schedule, and the even split is a tie the DP may not pick.
        from planner.partition.baselines import uniform_partition

        even = uniform_partition(search.profile.num_layers, len(slots))
        out.append(_make(search, even, groups, schedule, mb, m, virtual=virtual))
    for variant in variants:
        part = partition_chain(
            costs,
            variant,
            in_flight=in_flight,
            num_microbatches=m,
            links=links_between(search.topology, variant) if variant is slots else None,
            weight_versions=_weight_versions(schedule),
        )
        if part is None:
            continue
        cand = _make(
            search, part.ranges, groups, schedule, mb, m, recompute=part.recompute, virtual=virtual
        )
        if cand not in out:
            out.append(cand)
    return out


def _size(nbytes: float) -> str:
    from planner.units import format_bytes

    return f"{format_bytes(nbytes)} ({int(nbytes)} bytes)"


def _infeasible(
    profile: Profile, topology: Topology, settings: Sequence[tuple[int, int]]
) -> InfeasibleError:
    """Explain why nothing fits: a layer too big for every device, or the memory needed."""
    largest = max(d.memory_bytes for d in topology.devices)
    mb = min(m for m, _ in settings)
    sizes = [
        (stage_memory_bytes(profile, i, i, mb, 1, recompute=True), i)
        for i in range(profile.num_layers)
    ]
    need, worst = max(sizes)
    if need > largest:
        return InfeasibleError(
            f"layer {worst} ({profile.layers[worst].name}) alone needs {_size(need)} at "
            f"microbatch size {mb} even with recompute, more than the largest device "
            f"({_size(largest)}); hint: use devices with more memory or profile a smaller "
            "microbatch size",
            field="memory",
        )
    # Smallest per-device memory with which the DP finds a plan on all devices.
    costs = layer_costs(profile, mb)
    m = min(m for s, m in settings if s == mb)
    path = topology.device_names()
    s = min(len(path), profile.num_layers)
    in_flight = [_in_flight("1f1b", s, k, m) for k in range(s)]
    lo, hi = float(need), float(stage_memory_bytes(profile, 0, profile.num_layers - 1, mb, m))
    for _ in range(60):
        mid = (lo + hi) / 2
        slots = [Slot((d,), 1.0, mid) for d in path[:s]]
        if partition_chain(costs, slots, in_flight=in_flight, num_microbatches=m) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo < 2**20:
            break
    return InfeasibleError(
        f"no plan fits in memory: the largest device has {_size(largest)} but the best "
        f"partition over {s} devices needs about {_size(hi)} per device (microbatch size "
        f"{mb}, recompute where needed); hint: add devices or memory, or profile a smaller "
        "microbatch size",
        field="memory",
    )


def _file_ref(path: str | None, obj: Any) -> FileRef:
    """The input as the plan records it: its file, or the object itself when unsaved."""
    return FileRef.of_file(path) if path is not None else FileRef.in_memory(obj)


def solve(
    profile: Profile | str | os.PathLike[str],
    topology: Topology | str | os.PathLike[str],
    *,
    global_batch: int | None = None,
    microbatches: int | None = None,
    num_microbatches: int | None = None,
    schedule: str = "auto",
    time_limit: float = 60.0,
    profile_path: str | None = None,
    topology_path: str | None = None,
    options: SolveOptions | None = None,
) -> Plan:
    """The fastest plan (by the simulator) whose every device fits in its memory.

    ``global_batch`` fixes the samples per iteration (the microbatch size is searched over
    the profiled sizes that divide it); ``microbatches`` fixes the number of microbatches
    (the size is searched, the objective is then time per sample; ``num_microbatches`` is
    the same, spelled as ``simulate`` spells it); neither: ``2 x devices``
    microbatches. ``time_limit`` bounds the ILP. Raises :class:`InfeasibleError` with the
    memory that would be needed when nothing fits.

    Example::

        plan = solve(load_profile("profiles/mlp.json"), load_topology("topologies/nvlink.yaml"),
                     global_batch=64, schedule="auto", time_limit=10)
        plan = solve("profiles/mlp.json", "topologies/nvlink.yaml", microbatches=8)
        plan.save("plan.json")
    """
    clock = time.perf_counter()
    if isinstance(profile, str | os.PathLike):
        profile_path = profile_path or str(profile)
    if isinstance(topology, str | os.PathLike):
        topology_path = topology_path or str(topology)
    profile, topology = as_profile(profile), as_topology(topology)
    if num_microbatches is not None:
        if microbatches is not None and microbatches != num_microbatches:
            raise InputError(
                "give microbatches or num_microbatches (the same thing), not both",
                field="num_microbatches",
            )
        microbatches = num_microbatches
    opts = options or SolveOptions()
    _check_args(topology, global_batch, microbatches, schedule, time_limit)
    settings = _batch_settings(profile, global_batch, microbatches, len(topology.devices))
    schedules = list(_AUTO) if schedule == "auto" else [schedule]
    search = _Search(profile, topology, opts, time_limit)
    own = _own_search(search, settings, schedules, clock)
    final = [x for x in own if x.cand.schedule in schedules]
    peers: _PeerReport | None = None
    if opts.baselines:
        peers = _peer_report(search, settings, schedule)
        final.extend(_seeded_by_peers(search, peers, final, schedules))
    if not final or not min(final, key=Scored.key).fits:
        if not any(x.fits for x in own):
            raise _infeasible(profile, topology, settings)
        raise InfeasibleError(
            f"no {schedule} plan fits: the interleaved schedule needs a stage per device "
            "with at least 2 layers per device and a number of microbatches that is a "
            "multiple of the pipeline's devices; try --schedule 1f1b or other --microbatches",
            field="--schedule",
        )
    best = min(final, key=Scored.key)
    mine = [x for x in own if x.cand.schedule in schedules and x.fits]
    return _to_plan(
        search,
        best,
        peers,
        profile_path,
        topology_path,
        time.perf_counter() - clock,
        unseeded=min(mine, key=Scored.key) if mine else None,
    )


def _own_search(
    search: _Search, settings: Sequence[tuple[int, int]], schedules: Sequence[str], clock: float
) -> list[Scored]:
    """pipeplan's own search, without any peer plan in its pool: exhaustive on tiny
    instances, else DP candidates, the ILP and local search; then every allowed schedule
    on the winner and interleaved re-cuts of the best few."""
    profile, topology, opts = search.profile, search.topology, search.options
    primary = [s for s in schedules if s != "interleaved"] or ["1f1b"]
    n = profile.num_layers
    names = topology.device_names()
    scored: list[Scored] = []
    homogeneous = identical_devices(topology) and uniform_network(topology)
    space = exhaustive_size(n, len(names)) * len(settings) * len(primary)
    # Each simulation costs about devices x microbatches; big instances simulate fewer.
    scale = len(names) * max(m for _, m in settings)
    if space <= opts.exhaustive_limit:
        search.methods.append("exhaustive")
        scored.extend(_exhaustive(search, primary, settings))
    else:
        search.methods.append("dp")
        paths = [names] if homogeneous else candidate_paths(topology)
        top = max(1, min(opts.top_candidates, opts.top_candidates * 2048 // scale))
        grid: list[Candidate] = []
        for mb, m in settings:
            costs = layer_costs(profile, mb)
            for sched in primary:
                cands = _dp_candidates(search, costs, paths, sched, m)
                for c in cands[:top]:
                    cand = _make(search, c.ranges, c.groups, sched, mb, m, recompute=c.recompute)
                    scored.append(search.evaluate(cand, "dp"))
                grid.extend(_grid_shapes(search, cands, sched, mb, m))
        starts = _LOCAL_STARTS if scale <= 2048 else 1
        scored.extend(_by_bound(search, grid, scored, "grid", starts))
        if "interleaved" in schedules:
            chunked = _grid_interleaved(search, grid, scored)
            scored.extend(_by_bound(search, chunked, scored, "grid interleaved", starts))
        use_ilp = opts.use_ilp
        if use_ilp is None:
            use_ilp = not homogeneous
        if use_ilp and scored:
            # The ILP gets what is left of the time limit (at least a tenth of it).
            left = max(search.time_limit - (time.perf_counter() - clock), 0.1 * search.time_limit)
            from_ilp = _run_ilp(search, min(scored, key=Scored.key), primary, left)
            if from_ilp is not None:
                scored.append(from_ilp)
        # Local search from the best few distinct plans (the best gets the full budget).
        firsts = _distinct_starts(scored, starts)
        if firsts:
            search.methods.append("local search")
        for rank, start in enumerate(firsts):
            budget = _local_budget(opts.local_search_evals, start)
            scored.append(_local_search(search, start, budget if rank == 0 else budget // 6))
    if not scored or not min(scored, key=Scored.key).fits:
        return scored
    best = min(scored, key=Scored.key)
    scored.extend(_other_schedules(search, best, schedules))
    if "interleaved" in schedules:
        # Seeds were planned for flushing one-chunk schedules; re-cut the best few.
        count = _INTERLEAVED_SEEDS if scale <= 2048 else 1
        pipelines = [x for x in scored if x.cand.virtual_stages == 1 and len(x.cand.stages) > 1]
        for seed in _distinct_starts(pipelines, count):
            for e in _interleaved(search, seed.cand):
                if not search.cannot_beat(e, best):
                    scored.append(search.evaluate(e, "interleaved"))
                    best = min(best, scored[-1], key=Scored.key)
    return scored


def _run_ilp(
    search: _Search, best: Scored, primary: Sequence[str], time_limit: float
) -> Scored | None:
    """Joint partition + mapping by the ILP at the best candidate's microbatch size and
    stage count, warm-started from it (or from the DP in device order)."""
    if not best.fits:
        return None
    c = best.cand
    n = search.profile.num_layers
    names = search.topology.device_names()
    s = min(max(len(c.stages), 2), n, len(names))
    if len(names) > _ILP_MAX_DEVICES or n * s > _ILP_MAX_CELLS:
        search.methods.append("ilp skipped (too large)")
        return None
    costs = layer_costs(search.profile, c.microbatch_size)
    sched = c.schedule if c.schedule in primary else primary[0]
    m = c.num_microbatches
    warm: _DpCand | None = None
    if len(c.stages) == s and all(len(d) == 1 for _, d, _ in c.stages):
        warm = _DpCand(
            0.0,
            tuple(r for r, _, _ in c.stages),
            tuple(d for _, d, _ in c.stages),
            tuple(rc for _, _, rc in c.stages),
        )
    else:
        in_order = _dp_candidates(search, costs, [names], sched, m)
        warm = next((w for w in in_order if len(w.ranges) == s and len(w.groups[0]) == 1), None)
    search.methods.append("ilp")
    got = _ilp_candidate(search, costs, sched, m, warm, s, time_limit)
    if got is None:
        return None
    ranges, devs, _ = got
    cand = _make(search, ranges, [(d,) for d in devs], sched, c.microbatch_size, m)
    return search.evaluate(cand, "ilp")


def _other_schedules(search: _Search, best: Scored, schedules: Sequence[str]) -> list[Scored]:
    """The winner's partition under every other schedule the user allowed."""
    c = best.cand
    out: list[Scored] = []
    for sched in schedules:
        if sched == c.schedule:
            continue
        if sched == "interleaved":
            extra = _interleaved(search, c)
        else:
            ranges = [r for r, _, _ in c.stages]
            groups = [d for _, d, _ in c.stages]
            extra = [_make(search, ranges, groups, sched, c.microbatch_size, c.num_microbatches)]
        # One that cannot beat the winner by its bound could change nothing.
        out.extend(
            search.evaluate(e, f"schedule {sched}")
            for e in extra
            if not search.cannot_beat(e, best)
        )
    return out


def _local_budget(evals: int, best: Scored) -> int:
    """Fewer local-search simulations for big pipelines (each one costs more), but at least
    :data:`_LOCAL_FLOOR`: moving a few cuts by a layer or two is what separates the DP's
    estimate from the simulator's optimum on big interleaved and replicated plans."""
    c = best.cand
    size = sum(len(d) for _, d, _ in c.stages) * c.num_microbatches
    floor = _LOCAL_FLOOR if len(c.stages) > 1 else 4  # one stage: no cut to move
    return max(min(evals, floor), min(evals, int(evals * 128 / max(size, 1))))


def _to_plan(
    search: _Search,
    best: Scored,
    peers: _PeerReport | None,
    profile_path: str | None,
    topology_path: str | None,
    seconds: float,
    *,
    unseeded: Scored | None = None,
) -> Plan:
    c = best.cand
    topo = search.topology
    lb = _lower_bound_ms(search.profile, topo, c.microbatch_size, c.num_microbatches)
    gap = best.iteration_ms / lb - 1.0 if lb > 0 else None
    solver = SolverInfo(
        method="+".join(search.methods) + f" -> {best.origin}",
        status="optimal" if "exhaustive" in search.methods else "best found",
        seconds=round(seconds, 3),
        gap=None if gap is None else round(gap, 6),
        simulations=search.sims,
        ilp=search.ilp,
    )
    if unseeded is not None:
        # What the search found on its own, before any peer plan joined the pool.
        u = unseeded.cand
        solver.without_peers = WithoutPeers(
            iteration_ms=unseeded.per_sample_ms * c.samples,
            microbatch_size=u.microbatch_size,
            num_microbatches=u.num_microbatches,
            schedule=u.schedule,
            stages=[(r, d) for r, d, _ in u.stages],
            origin=unseeded.origin,
        )
    return plan_from_simulation(
        best.result,
        c.specs(),
        profile=_file_ref(profile_path, search.profile.to_dict()),
        topology=_file_ref(topology_path, topo.to_dict()),
        solver=solver,
        baselines=_peer_rows(peers, c.samples),
        global_lower_bound_ms=lb,
    )
