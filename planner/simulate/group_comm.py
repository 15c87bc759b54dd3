"""Communication of tensor-parallel groups and sharded replicas, timed on the topology.

* A tensor-parallel layer's collectives (:class:`~planner.profile.sharding.Collective`)
  run on its group's ring (:meth:`~planner.topology.Topology.allreduce_ms`, the better of
  the group's order and the order grouped by host): an all-reduce takes the ring
  all-reduce's time, a reduce-scatter or an all-gather half of it (``n - 1`` of its
  ``2 (n - 1)`` steps), so sequence parallelism's pair costs what the all-reduce does.
  :func:`pass_collective_ms` sums them per pass.
* A replicated stage's gradients meet on ``t`` parallel rings, ring ``i`` over member ``i``
  of every replica (each member holds its own shard); the slowest ring sets the time
  (:func:`replica_sync_ms`): an all-reduce, or under ZeRO-1 / FSDP a reduce-scatter.
  :func:`gather_ms` is their all-gather of the weights (ZeRO-1 after the step, FSDP at the
  first forward).
* A transfer between two groups is ``t`` transfers, member ``i`` to member ``i``
  (:func:`group_transfer`): it holds every link any of them uses, for the slowest, with
  the member transfers that share a link sharing its bandwidth.

Contention between these and the pipeline's transfers is not modelled (as for the
all-reduce of plain data parallelism), nor between the ``t`` parallel rings.

Example::

    forward_ms, backward_ms = pass_collective_ms(profile, topology, stage, ("gpu0", "gpu1"), 4)
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.cost import stage_param_bytes, stage_tied_parameters
from planner.profile.schema import Profile
from planner.profile.sharding import Collective, shard_key
from planner.simulate.shards import shard_view
from planner.stages import StageSpec, boundary_peers

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "collective_ms",
    "gather_ms",
    "group_transfer",
    "group_transfer_ms",
    "groups_collective_ms",
    "pass_collective_ms",
    "pass_collectives",
    "replica_sync_ms",
    "sum_collectives_ms",
]


@functools.lru_cache(maxsize=4096)
def _ring_ms(topology: Topology, devices: tuple[str, ...], nbytes: int) -> float:
    # Every layer of every stage asks for the same few (group, size) pairs; the ring's
    # routes are the costly part. (Topologies compare by identity.)
    return topology.allreduce_ms(list(devices), nbytes)


def collective_ms(topology: Topology | None, group: Sequence[str], c: Collective) -> float:
    """One collective on ``group``'s ring: all-reduce the ring all-reduce, reduce-scatter
    and all-gather half of it; 0 without a topology (free communication).

    Example::

        collective_ms(topology, ("gpu0", "gpu1"), Collective("all_gather", 2**20, "forward"))
    """
    if topology is None or len(group) < 2:
        return 0.0
    full = _ring_ms(topology, tuple(group), c.bytes)
    return full if c.op == "all_reduce" else full / 2


def pass_collective_ms(
    profile: Profile,
    topology: Topology | None,
    stage: StageSpec,
    group: Sequence[str],
    microbatch_size: int,
) -> tuple[float, float]:
    """``(forward_ms, backward_ms)``: one microbatch's collectives of the stage's layers on
    ``group`` (the backward's are its input half's).

    Example::

        pass_collective_ms(profile, topology, stage, stage.replica_groups[0], 4)
    """
    return sum_collectives_ms(topology, group, pass_collectives(profile, stage, microbatch_size))


def pass_collectives(
    profile: Profile, stage: StageSpec, microbatch_size: int
) -> tuple[Collective, ...]:
    """The collectives of one microbatch's passes through the stage's layers, in layer
    order (none without tensor parallelism).

    Example::

        [c.op for c in pass_collectives(profile, stage, 4)]
    """
    if stage.tensor_parallel == 1:
        return ()
    key = shard_key(stage.tensor_parallel, sequence_parallel=stage.sequence_parallel)
    timings = profile.measurement(microbatch_size).layers[stage.first : stage.last + 1]
    return tuple(c for timing in timings for c in timing.sharded[key].collectives)


def sum_collectives_ms(
    topology: Topology | None, group: Sequence[str], collectives: Sequence[Collective]
) -> tuple[float, float]:
    """``(forward_ms, backward_ms)`` of ``collectives`` on ``group``, summed in their order.

    Example::

        sum_collectives_ms(topology, ("gpu0", "gpu1"), pass_collectives(profile, stage, 4))
    """
    forward = backward = 0.0
    for c in collectives:
        ms = collective_ms(topology, group, c)
        if c.phase == "forward":
            forward += ms
        else:
            backward += ms
    return forward, backward


def groups_collective_ms(
    topology: Topology | None,
    groups: Sequence[Sequence[str]],
    collectives: Sequence[Collective],
) -> list[tuple[float, float]]:
    """:func:`sum_collectives_ms` of each group: groups whose rings time every distinct
    collective (operation and bytes) alike share one sum (the same numbers in the same
    order: the same floats), so a stage of a hundred groups sums its layers' collectives
    once or twice, not a hundred times.

    Example::

        groups_collective_ms(topology, stage.replica_groups, pass_collectives(profile, stage, 4))
    """
    distinct = list({(c.op, c.bytes): c for c in collectives}.values())
    sums: dict[tuple[float, ...], tuple[float, float]] = {}
    out = []
    for group in groups:
        times = tuple(collective_ms(topology, group, c) for c in distinct)
        hit = sums.get(times)
        if hit is None:
            hit = sums[times] = sum_collectives_ms(topology, group, collectives)
        out.append(hit)
    return out


def _rings(stage: StageSpec) -> list[tuple[str, ...]]:
    """Ring ``i``: member ``i`` of every replica."""
    groups = stage.replica_groups
    return [tuple(g[i] for g in groups) for i in range(stage.tensor_parallel)]


def replica_sync_ms(profile: Profile, topology: Topology | None, stage: StageSpec) -> float:
    """The stage's ALLREDUCE: its gradients (less the tied ones, exchanged apart) on the
    slowest of its per-member rings; a reduce-scatter (half) under ZeRO-1 and FSDP.

    Example::

        replica_sync_ms(profile, topology, stage)
    """
    if topology is None or stage.replicas < 2:
        return 0.0
    view = shard_view(profile, stage)
    tied = sum(t.param_bytes for t in stage_tied_parameters(view, stage.first, stage.last))
    grads = stage_param_bytes(view, stage.first, stage.last) - tied
    full = max(_ring_ms(topology, ring, grads) for ring in _rings(stage))
    return full if stage.sharding == "none" else full / 2


def gather_ms(profile: Profile, topology: Topology | None, stage: StageSpec) -> float:
    """ZeRO-1 / FSDP: the all-gather of the stage's weights over its replicas, on the
    slowest per-member ring; 0 without sharding.

    Example::

        gather_ms(profile, topology, with_parallelism(stages, sharding="fsdp")[0])
    """
    if topology is None or stage.sharding == "none":
        return 0.0
    params = stage_param_bytes(shard_view(profile, stage), stage.first, stage.last)
    return max(_ring_ms(topology, ring, params) for ring in _rings(stage)) / 2


def group_transfer(
    topology: Topology, sources: Sequence[str], targets: Sequence[str], nbytes: int
) -> tuple[list[tuple[str, str]], float, float]:
    """Member ``i`` of ``sources`` sends ``nbytes`` to member ``i`` of ``targets`` (of
    groups of different sizes: :func:`~planner.stages.boundary_peers`), all at once:
    ``(links, latency_ms, wire_ms)`` of the whole, every link any of them uses held for
    the longest latency plus the busiest link's bytes over its bandwidth.

    Example::

        group_transfer(topology, ("gpu0", "gpu1"), ("gpu4", "gpu5"), 2**20)
    """
    key = (tuple(sources), tuple(targets))
    use, latency = _group_route(topology, *key)
    wire = 0.0
    if nbytes:
        per = _GROUP_WIRES.get(topology)
        if per is None:
            per = _GROUP_WIRES[topology] = {}
        found = per.get((*key, nbytes))
        if found is None:
            found = max(
                (n * nbytes / topology.link_bandwidth(*hop) * 1e3 for hop, n in use.items()),
                default=0.0,
            )
            if len(per) >= _MAX_GROUP_ROUTES:
                per.clear()
            per[(*key, nbytes)] = found
        wire = found
    return list(use), latency, wire


# The links member-to-member transfers use and their longest latency, per topology and
# pair of groups: a solve times the same pairs of groups in every candidate and bound
# (a bounded cache, like the topology's own route caches).
_GroupRoute = tuple[dict[tuple[str, str], int], float]
_GROUP_ROUTES: weakref.WeakKeyDictionary[
    Topology, dict[tuple[tuple[str, ...], tuple[str, ...]], _GroupRoute]
] = weakref.WeakKeyDictionary()
_MAX_GROUP_ROUTES = 1 << 16
# Their wire times per pair of groups and bytes (the bandwidths are the topology's: fixed).
_GROUP_WIRES: weakref.WeakKeyDictionary[
    Topology, dict[tuple[tuple[str, ...], tuple[str, ...], int], float]
] = weakref.WeakKeyDictionary()


def _group_route(
    topology: Topology, sources: tuple[str, ...], targets: tuple[str, ...]
) -> _GroupRoute:
    """How many of the member pairs' routes use each directed link, and the longest
    route latency (cached per topology; see :func:`group_transfer`)."""
    per = _GROUP_ROUTES.get(topology)
    if per is None:
        per = _GROUP_ROUTES[topology] = {}
    key = (sources, targets)
    hit = per.get(key)
    if hit is not None:
        return hit
    use: dict[tuple[str, str], int] = {}
    latency = 0.0
    pairs = (
        zip(sources, targets, strict=True)
        if len(sources) == len(targets)
        else boundary_peers(sources, targets)
    )
    for a, b in pairs:
        if a == b:
            continue
        latency = max(latency, topology.latency_ms(a, b))
        for hop in topology.route_links(a, b):
            use[hop] = use.get(hop, 0) + 1
    if len(per) >= _MAX_GROUP_ROUTES:
        per.clear()
    per[key] = (use, latency)
    return use, latency


def group_transfer_ms(
    topology: Topology, sources: Sequence[str], targets: Sequence[str], nbytes: int
) -> float:
    """:func:`group_transfer`'s time, ``latency + wire``.

    Example::

        group_transfer_ms(topology, ("gpu0", "gpu1"), ("gpu4", "gpu5"), 2**20)
    """
    _, latency, wire = group_transfer(topology, sources, targets, nbytes)
    return latency + wire
