"""Transfers over the topology's links: each send's route, and the order each link serves
its transfers in.

A send is named by its *way*, ``(src * devices + dst) * cuts + cut`` (:func:`send_ways`):
the devices it goes between and the cut it crosses (its receiving stage's input, or its
gradient), which fix its route and its bytes. Links are numbered in the order routes first use them.
Between tensor-parallel groups (their leaders stand for them in the programs) a send is
the members' transfers together (:func:`planner.simulate.group_comm.group_transfer`).

Each directed link carries one transfer at a time and serves them in a fixed order: the
order in which their data becomes ready in a *reference run* of the same programs with
the profile's times on speed-1 devices and free communication (ties: the order the sends
ran). It does not depend on device speeds or link bandwidths, which keeps the simulated
times monotone in them (first-come-first-served by actual time is not: a slower device
can reorder a queue and finish earlier), and it cannot deadlock: the reference run is a
valid execution in which every transfer is ready after everything it depends on.

Example::

    links, latency_ms, wire_ms, src, dst, nbytes = route_of_way(topology, devices, cut, way, {})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from planner.simulate.group_comm import group_transfer
from planner.simulate.program import Program
from planner.simulate.reshard import reshard_transfer

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["NO_ROUTE", "LinkQueues", "Route", "link_queues", "route_of_way", "send_ways"]


# How a transfer goes: ``(links, latency_ms, wire_ms, src, dst, nbytes)``: the links it
# holds, for ``latency_ms + wire_ms`` (its bytes over the bottleneck bandwidth), between
# devices ``src`` and ``dst`` (indices). A plain tuple, not a NamedTuple: the engines
# unpack one per transfer, and a tuple subclass unpacks more slowly.
Route = tuple[tuple[int, ...], float, float, int, int, int]


# The route of a key that no send has (its entry in ``LinkQueues.route_of``).
NO_ROUTE: Route = ((), 0.0, 0.0, -1, -1, 0)


class LinkQueues(NamedTuple):
    """Per transfer key its route (``NO_ROUTE``: no transfer), and per link the keys it
    serves in order, each queue ending with the key ``num_keys`` (never ready).

    Example::

        route_of, queues = link_queues(topology, devices, cut, ways, sends, ready)
    """

    route_of: list[Route]
    queues: list[list[int]]


def send_ways(programs: list[Program], num_keys: int, total_mb: int, num_stages: int) -> list[int]:
    """Per transfer key the way of its send (-1 for a key that no send has).

    Example::

        send_ways(programs, 32, 8, 2)[16]    # gpu0 -> gpu1, activations into stage 1: 4
    """
    n, cuts = len(programs), num_stages + 1
    ways = [-1] * num_keys
    for src, prog in enumerate(programs):
        for _, _, _, _, _, key, dst in prog:
            if key >= 0:
                # The cut it crosses: its receiving stage's input, or its gradient.
                ways[key] = (src * n + dst) * cuts + (key >> 1) // total_mb + (key & 1)
    return ways


def route_of_way(
    topology: Topology,
    devices: list[str],
    cut: list[int],
    way: int,
    link_ids: dict[tuple[str, str], int],
    groups: Mapping[str, tuple[str, ...]] | None = None,
) -> Route:
    """The route of a way; numbers links not in ``link_ids`` yet in the order met.
    ``groups``: each tensor-parallel leader's group, whose members send together (a
    :class:`~planner.simulate.reshard.Groups` with resharded boundaries: their pieces).

    Example::

        route_of_way(topology, ["gpu0", "gpu1"], [0, 4096], 4, {})   # gpu0 -> gpu1, cut 1
    """
    pair, c = divmod(way, len(cut) + 1)
    src, dst = divmod(pair, len(devices))
    a, b = devices[src], devices[dst]
    nbytes = cut[c]
    reshard = getattr(groups, "reshard", None)  # a Groups with resharded boundaries
    parts = reshard.of_cut(c) if reshard is not None else None
    if parts is not None and groups is not None:
        sources, targets = groups.get(a, (a,)), groups.get(b, (b,))
        split = (a in reshard.split, b in reshard.split)  # type: ignore[union-attr]
        hops, latency, wire = reshard_transfer(topology, sources, targets, split, parts)
        ids = tuple(link_ids.setdefault(hop, len(link_ids)) for hop in hops)
        return (ids, latency, wire, src, dst, sum(parts))
    if groups and (a in groups or b in groups):
        hops, latency, wire = group_transfer(
            topology, groups.get(a, (a,)), groups.get(b, (b,)), nbytes
        )
        ids = tuple(link_ids.setdefault(hop, len(link_ids)) for hop in hops)
        return (ids, latency, wire, src, dst, nbytes)
    ids = tuple(link_ids.setdefault(hop, len(link_ids)) for hop in topology.route_links(a, b))
    wire_ms = nbytes / topology.bandwidth(a, b) * 1e3 if nbytes else 0.0
    return (ids, topology.latency_ms(a, b), wire_ms, src, dst, nbytes)


def link_queues(
    topology: Topology,
    devices: list[str],
    cut: list[int],
    ways: list[int],
    sends: list[int],
    ready: list[float],
    groups: Mapping[str, tuple[str, ...]] | None = None,
) -> LinkQueues:
    """Each transfer's route, and per link the order it serves transfers in.

    ``ways``: per key its send's way (:func:`send_ways`); ``sends``: the reference run's
    sends (their keys) in the order they ran; ``ready[key]``: when the data of ``key`` was
    ready there. Each link's queue is sorted stably by ready time, which keeps the run's
    order among equal times; each device's sends are in time order already, so a queue is
    a merge of sorted runs: cheap.

    Example::

        link_queues(topology, devices, cut, ways, [16], ready).queues   # [[16, 32], [16, 32]]
    """
    num_keys = len(ready)
    link_ids: dict[tuple[str, str], int] = {}
    queues: list[list[int]] = []
    route_of = [NO_ROUTE] * num_keys
    # Per way: the route, and the appends to its links' queues.
    found: dict[int, tuple[Route, list[Callable[[int], None]]]] = {}
    for key in sends:
        way = ways[key]
        known = found.get(way)
        if known is None:
            route = route_of_way(topology, devices, cut, way, link_ids, groups)
            queues.extend([] for _ in range(len(link_ids) - len(queues)))
            known = found[way] = (route, [queues[link].append for link in route[0]])
        route_of[key] = known[0]
        for append in known[1]:
            append(key)
    for queue in queues:
        queue.sort(key=ready.__getitem__)
        queue.append(num_keys)
    return LinkQueues(route_of, queues)
