"""The depth x replication grid a practitioner sweeps, with the DP's partitions, simulated in
the order of a lower bound while the bound can still beat the best plans found.

:func:`grid_shapes` gives, for every pipeline depth ``d`` with ``N / d`` replicas per stage
on all ``N`` devices, the DP's best and its compute-only re-cut; :func:`grid_interleaved`
the interleaved re-cuts of the promising 1F1B ones; :func:`by_bound` simulates candidates
best bound first and stops where the bound cannot beat the ``keep``-th best plan.

Example::

    grid = grid_shapes(search, dp_candidates(search, costs, paths, "1f1b", 8), "1f1b", 4, 8)
    scored = by_bound(search, grid, [], "grid", keep=3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from planner.shape import PlanShape
from planner.solve.bounds import busy_bound_ms, pipeline_bound_ms, search_bound_ms
from planner.solve.dp_candidates import DpCand
from planner.solve.options import INTERLEAVED_BASE, INTERLEAVED_SEEDS, VIRTUAL_CHUNKS
from planner.solve.recut import interleaved, recut
from planner.solve.scored import Scored, stage_key
from planner.solve.search import Search, make_shape

__all__ = ["by_bound", "grid_interleaved", "grid_shapes"]


def grid_shapes(
    search: Search, cands: Sequence[DpCand], schedule: str, mb: int, num_microbatches: int
) -> list[PlanShape]:
    """The sweep a practitioner runs, with the DP's partitions: for every pipeline depth
    ``d`` and ``N / d`` replicas per stage that use all ``N`` devices, the DP's best
    estimate over the device orderings tried, and its compute-only split
    (:func:`planner.solve.recut.recut`).

    Example::

        grid_shapes(search, dp_candidates(search, costs, paths, "1f1b", 8), "1f1b", 4, 8)
    """
    total = len(search.topology.devices)
    seen: set[tuple[int, int]] = set()
    out: list[PlanShape] = []
    for c in cands:  # best estimate first
        shape = (len(c.groups), len(c.groups[0]))
        if shape[0] * shape[1] != total or shape in seen:
            continue
        if any(len(g) != shape[1] for g in c.groups):
            continue
        seen.add(shape)
        out.append(
            make_shape(
                search, c.ranges, c.groups, schedule, mb, num_microbatches, recompute=c.recompute
            )
        )
        out.extend(recut(search, c.groups, schedule, mb, num_microbatches, full=False))
    return out


def grid_interleaved(
    search: Search, grid: Sequence[PlanShape], scored: Sequence[Scored], schedule: str
) -> list[PlanShape]:
    """Re-cuts under ``schedule`` (a family with several chunks per device, e.g.
    interleaved) of the grid's 1F1B pipelines whose busiest device (compute,
    all-reduce, step) could still beat the best plan found, the most promising
    :data:`planner.solve.options.INTERLEAVED_SEEDS` first: by the busy time plus the fill
    and drain (:func:`planner.solve.bounds.pipeline_bound_ms`) shrunk by the most chunks
    per device the layers allow, as interleaving shrinks it.

    Example::

        grid_interleaved(search, grid, scored, "interleaved")
    """
    best = min((x.per_sample_ms for x in scored if x.fits), default=math.inf)
    n = search.profile.num_layers
    ranked = []
    for i, c in enumerate(grid):
        p = len(c.stages)
        if c.schedule != INTERLEAVED_BASE or p < 2 or n < 2 * p:
            continue
        args = (
            search.profile,
            search.topology,
            list(c.stages),
            c.num_microbatches,
            c.microbatch_size,
        )
        busy = busy_bound_ms(*args)
        if busy / c.samples >= best:
            continue
        v = max(x for x in VIRTUAL_CHUNKS if x * p <= n)
        drain = max(pipeline_bound_ms(*args) - busy, 0.0)
        ranked.append(((busy + drain / v) / c.samples, i, c))
    ranked.sort(key=lambda x: (x[0], x[1]))
    scale = len(search.topology.devices) * max((c.num_microbatches for c in grid), default=1)
    count = INTERLEAVED_SEEDS if scale <= 2048 else INTERLEAVED_SEEDS // 2
    out: list[PlanShape] = []
    for _, _, c in ranked[:count]:
        out.extend(interleaved(search, c, schedule))
    return out


def by_bound(
    search: Search,
    cands: Sequence[PlanShape],
    scored: Sequence[Scored],
    origin: str,
    keep: int = 1,
) -> list[Scored]:
    """Simulate ``cands`` in the order of a lower bound of their time per sample
    (:func:`planner.solve.bounds.search_bound_ms`) while the bound can still beat the
    ``keep``-th best distinct plan found so far (local search starts from the best
    ``keep``); the rest cannot be among them, so leaving them out loses nothing, and the
    local search starts from the same plans however tight the bound.

    Example::

        by_bound(search, grid, scored, "grid", keep=3)
    """
    best: dict[tuple[Any, ...], float] = {}  # per distinct plan, as local.distinct_starts
    for x in scored:
        if x.fits:
            _note_time(best, x)
    ranked = []
    for i, c in enumerate(dict.fromkeys(cands)):
        bound = search_bound_ms(
            search.profile,
            search.topology,
            list(c.stages),
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
    """Keep the best time per sample of ``x``'s partition and device groups."""
    shape = stage_key(x.shape)
    best[shape] = min(best.get(shape, math.inf), x.per_sample_ms)
