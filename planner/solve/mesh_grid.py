"""The sweep over the new dimensions: every tensor-parallel degree the profile has, the
groups the fabric favours for it, pipeline depth x replicas, two placements, sequence
parallelism, sharding, microbatching and schedule, each with the mesh DP's cuts.

For degree ``t`` (1 included: sharding alone) and each grouping of
:func:`planner.solve.tp_groups.tp_groupings` (``G`` groups in pipeline order), every
depth ``p`` with ``r = G / p`` replicas per stage (``p`` at most the layers, ``r`` at most
the microbatches), placed

* *replicas together* (stage ``k`` on groups ``k r .. k r + r - 1``: the replicas'
  all-reduce on neighbouring groups, Megatron-LM's and torchtitan's rank order), or
* *stages together* (stage ``k`` on groups ``k, p + k, 2p + k, ...``: consecutive stages
  on neighbouring groups);

with sequence parallelism off and on (where the profile has it), sharding none, ZeRO-1
and FSDP (two or more replicas, flushing schedules), and the layers cut by
:func:`planner.solve.mesh.mesh_cuts`.

Example::

    shapes = mesh_grid(search, [(4, 8)], ["1f1b"])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from planner.profile.sharding import shard_key
from planner.schedule.families import family
from planner.shape import PlanShape
from planner.solve.mesh import Mesh, mesh_cuts, mesh_shape
from planner.solve.search import Search
from planner.solve.tp_groups import Grouping, tp_groupings
from planner.stages import SHARDINGS

__all__ = ["mesh_degrees", "mesh_grid", "mesh_groupings", "placements"]


def mesh_degrees(search: Search) -> list[int]:
    """The tensor-parallel degrees to search: 1 and the profile's, up to the devices; 1
    alone where a parameter is tied (the simulator does not split a tied weight, and
    every stage of a pipeline shares one degree).

    Example::

        mesh_degrees(search)   # [1, 2, 4, 8]
    """
    info = search.profile.tensor_parallel
    n = len(search.topology.devices)
    if info is None or search.profile.tied_parameters:
        return [1]
    return [1, *(t for t in sorted(info.degrees) if t <= n)]


def mesh_groupings(search: Search, degree: int) -> list[Grouping]:
    """:func:`~planner.solve.tp_groups.tp_groupings` for ``degree``, ranked on the
    profile's typical collective (the median layer's bytes at the smallest microbatch),
    once per search.

    Example::

        mesh_groupings(search, 2)[0]
    """
    key = ("groupings", degree)
    hit = search.notes.get(key)
    if isinstance(hit, list):
        return hit
    nbytes = 2.0**20
    if degree > 1:
        timing = search.profile.measurement(search.profile.microbatch_sizes[0])
        sizes = sorted(
            t.sharded[shard_key(degree)].collective_bytes("forward") for t in timing.layers
        )
        nbytes = float(max(sizes[len(sizes) // 2], 1))
    found = tp_groupings(search.topology, degree, nbytes=nbytes)
    search.notes[key] = found
    return found


def placements(grouping: Grouping, depth: int) -> list[list[tuple[str, ...]]]:
    """Each stage's devices (replica-major groups) for ``depth`` stages over ``grouping``:
    replicas together, then (where it differs) stages together.

    Example::

        placements((("a", "b"), ("c", "d")), 1)   # [[('a', 'b', 'c', 'd')]]
    """
    r = len(grouping) // depth
    together = [tuple(d for g in grouping[k * r : (k + 1) * r] for d in g) for k in range(depth)]
    out = [together]
    if depth > 1 and r > 1:
        out.append(
            [tuple(d for j in range(r) for d in grouping[j * depth + k]) for k in range(depth)]
        )
    return out


def _meshes(search: Search, degree: int) -> list[Mesh]:
    info = search.profile.tensor_parallel
    if degree == 1:
        return [Mesh(1)]
    if info is not None and info.sequence_parallel:
        return [Mesh(degree), Mesh(degree, True)]
    return [Mesh(degree)]


def _shardings(replicas: int, schedule: str) -> tuple[str, ...]:
    """Sharding needs two or more replicas and the step after a flush."""
    return SHARDINGS if replicas > 1 and family(schedule).flush else ("none",)


def mesh_grid(
    search: Search, settings: Sequence[tuple[int, int]], schedules: Sequence[str]
) -> Iterator[PlanShape]:
    """Every shape of the sweep (see the module docstring), under each of ``schedules``
    (one chunk per device), for each ``(microbatch size, count)`` in ``settings``.

    Example::

        sum(1 for _ in mesh_grid(search, [(4, 8)], ["1f1b"]))
    """
    n = search.profile.num_layers
    for t in mesh_degrees(search):
        for grouping in mesh_groupings(search, t):
            g = len(grouping)
            for depth in (d for d in range(1, g + 1) if g % d == 0 and d <= n):
                r = g // depth
                for stage_devices in placements(grouping, depth):
                    for mesh in _meshes(search, t):
                        for mb, m in settings:
                            if r > m:
                                continue
                            for sched in schedules:
                                yield from _cut_shapes(search, mesh, stage_devices, sched, mb, m)


def _cut_shapes(
    search: Search,
    mesh: Mesh,
    stage_devices: Sequence[tuple[str, ...]],
    schedule: str,
    mb: int,
    m: int,
) -> Iterator[PlanShape]:
    search.check_clock("mesh grid")  # the cuts of a big sweep take seconds before a simulation
    r = len(stage_devices[0]) // mesh.degree
    for sharding in _shardings(r, schedule):
        sharded = sharding != "none"
        for ranges, _ in mesh_cuts(search, mesh, stage_devices, schedule, mb, m, sharded=sharded):
            yield mesh_shape(search, ranges, stage_devices, mesh, sharding, schedule, mb, m)
