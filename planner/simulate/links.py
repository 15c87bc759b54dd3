"""Transfers over the topology's links: each send's route, and the order each link serves
its transfers in.

A send is named by its *way*, ``(src * devices + dst) * cuts + cut``: the devices it goes
between and the cut it crosses (its receiving stage's input, or its gradient), which fix
its route and its bytes. Links are numbered in the order routes first use them.

Each directed link carries one transfer at a time and serves them in a fixed order: the
order in which their data becomes ready in a *reference run* of the same programs with
the profile's times on speed-1 devices and free communication (ties: the order the sends
ran). It does not depend on device speeds or link bandwidths, which keeps the simulated
times monotone in them (first-come-first-served by actual time is not: a slower device
can reorder a queue and finish earlier), and it cannot deadlock: the reference run is a
valid execution in which every transfer is ready after everything it depends on.

Example::

    link_ids: dict[tuple[str, str], int] = {}
    route = route_of_way(topology, devices, cut, way, link_ids)
    route.links, route.wire_ms
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["NO_ROUTE", "LinkQueues", "Route", "link_queues", "route_of_way", "way_of_send"]


class Route(NamedTuple):
    """How a transfer goes: the links it holds, for ``latency_ms + wire_ms`` (its bytes over
    the bottleneck bandwidth), between devices ``src`` and ``dst`` (indices)."""

    links: tuple[int, ...]
    latency_ms: float
    wire_ms: float
    src: int
    dst: int
    nbytes: int


# The route of a key that no send has (its entry in ``LinkQueues.route_of``).
NO_ROUTE = Route((), 0.0, 0.0, -1, -1, 0)


class LinkQueues(NamedTuple):
    """Per transfer key its route (``NO_ROUTE``: no transfer), and per link the keys it
    serves in order, each queue ending with the key ``num_keys`` (never ready)."""

    route_of: list[Route]
    queues: list[list[int]]


def way_of_send(src: int, dst: int, key: int, num_devices: int, cuts: int, total_mb: int) -> int:
    """The way of a send of transfer ``key`` from device ``src`` to ``dst``.

    Example::

        way_of_send(0, 1, 16, 2, 3, 8)    # activations into stage 1: cut 1
    """
    return (src * num_devices + dst) * cuts + (key >> 1) // total_mb + (key & 1)


def route_of_way(
    topology: Topology,
    devices: list[str],
    cut: list[int],
    way: int,
    link_ids: dict[tuple[str, str], int],
) -> Route:
    """The route of a way; numbers links not in ``link_ids`` yet in the order met.

    Example::

        route_of_way(topology, ["gpu0", "gpu1"], [0, 4096], 4, {})   # gpu0 -> gpu1, cut 1
    """
    pair, c = divmod(way, len(cut) + 1)
    src, dst = divmod(pair, len(devices))
    a, b = devices[src], devices[dst]
    ids = tuple(link_ids.setdefault(hop, len(link_ids)) for hop in topology.route_links(a, b))
    nbytes = cut[c]
    wire_ms = nbytes / topology.bandwidth(a, b) * 1e3 if nbytes else 0.0
    return Route(ids, topology.latency_ms(a, b), wire_ms, src, dst, nbytes)


def link_queues(
    topology: Topology,
    devices: list[str],
    cut: list[int],
    total_mb: int,
    sends: Sequence[tuple[int, int, int]],
    ready: list[float],
) -> LinkQueues:
    """Each transfer's route, and per link the order it serves transfers in.

    ``sends`` lists the reference run's sends in the order they ran, as ``(src, dst,
    key)``; ``ready[key]`` is when the data of ``key`` was ready there. Each link's queue
    is sorted stably by ready time, which keeps the run's order among equal times; each
    device's sends are in time order already, so a queue is a merge of sorted runs: cheap.

    Example::

        link_queues(topology, devices, cut, 8, [(0, 1, 16)], ready).queues   # [[16, 32]]
    """
    n, cuts = len(devices), len(cut) + 1
    num_keys = len(ready)
    link_ids: dict[tuple[str, str], int] = {}
    queues: list[list[int]] = []
    route_of = [NO_ROUTE] * num_keys
    # Per way: the route, and the appends to its links' queues.
    ways: dict[int, tuple[Route, list[Callable[[int], None]]]] = {}
    for src, dst, key in sends:
        way = way_of_send(src, dst, key, n, cuts, total_mb)
        found = ways.get(way)
        if found is None:
            route = route_of_way(topology, devices, cut, way, link_ids)
            queues.extend([] for _ in range(len(link_ids) - len(queues)))
            found = ways[way] = (route, [queues[link].append for link in route.links])
        route_of[key] = found[0]
        for append in found[1]:
            append(key)
    for queue in queues:
        queue.sort(key=ready.__getitem__)
        queue.append(num_keys)
    return LinkQueues(route_of, queues)
