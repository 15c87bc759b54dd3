"""Local search: first-improvement descent from a plan over its neighbours (move a cut,
swap, replace, add, reorder or move replicas, split, merge), for a budget counted in
simulations.

Example::

    start = distinct_starts(scored, 3)[0]
    better = local_search(search, start, local_budget(400, start))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from planner.shape import PlanShape
from planner.solve.options import LOCAL_FLOOR
from planner.solve.scored import Scored, stage_key
from planner.solve.search import Search, make_shape

__all__ = ["distinct_starts", "local_budget", "local_search", "moved_cut", "neighbours"]

Ranges = list[tuple[int, int]]
Groups = list[tuple[str, ...]]


def moved_cut(ranges: Ranges, k: int) -> Iterator[Ranges]:
    """``ranges`` with the cut after stage ``k`` moved by one or two layers either way."""
    for delta in (-1, 1, -2, 2):
        cut = ranges[k][1] + delta
        if ranges[k][0] <= cut < ranges[k + 1][1]:
            new = list(ranges)
            new[k] = (ranges[k][0], cut)
            new[k + 1] = (cut + 1, ranges[k + 1][1])
            yield new


def _swaps(ranges: Ranges, groups: Groups) -> Iterator[tuple[Ranges, Groups]]:
    """Swap the devices of two stages."""
    s = len(ranges)
    for i in range(s):
        for j in range(i + 1, s):
            g = list(groups)
            g[i], g[j] = g[j], g[i]
            yield list(ranges), g


def _placements(
    ranges: Ranges, groups: Groups, free: Sequence[str]
) -> Iterator[tuple[Ranges, Groups]]:
    """Move a stage onto an unused device, or give it one more replica."""
    for i in range(len(ranges)):
        for d in free:
            if len(groups[i]) == 1:
                g = list(groups)
                g[i] = (d,)
                yield list(ranges), g
            g = list(groups)
            g[i] = (*groups[i], d)
            yield list(ranges), g


def _reorders(ranges: Ranges, groups: Groups) -> Iterator[tuple[Ranges, Groups]]:
    """Reorder a stage's replicas (who runs which microbatch, the ring's order)."""
    for i in range(len(ranges)):
        g0 = groups[i]
        if len(g0) > 1:
            for a in range(len(g0) - 1):  # neighbours in the ring: r - 1 moves, not r^2
                order = list(g0)
                order[a], order[a + 1] = order[a + 1], order[a]
                g = list(groups)
                g[i] = tuple(order)
                yield list(ranges), g


def _replica_moves(ranges: Ranges, groups: Groups) -> Iterator[tuple[Ranges, Groups]]:
    """Move one replica to another stage (for neighbours, with the cut between them moved
    by a layer either way: more devices usually want more layers)."""
    s = len(ranges)
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
                    for new in moved_cut(ranges, min(i, j)):
                        yield new, list(g)


def _splits_and_merges(
    ranges: Ranges, groups: Groups, free: Sequence[str]
) -> Iterator[tuple[Ranges, Groups]]:
    """Split a stage in two onto a free device; merge two neighbours."""
    s = len(ranges)
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


def neighbours(cand: PlanShape, names: Sequence[str], n: int) -> Iterator[tuple[Ranges, Groups]]:
    """The plans one move away from ``cand``, as (ranges, device groups), in a fixed order:
    move a cut; unless interleaved, swap two stages' devices, move a stage to a free device
    or add one as a replica, reorder a stage's replicas, move a replica to another stage,
    split a stage onto a free device, merge two neighbours.

    Example::

        next(neighbours(cand, topology.device_names(), profile.num_layers))
    """
    ranges = [s.layers for s in cand.stages]
    groups = [s.devices for s in cand.stages]
    for k in range(len(ranges) - 1):
        for new in moved_cut(ranges, k):
            yield new, list(groups)
    if cand.virtual_stages > 1:
        return
    used = {d for g in groups for d in g}
    free = [d for d in names if d not in used]
    yield from _swaps(ranges, groups)
    yield from _placements(ranges, groups, free)
    yield from _reorders(ranges, groups)
    yield from _replica_moves(ranges, groups)
    yield from _splits_and_merges(ranges, groups, free)


def distinct_starts(scored: Sequence[Scored], count: int) -> list[Scored]:
    """The best ``count`` feasible plans with different partitions or device groups.

    Example::

        distinct_starts(scored, 3)
    """
    out: list[Scored] = []
    seen: set[tuple[Any, ...]] = set()
    for x in sorted(scored, key=Scored.key):
        if not x.fits:
            break
        shape = stage_key(x.shape)
        if shape in seen:
            continue
        seen.add(shape)
        out.append(x)
        if len(out) == count:
            break
    return out


def _plain_moves(search: Search, c: PlanShape) -> Iterator[PlanShape]:
    """:func:`neighbours` as shapes (recompute where memory needs it)."""
    names = search.topology.device_names()
    for ranges, groups in neighbours(c, names, search.profile.num_layers):
        yield make_shape(
            search,
            ranges,
            groups,
            c.schedule,
            c.microbatch_size,
            c.num_microbatches,
            virtual=c.virtual_stages,
        )


def local_search(
    search: Search,
    start: Scored,
    budget: int,
    moves: Callable[[Search, PlanShape], Iterator[PlanShape]] | None = None,
) -> Scored:
    """First-improvement descent over :func:`neighbours` (or ``moves``: the search over
    tensor parallelism and sharding has its own) from ``start``, for ``budget`` new
    neighbours. A neighbour whose bound cannot beat the current best is counted but not
    simulated (:meth:`planner.solve.search.Search.cannot_beat`): simulated it would not
    have been taken, so the descent is the same, for fewer simulations.

    Example::

        better = local_search(search, start, 24)
    """
    best = start
    spent = 0
    improved = True
    step = moves or _plain_moves
    while improved and spent < budget:
        improved = False
        for cand in step(search, best.shape):
            if spent >= budget:
                break
            if search.met(cand):
                scored = search.evaluate(cand, "local search")  # as simulated before
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


def local_budget(evals: int, best: Scored) -> int:
    """Fewer local-search simulations for big pipelines (each one costs more), but at least
    :data:`planner.solve.options.LOCAL_FLOOR`: moving a few cuts by a layer or two is what
    separates the DP's estimate from the simulator's optimum on big interleaved and
    replicated plans.

    Example::

        local_budget(400, best)  # 400 on small plans, fewer on big ones, at least 24
    """
    c = best.shape
    size = sum(len(s.devices) for s in c.stages) * c.num_microbatches
    floor = LOCAL_FLOOR if len(c.stages) > 1 else 4  # one stage: no cut to move
    return max(min(evals, floor), min(evals, int(evals * 128 / max(size, 1))))
