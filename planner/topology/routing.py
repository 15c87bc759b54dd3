"""Routes through a topology graph: widest bottleneck first, then fewest hops.

The all-pairs bottleneck comes from Kruskal's algorithm on the links, widest first (two
devices first share a component when the link joining their components is added); with
``relay: switches`` (devices do not forward) from a max-bottleneck Dijkstra per source that
does not expand other devices. The route itself is a breadth-first search over the links at
least that wide, neighbours in rank order, so ties go to the lexicographically smallest
fewest-hop route. Nodes are numbered by rank: devices first, in device order.

Example::

    bottleneck = all_pairs_bottleneck(graph, rank, num_devices)
    parent, hops, latency = fewest_hops(adjacency, 0, bottleneck[0, 3], [3])
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

import networkx as nx
import numpy as np

__all__ = ["all_pairs_bottleneck", "fewest_hops", "first_duplicate", "widest_from"]


def all_pairs_bottleneck(graph: nx.Graph, rank: dict[str, int], n: int) -> np.ndarray:
    """Widest-path bottleneck of every device pair (Kruskal on links, widest first).

    Two devices first share a component when the link that joins their components is added;
    that link's bandwidth is the best bottleneck any route between them can have.

    Example::

        width = all_pairs_bottleneck(graph, rank, len(devices))   # width[i, j]: bytes/s
    """
    out = np.zeros((n, n), dtype=np.float64)
    np.fill_diagonal(out, math.inf)
    parent = list(range(len(rank)))
    members: list[list[int]] = [[i] if i < n else [] for i in range(len(rank))]

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    edges = sorted(
        ((float(d["bandwidth"]), rank[u], rank[v]) for u, v, d in graph.edges(data=True)),
        key=lambda e: -e[0],
    )
    for width, u, v in edges:
        ru, rv = find(u), find(v)
        if ru == rv:
            continue
        a, b = members[ru], members[rv]
        if a and b:
            out[np.ix_(a, b)] = width
            out[np.ix_(b, a)] = width
        if len(a) < len(b):
            ru, rv, a, b = rv, ru, b, a
        parent[rv] = ru
        a.extend(b)
        members[rv] = []
    return out


def widest_from(adj: list[list[tuple[int, float, float]]], source: int, n: int) -> np.ndarray:
    """Best bottleneck from ``source`` to every device when devices do not forward traffic.

    A max-bottleneck Dijkstra (the bottleneck has optimal substructure) that does not expand
    devices other than ``source``; ranks ``< n`` are devices. Unreachable devices get 0.

    Example::

        widest_from(adj, rank["gpu0"], n)[rank["gpu3"]]   # best bottleneck gpu0 -> gpu3
    """
    best = [0.0] * len(adj)
    best[source] = math.inf
    heap = [(-math.inf, source)]
    done = [False] * len(adj)
    while heap:
        neg, u = heapq.heappop(heap)
        if done[u]:
            continue
        done[u] = True
        if u < n and u != source:
            continue  # a device: an endpoint, not a relay
        for v, bw, _ in adj[u]:
            width = min(-neg, bw)
            if width > best[v]:
                best[v] = width
                heapq.heappush(heap, (-width, v))
    return np.asarray(best[:n], dtype=np.float64)


def fewest_hops(
    adj: list[list[tuple[int, float, float]]],
    source: int,
    width: float,
    targets: list[int],
    endpoints_below: int | None = None,
) -> tuple[list[int], list[int], list[float]]:
    """Breadth-first search from ``source`` over links of bandwidth >= ``width``.

    Returns parent, hop count and summed latency per node (-1 / 0 for unvisited nodes); stops
    as soon as every target has been reached. Nodes of rank below ``endpoints_below`` (devices,
    under ``relay: switches``) other than the source are reached but not expanded. Neighbours
    are visited in rank order, so each route is the lexicographically smallest among the
    fewest-hop ones.

    Example::

        parent, hops, latency = fewest_hops(adj, src, width, [dst])
    """
    size = len(adj)
    parent = [-1] * size
    hops = [0] * size
    lat = [0.0] * size
    parent[source] = source
    wanted = set(targets)
    queue = [source]
    head = 0
    while head < len(queue) and wanted:
        u = queue[head]
        head += 1
        if endpoints_below is not None and u < endpoints_below and u != source:
            continue
        for v, bw, link_lat in adj[u]:
            if bw < width or parent[v] != -1:
                continue
            parent[v] = u
            hops[v] = hops[u] + 1
            lat[v] = lat[u] + link_lat
            queue.append(v)
            wanted.discard(v)
    return parent, hops, lat


def first_duplicate(names: Iterable[str]) -> str:
    """The first name that comes twice ("" when none does).

    Example::

        first_duplicate(["gpu0", "gpu1", "gpu0"])   # "gpu0"
    """
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return ""
