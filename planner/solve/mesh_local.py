"""Local moves of a plan over tensor-parallel groups and sharding, for
:func:`planner.solve.local.local_search` (``moves=mesh_moves``).

From a plan whose stages share a degree and sequence parallelism, in a fixed order: move a
cut by one or two layers; switch sequence parallelism for the whole pipeline; change one
stage's sharding, or every stage's; unless interleaved, exchange the ``j``-th groups of two
neighbouring stages, and move a stage's last group to a neighbour (with the cut between
them moved a layer either way); last, unless interleaved, change one stage's
tensor-parallel degree (its devices regrouped: :func:`_degree_changes`; sequence parallel
where the plan is and the new degree is 2 or more), which may leave neighbouring stages
at different degrees (issue #22: the values crossing are replicated over each group, or
resharded along the sequence: :func:`~planner.stages.boundary_pieces`). From such a
plan: the cut, sharding and degree moves.
Recompute is worked out for each (a member's memory), and settled by the simulator as for
every candidate.

Example::

    better = local_search(search, start, 24, moves=mesh_moves)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from planner.schedule.families import family
from planner.shape import PlanShape
from planner.solve.local import moved_cut
from planner.solve.mesh import Mesh, mesh_shape, shape_mesh, stage_degrees
from planner.solve.mesh_grid import mesh_degrees
from planner.solve.search import Search
from planner.stages import SHARDINGS

__all__ = ["degree_moves", "mesh_moves"]

Layout = tuple[list[tuple[int, int]], list[tuple[str, ...]], list[str]]


def mesh_moves(search: Search, c: PlanShape) -> Iterator[PlanShape]:
    """The plans one move away from ``c`` (see the module docstring), as shapes.

    Example::

        next(mesh_moves(search, shape)).stages[0].tensor_parallel
    """
    degrees = stage_degrees(c)
    mesh = shape_mesh(c)
    ranges = [s.layers for s in c.stages]
    devs = [s.devices for s in c.stages]
    shard = [s.sharding for s in c.stages]

    def build(layout: Layout, m: Mesh = mesh, ts: Sequence[int] | None = degrees) -> PlanShape:
        r, d, sh = layout
        return mesh_shape(
            search,
            r,
            d,
            m,
            sh,
            c.schedule,
            c.microbatch_size,
            c.num_microbatches,
            c.virtual_stages,
            degrees=ts,
        )

    for k in range(len(ranges) - 1):
        for new in moved_cut(ranges, k):
            yield build((new, devs, shard))
    info = search.profile.tensor_parallel
    if degrees is None and mesh.degree > 1 and info is not None and info.sequence_parallel:
        yield build((ranges, devs, shard), Mesh(mesh.degree, not mesh.sequence_parallel))
    if family(c.schedule).flush:
        for sh in _shardings(c, shard):
            yield build((ranges, devs, sh))
    if c.virtual_stages > 1:
        return
    if degrees is None:
        for layout in _regroupings(ranges, devs, shard, mesh.degree):
            yield build(layout)
    yield from degree_moves(search, c)


def degree_moves(search: Search, c: PlanShape) -> Iterator[PlanShape]:
    """The plans with one stage's tensor-parallel degree changed (:func:`_degree_changes`),
    the last of :func:`mesh_moves`, sequence parallelism kept where the plan has it (on
    each stage of degree 2 or more); none for interleaved plans or a profile without
    tensor-parallel entries.

    Example::

        [st.tensor_parallel for st in next(degree_moves(search, shape)).stages]   # [1, 2]
    """
    if c.virtual_stages > 1 or search.profile.tensor_parallel is None:
        return
    sp = shape_mesh(c).sequence_parallel  # kept on every stage of degree 2 or more
    ranges = [s.layers for s in c.stages]
    devs = [s.devices for s in c.stages]
    shard = [s.sharding for s in c.stages]
    for ts in _degree_changes(c, mesh_degrees(search)):  # [1] where a weight is tied
        one = len(set(ts)) == 1  # every stage at one degree again
        yield mesh_shape(
            search,
            ranges,
            devs,
            Mesh(ts[0], sp and ts[0] > 1) if one else Mesh(1, sp),
            shard,
            c.schedule,
            c.microbatch_size,
            c.num_microbatches,
            c.virtual_stages,
            degrees=None if one else ts,
        )


def _degree_changes(c: PlanShape, allowed: Sequence[int]) -> Iterator[list[int]]:
    """The stages' degrees with one stage's changed, the nearest degrees first: its own
    devices regrouped (replica-major, so a group splits into consecutive parts or
    consecutive groups join); a stage that ends with one replica is not sharded
    (:func:`~planner.solve.mesh.mesh_stages`)."""
    degrees = [st.tensor_parallel for st in c.stages]
    for k, st in enumerate(c.stages):
        t, n = st.tensor_parallel, len(st.devices)
        near = sorted((abs(math.log2(u / t)), u) for u in allowed if u != t and n % u == 0)
        for _, u in near:
            if max(u, t) % min(u, t) == 0:
                yield [*degrees[:k], u, *degrees[k + 1 :]]


def _shardings(c: PlanShape, shard: Sequence[str]) -> Iterator[list[str]]:
    """One stage's sharding changed, then every stage's at once."""
    for k, st in enumerate(c.stages):
        if st.replicas < 2:
            continue
        for alt in SHARDINGS:
            if alt != shard[k]:
                new = list(shard)
                new[k] = alt
                yield new
    if any(st.replicas > 1 for st in c.stages):
        for alt in SHARDINGS:
            new = [alt if st.replicas > 1 else "none" for st in c.stages]
            if new != list(shard):
                yield new


def _regroupings(
    ranges: list[tuple[int, int]], devs: list[tuple[str, ...]], shard: list[str], t: int
) -> Iterator[Layout]:
    """Exchange the ``j``-th groups of neighbouring stages; move a stage's last group to a
    neighbour (the cut moved along: more groups usually want more layers)."""
    groups = [[g[i : i + t] for i in range(0, len(g), t)] for g in devs]
    flat = _flatten
    for k in range(len(groups) - 1):
        for j in range(min(len(groups[k]), len(groups[k + 1]))):
            a, b = list(groups[k]), list(groups[k + 1])
            a[j], b[j] = b[j], a[j]
            new = list(groups)
            new[k], new[k + 1] = a, b
            yield list(ranges), flat(new), list(shard)
    for k, mine in enumerate(groups):
        if len(mine) < 2:
            continue
        for other in (k - 1, k + 1):
            if not 0 <= other < len(groups):
                continue
            new = list(groups)
            new[k] = mine[:-1]
            new[other] = [*groups[other], mine[-1]]
            yield list(ranges), flat(new), list(shard)
            for cut in moved_cut(list(ranges), min(k, other)):
                yield cut, flat(new), list(shard)


def _flatten(groups: Sequence[Sequence[tuple[str, ...]]]) -> list[tuple[str, ...]]:
    return [tuple(d for g in stage for d in g) for stage in groups]
