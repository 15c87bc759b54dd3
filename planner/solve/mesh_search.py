"""The search over tensor parallelism, sequence parallelism and sharded data parallelism,
together with pipeline depth, replicas, placement, recompute, microbatching and schedule;
run by :func:`planner.solve.solve` when the profile has tensor-parallel entries.

1. **The sweep** (:func:`planner.solve.mesh_grid.mesh_grid`): every degree (1 and the
   profile's), the groups the fabric favours for it, depth x replicas, two placements,
   sequence parallelism, sharding, every microbatch setting and flushing schedule, the
   mesh DP's cuts. On big instances (devices x microbatches above
   :data:`~planner.solve.options.MESH_SCALE`) only the
   :data:`~planner.solve.options.MESH_BOUNDED` best by a quick estimate
   (:func:`planner.solve.mesh.mesh_estimate_ms`) go on.
2. **By bound**: simulated in the order of the search's lower bound while it can beat the
   best plans found so far (pipeplan's plain search's included), as the plain grid is.
3. **Local search** (:mod:`planner.solve.mesh_local`) from the best few distinct plans.
4. **Schedules**: the best few under every other schedule allowed, and re-cut into 2, 3
   or 4 interleaved chunks per device, where their bound can beat the best.
5. **Degrees**: from the best plan found, a descent over one stage's tensor-parallel
   degree at a time (issue #22: kept only where strictly faster), and its plan under the
   other schedules. It comes after the schedules: a plan of a degree per stage cannot be
   interleaved, and an interleaved best has no degree moves, so it costs nothing there.

Every count is in plans or simulations (never wall time), so a solve is deterministic.

Example::

    scored = mesh_search(search, [(4, 8)], AUTO_SCHEDULES, own)
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedule.families import family
from planner.shape import PlanShape
from planner.solve.grid import by_bound
from planner.solve.local import distinct_starts, local_budget, local_search
from planner.solve.mesh import (
    Mesh,
    mesh_cuts,
    mesh_estimate_ms,
    mesh_shape,
    shape_mesh,
    stage_degrees,
)
from planner.solve.mesh_grid import mesh_grid
from planner.solve.mesh_local import degree_moves, mesh_moves
from planner.solve.options import (
    INTERLEAVED_BASE,
    INTERLEAVED_SEEDS,
    LOCAL_STARTS,
    MESH_BOUNDED,
    MESH_SCALE,
    VIRTUAL_CHUNKS,
)
from planner.solve.scored import Scored
from planner.solve.search import Search

__all__ = ["mesh_schedules", "mesh_search"]


def mesh_search(
    search: Search,
    settings: Sequence[tuple[int, int]],
    schedules: Sequence[str],
    incumbents: Sequence[Scored] = (),
) -> list[Scored]:
    """The plans of the search over the new dimensions (see the module docstring);
    ``incumbents`` (plans found already) only set the bar the bounds must beat.

    Example::

        best = min(mesh_search(search, [(4, 8)], ["1f1b"]), key=Scored.key)
    """
    primary = [s for s in schedules if not family(s).interleaved] or [INTERLEAVED_BASE]
    search.methods.append("mesh")
    scale = len(search.topology.devices) * max(m for _, m in settings)
    big = scale > MESH_SCALE
    shapes = list(dict.fromkeys(mesh_grid(search, settings, primary)))
    if big:
        ranked = []
        for i, c in enumerate(shapes):
            if i % 64 == 0:
                search.check_clock("mesh grid")
            ranked.append((mesh_estimate_ms(search, c) / c.samples, i, c))
        ranked.sort(key=lambda x: (x[0], x[1]))
        shapes = [c for _, _, c in ranked[:MESH_BOUNDED]]
    starts = 1 if big else LOCAL_STARTS
    scored = by_bound(search, shapes, incumbents, "mesh grid", starts)
    for rank, start in enumerate(distinct_starts(scored, starts)):
        budget = local_budget(search.options.local_search_evals, start)
        scored.append(
            local_search(search, start, budget if rank == 0 else budget // 6, moves=mesh_moves)
        )
    seeds = distinct_starts(scored, 1 if big else INTERLEAVED_SEEDS)
    scored.extend(_scheduled(search, seeds, [*incumbents, *scored], schedules))
    found = _degree_descent(search, scored)
    scored.extend(found)
    scored.extend(_scheduled(search, found, [*incumbents, *scored], schedules))
    return scored


def _scheduled(
    search: Search, seeds: Sequence[Scored], pool: Sequence[Scored], schedules: Sequence[str]
) -> list[Scored]:
    """Each seed under the other schedules (:func:`mesh_schedules`), simulated where its
    bound can beat the best plan that fits in ``pool`` and in what it found so far;
    nothing where none fits.

    Example::

        scored.extend(_scheduled(search, distinct_starts(scored, 1), scored, ["1f1b", "zb"]))
    """
    fitting = [x for x in pool if x.fits]
    if not fitting:
        return []
    best = min(fitting, key=Scored.key)
    out: list[Scored] = []
    for seed in seeds:
        for cand in mesh_schedules(search, seed.shape, schedules):
            if not search.cannot_beat(cand, best):
                out.append(search.evaluate(cand, "mesh schedule"))
                best = min(best, out[-1], key=Scored.key)
    return out


def _degree_descent(search: Search, scored: Sequence[Scored]) -> list[Scored]:
    """One stage's degree changed at a time (:func:`~planner.solve.mesh_local.degree_moves`)
    from the best plan found, first improvement, with a budget of four candidates per stage
    (every single change): the local search tries them last and seldom reaches them on big
    pipelines. It runs after the other schedules and the interleaved re-cuts were tried,
    so where the best plan is interleaved (no degree moves: one chunk per device only) it
    costs nothing. The plan it returns where none is strictly faster is the one it
    started from (no change); nothing without a fitting plan.

    Example::

        scored.extend(_degree_descent(search, scored))
    """
    fitting = [x for x in scored if x.fits]
    if not fitting:
        return []
    best = min(fitting, key=Scored.key)
    found = local_search(search, best, 4 * len(best.shape.stages), moves=degree_moves)
    return [found] if found is not best else []


def mesh_schedules(search: Search, c: PlanShape, schedules: Sequence[str]) -> list[PlanShape]:
    """``c`` (one chunk per device) under every other schedule in ``schedules``: the same
    stages (sharding only where the schedule flushes), or for a family with several chunks
    per device its groups each holding 2, 3 or 4 chunks, the layers re-cut by the mesh DP.

    Example::

        mesh_schedules(search, shape, ["1f1b", "zb", "interleaved"])
    """
    if c.virtual_stages > 1:
        return []
    mesh = shape_mesh(c)
    ranges = [s.layers for s in c.stages]
    devs = [s.devices for s in c.stages]
    mb, m = c.microbatch_size, c.num_microbatches
    out: list[PlanShape] = []
    degrees = stage_degrees(c)  # a degree per stage (a local-search move): not interleaved
    for sched in schedules:
        if sched == c.schedule:
            continue
        fam = family(sched)
        shard = [s.sharding if fam.flush else "none" for s in c.stages]
        if not fam.interleaved:
            out.append(mesh_shape(search, ranges, devs, mesh, shard, sched, mb, m, degrees=degrees))
        elif degrees is None:
            out.extend(_chunked(search, c, mesh, sched, shard))
    return out


def _chunked(
    search: Search, c: PlanShape, mesh: Mesh, schedule: str, shard: Sequence[str]
) -> list[PlanShape]:
    """``c``'s groups each holding ``v`` chunks under ``schedule`` (equal replicas, as the
    interleaved schedules need), cut by the mesh DP."""
    reps = {s.replicas for s in c.stages}
    p, n, m = len(c.stages), search.profile.num_layers, c.num_microbatches
    if len(reps) != 1 or p < 2:
        return []
    (r,) = reps
    if m % p or (m // r) % p:
        return []
    place = family(schedule).place
    devs = [s.devices for s in c.stages]
    out = []
    for v in VIRTUAL_CHUNKS:
        if n < v * p:
            break
        placed, placed_shard = place(devs, v), place(list(shard), v)
        sharded = any(s != "none" for s in shard)
        for ranges, _ in mesh_cuts(
            search, mesh, placed, schedule, c.microbatch_size, m, sharded=sharded, virtual=v
        ):
            out.append(
                mesh_shape(
                    search, ranges, placed, mesh, placed_shard, schedule, c.microbatch_size, m, v
                )
            )
    return out
