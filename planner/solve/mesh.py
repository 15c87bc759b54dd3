"""Plan shapes in the dimensions beyond pipeline x data parallelism: every stage on replicas
that are tensor-parallel groups of ``t`` devices, with sequence parallelism and a sharding
of its data parallelism (none, ZeRO-1, FSDP).

A *mesh* here is the part of a plan those dimensions fix: the degree ``t``, sequence
parallelism (one setting for the whole pipeline: member ``i`` of a group sends to member
``i`` of the next, so neighbours share both) and, per stage, the sharding. This module
builds such shapes (:func:`mesh_shape`, recompute where a member's memory needs it:
:func:`mesh_recompute`) and cuts the layers over a mesh's stages with the exact chain DP
(:func:`mesh_cuts`): the DP's costs are one member's (the profile's shard entries, through
:func:`planner.simulate.shards.shard_view`) plus each layer's collectives timed on the
group's ring, its slots the stages' groups (the slowest member's speed, the smallest
memory, the replicas' all-reduce on the ring of the groups' first members), its memory
the member's with the optimizer state ``/ r`` where the stage is sharded.

Example::

    cuts = mesh_cuts(search, Mesh(2, False), stage_devices, "1f1b", 4, 8, sharded=True)
    shape = mesh_shape(search, cuts[0][0], stage_devices, Mesh(2, True), "zero1",
                       "1f1b", 4, 8)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.partition.baselines import uniform_partition
from planner.partition.dp import LayerCosts, Linear, Slot, layer_costs, partition_chain
from planner.partition.mapping import transfer_cost
from planner.schedule.replicas import replica_round
from planner.shape import PlanShape
from planner.simulate.group_comm import pass_collective_ms
from planner.simulate.shards import member_memory_bytes, shard_view
from planner.solve.memory import held_per_replica, in_flight, recompute_units, weight_versions
from planner.solve.search import Search
from planner.stages import StageSpec

__all__ = [
    "Mesh",
    "mesh_costs",
    "mesh_cuts",
    "mesh_estimate_ms",
    "mesh_recompute",
    "mesh_shape",
    "mesh_stages",
    "shape_mesh",
    "stage_degrees",
]

Ranges = Sequence[tuple[int, int]]


@dataclass(frozen=True)
class Mesh:
    """What every stage of a plan shares: the tensor-parallel degree and whether sequence
    parallelism is on (only with a degree of 2 or more).

    Example::

        Mesh(4, True).describe()   # 'TP4, SP'
    """

    degree: int
    sequence_parallel: bool = False

    def describe(self) -> str:
        text = f"TP{self.degree}"
        return text + ", SP" if self.sequence_parallel else text


def mesh_stages(
    ranges: Ranges,
    stage_devices: Sequence[Sequence[str]],
    mesh: Mesh,
    sharding: str | Sequence[str],
    recompute: Sequence[bool],
    degrees: Sequence[int] | None = None,
) -> tuple[StageSpec, ...]:
    """The stages: layer range ``k`` on ``stage_devices[k]`` (replica-major groups of
    ``mesh.degree``, or of ``degrees[k]``: a degree per stage, sequence parallel where
    the mesh is and the stage's degree is 2 or more), ``sharding`` (one for all, or per
    stage) where a stage has two or more replicas.

    Example::

        mesh_stages([(0, 3), (4, 7)], [("a", "b"), ("c", "d")], Mesh(2), "none", [False] * 2)
        mesh_stages([(0, 3), (4, 7)], [("a", "b"), ("c", "d")], Mesh(2), "none",
                    [False] * 2, degrees=[2, 1])   # stage 1: two replicas of one device
    """
    shard = [sharding] * len(ranges) if isinstance(sharding, str) else list(sharding)
    ts = [mesh.degree] * len(ranges) if degrees is None else list(degrees)
    return tuple(
        StageSpec(
            k,
            (int(a), int(b)),
            tuple(devs),
            bool(rc),
            tensor_parallel=t,
            sequence_parallel=mesh.sequence_parallel and t > 1,
            sharding=sh if len(devs) // t > 1 else "none",
        )
        for k, ((a, b), devs, sh, rc, t) in enumerate(
            zip(ranges, stage_devices, shard, recompute, ts, strict=True)
        )
    )


def shape_mesh(shape: PlanShape) -> Mesh:
    """The mesh a plan's moves keep: its first stage's degree, and sequence parallelism
    where any stage uses it (a plan of a degree per stage may start at degree 1).

    Example::

        shape_mesh(shape)   # Mesh(degree=2, sequence_parallel=True)
    """
    st0 = shape.stages[0]
    return Mesh(st0.tensor_parallel, any(st.sequence_parallel for st in shape.stages))


def stage_degrees(shape: PlanShape) -> list[int] | None:
    """Each stage's tensor-parallel degree where they differ, None where they are one.

    Example::

        stage_degrees(shape)   # None, or e.g. [2, 2, 1]
    """
    degrees = [st.tensor_parallel for st in shape.stages]
    return degrees if len(set(degrees)) > 1 else None


def mesh_recompute(
    search: Search, stages: Sequence[StageSpec], schedule: str, mb: int, m: int, virtual: int = 1
) -> tuple[bool, ...]:
    """Recompute exactly the stages where one member's memory (its shard, sharded state,
    FSDP's gathered weights, its share of the in-flight microbatches) overflows the
    stage's smallest device (a ``virtual``-th of it per chunk).

    Example::

        mesh_recompute(search, stages, "1f1b", 4, 8)   # (False, True)
    """
    count = len(stages)
    rounds = replica_round([st.replicas for st in stages], m)
    versions = weight_versions(schedule)
    flags = []
    for k, st in enumerate(stages):
        plain = st.with_recompute(False)
        limit = min(search.topology.device(d).memory_bytes for d in st.devices) / virtual
        held = held_per_replica(schedule, count, k, m, st.replicas, virtual, rounds)
        need = member_memory_bytes(search.profile, plain, mb, held, weight_versions=versions)
        flags.append(need > limit)
    return tuple(flags)


def mesh_shape(
    search: Search,
    ranges: Ranges,
    stage_devices: Sequence[Sequence[str]],
    mesh: Mesh,
    sharding: str | Sequence[str],
    schedule: str,
    mb: int,
    m: int,
    virtual: int = 1,
    recompute: Sequence[bool] | None = None,
    degrees: Sequence[int] | None = None,
) -> PlanShape:
    """The candidate for these stages on ``mesh`` (or a degree per stage:
    :func:`mesh_stages`); recompute as given or where a member's memory needs it
    (:func:`mesh_recompute`); a stage without parameters is never sharded (nothing to
    shard: the simulator refuses it).

    Example::

        mesh_shape(search, [(0, 7)], [("gpu0", "gpu1")], Mesh(2), "none", "1f1b", 4, 8)
    """
    shard = [sharding] * len(ranges) if isinstance(sharding, str) else list(sharding)
    layers = search.profile.layers
    shard = [
        sh if any(ly.param_bytes for ly in layers[a : b + 1]) else "none"
        for (a, b), sh in zip(ranges, shard, strict=True)
    ]
    stages = mesh_stages(ranges, stage_devices, mesh, shard, [False] * len(ranges), degrees)
    if recompute is None:
        recompute = mesh_recompute(search, stages, schedule, mb, m, virtual)
    stages = tuple(st.with_recompute(bool(rc)) for st, rc in zip(stages, recompute, strict=True))
    stages = recompute_units(search.profile, stages, schedule, mb, m, virtual, search.units)
    return PlanShape(stages, schedule, mb, m, virtual)


def mesh_costs(
    search: Search, mesh: Mesh, group: Sequence[str], mb: int, shards: int = 1
) -> LayerCosts:
    """One member's layer costs on ``mesh`` at microbatch size ``mb``: its shard's times
    with each layer's collectives on ``group``'s ring added to the forward (and, the
    backward's, to the backward), its weights, gradients and ``1 / shards`` of its
    optimizer state (cached per search).

    Example::

        mesh_costs(search, Mesh(2), ("gpu0", "gpu1"), 4).fwd[-1]   # ms, collectives in
    """
    key = ("mesh costs", mesh, tuple(group), mb, shards)
    hit = search.notes.get(key)
    if isinstance(hit, LayerCosts):
        return hit
    profile = search.profile
    n = profile.num_layers
    whole = StageSpec(
        0,
        (0, n - 1),
        tuple(group),
        tensor_parallel=mesh.degree,
        sequence_parallel=mesh.sequence_parallel,
    )
    view = shard_view(profile, whole)
    costs = layer_costs(view, mb)
    fwd = np.zeros(n)
    bwd = np.zeros(n)
    if mesh.degree > 1:
        for i in range(n):
            one = dataclasses.replace(whole, layers=(i, i))
            fwd[i], bwd[i] = pass_collective_ms(profile, search.topology, one, group, mb)
    state = [
        ly.param_bytes + ly.gradient_bytes + -(-ly.optimizer_state_bytes // shards)
        for ly in view.layers
    ]
    costs = dataclasses.replace(
        costs,
        fwd=costs.fwd + np.concatenate([[0.0], np.cumsum(fwd)]),
        bwd=costs.bwd + np.concatenate([[0.0], np.cumsum(bwd)]),
        static=np.concatenate([[0.0], np.cumsum(state, dtype=float)]),
        cache={},
    )
    search.notes[key] = costs
    return costs


def _slot(search: Search, devices: Sequence[str], t: int, virtual: int) -> Slot:
    """A stage's groups as one DP slot: its replicas' first members, the slowest member's
    speed, the smallest memory (a ``virtual``-th per chunk), the all-reduce ring of the
    first members."""
    key = ("mesh slot", tuple(devices), t, virtual)
    hit = search.notes.get(key)
    if isinstance(hit, Slot):
        return hit
    topo = search.topology
    leaders = tuple(devices[::t])
    devs = [topo.device(d) for d in devices]
    ring = None
    if len(leaders) > 1:
        ring = Linear.fit(lambda nbytes: topo.allreduce_ms(list(leaders), nbytes))
    memory = float(min(d.memory_bytes for d in devs)) / virtual
    slot = search.notes[key] = Slot(leaders, min(d.speed for d in devs), memory, ring)
    return slot


def mesh_cuts(
    search: Search,
    mesh: Mesh,
    stage_devices: Sequence[Sequence[str]],
    schedule: str,
    mb: int,
    m: int,
    *,
    sharded: bool = False,
    virtual: int = 1,
) -> list[tuple[tuple[tuple[int, int], ...], tuple[bool, ...] | None]]:
    """Layer ranges (with the DP's recompute flags, None for the even split) over these
    stages (in order, each holding ``virtual`` chunks placed as given): the DP's split with
    its whole model (collectives, the all-reduce's share, the transfers), its split on
    compute alone, and the equal-layer split; distinct, best estimate first (cached).

    Example::

        mesh_cuts(search, Mesh(2), [("a", "b"), ("c", "d")], "1f1b", 4, 8)
    """
    key = ("mesh cuts", mesh, tuple(map(tuple, stage_devices)), schedule, mb, m, sharded, virtual)
    hit = search.notes.get(key)
    if isinstance(hit, list):
        return list(hit)
    t = mesh.degree
    k = len(stage_devices)
    r = len(stage_devices[0]) // t
    costs = mesh_costs(search, mesh, stage_devices[0][:t], mb, r if sharded else 1)
    slots = [_slot(search, devs, t, virtual) for devs in stage_devices]
    rounds = replica_round([len(d) // t for d in stage_devices], m)
    stashed = [in_flight(schedule, k, i, m, virtual, rounds) for i in range(k)]
    links = [
        transfer_cost(search.topology, a.devices[0], b.devices[0])
        for a, b in zip(slots, slots[1:], strict=False)
    ]
    out: list[tuple[tuple[tuple[int, int], ...], tuple[bool, ...] | None]] = []
    bare = [dataclasses.replace(sl, allreduce=None) for sl in slots]
    for variant, link in ((slots, links), (bare, None)):
        part = partition_chain(
            costs,
            variant,
            in_flight=stashed,
            num_microbatches=m,
            links=link,
            weight_versions=weight_versions(schedule),
        )
        if part is not None:
            out.append((tuple(part.ranges), tuple(part.recompute)))
    if k <= search.profile.num_layers:
        out.append((tuple(uniform_partition(search.profile.num_layers, k)), None))
    seen: set[tuple[tuple[int, int], ...]] = set()
    unique = []
    for ranges, rc in out:
        if ranges not in seen:
            seen.add(ranges)
            unique.append((ranges, rc))
    search.notes[key] = unique
    return list(unique)


def mesh_estimate_ms(search: Search, shape: PlanShape) -> float:
    """A quick estimate of ``shape``'s iteration (a mesh plan with one chunk per device),
    to rank a sweep before its bounds are worked out: the largest over stages of the
    first microbatch's forward through the stages before it, the stage's ``ceil(m / r)``
    microbatches, then the larger of the backward back through them and its replicas'
    sync and step (an FSDP stage's gather before it all), collectives on the first
    group's ring; infinite where a member's
    weights, gradients and optimizer state alone overflow. From the mesh DP's prefix costs
    (:func:`mesh_costs`), so a few operations per stage.

    Example::

        mesh_estimate_ms(search, shape)   # ms
    """
    st0 = shape.stages[0]
    mesh = Mesh(st0.tensor_parallel, st0.sequence_parallel)
    t, m, mb = mesh.degree, shape.num_microbatches, shape.microbatch_size
    head = tail = 0.0
    best = 0.0
    group = st0.devices[:t]  # every stage's collectives timed on the first group's ring
    for st in shape.stages:
        r = st.replicas
        costs = mesh_costs(search, mesh, group, mb, r if st.sharding != "none" else 1)
        slot = _slot(search, st.devices, t, 1)
        a, b = st.first, st.last + 1
        static = costs.static[b] - costs.static[a]
        if static > slot.memory_bytes:
            return float("inf")
        f = (costs.fwd[b] - costs.fwd[a]) / slot.speed
        back = (costs.bwd[b] - costs.bwd[a]) / slot.speed + (f if st.recompute else 0.0)
        params = costs.params[b] - costs.params[a]
        sync = float(slot.allreduce(params)) if slot.allreduce is not None else 0.0
        step = _step_ms(search, mesh, st) / slot.speed / (r if st.sharding != "none" else 1)
        lead = sync / 2 if st.sharding == "fsdp" else 0.0
        count = -(-m // r)
        best = max(best, head + lead + count * (f + back) + max(tail, sync + step))
        head += f
        tail += back
    return best


def _step_ms(search: Search, mesh: Mesh, st: StageSpec) -> float:
    """The optimizer step of one member's shard of ``st``'s layers (speed 1)."""
    key = ("mesh step", mesh.degree, st.first, st.last)
    hit = search.notes.get(key)
    if isinstance(hit, float):
        return hit
    whole = StageSpec(0, st.layers, st.devices[: mesh.degree], tensor_parallel=mesh.degree)
    view = shard_view(search.profile, whole)
    ms = search.notes[key] = float(
        sum(ly.optimizer_ms for ly in view.layers[st.first : st.last + 1])
    )
    return ms
