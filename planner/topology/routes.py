"""A topology's routes, worked out on first use and kept in bounded caches.

Nothing is tabulated for all device pairs: loading a topology builds only the
:class:`~planner.topology.routing.BottleneckTree` (relay through any vertex; linear in the
links) or nothing (``relay: switches``). The first question about a pair runs the
breadth-first search of its source at its bottleneck just far enough to reach it
(:class:`~planner.topology.routing.HopSearch`, kept and resumed for the source's next
pair of the same width) and keeps the answer: bottleneck, latency, hops and route. A solve
asks about the pairs its plans use (neighbouring stages, replica rings), so it pays for
those only. Every cache is bounded (:data:`CACHE_BYTES` per kind) and emptied when full;
an answer worked out again is the same answer, bit for bit.

Example::

    table = RouteTable(adj, nodes, n, relay_devices=True)
    bandwidth, latency_ms, hops, path = table.pair(0, 5)   # path: ('gpu0', ..., 'gpu5')
"""

from __future__ import annotations

import math

import numpy as np

from planner.topology.routing import (
    Adjacency,
    BottleneckTree,
    HopSearch,
    all_pairs_bottleneck,
    widest_from,
)

__all__ = ["CACHE_BYTES", "PairRoute", "RouteTable"]

CACHE_BYTES = 64 * 2**20
"""What each cache may hold (searches, pair answers, ``relay: switches`` bottleneck rows),
about: enough for every pair of a topology of a few hundred devices, and for the pairs and
searches a solve on 16,384 devices uses."""

# One pair's answer, source to destination: (bottleneck bytes/s, latency ms, hops, route's
# node names). A plain tuple: transfer times read it in the solver's innermost loop.
PairRoute = tuple[float, float, int, tuple[str, ...]]

_PAIR_BYTES = 400  # a cached answer, both directions' keys and tuples, about
_NODE_BYTES = 300  # per node a kept search has reached: three dict entries and their numbers
_ROW_BYTES = 40  # per device of a kept relay: switches row (a list of floats)


class RouteTable:
    """Bottlenecks, latencies, hop counts and routes of device pairs, on demand.

    ``adj``: each node's links by rank, sorted (devices first, ranks ``< n``); ``nodes``:
    the names by rank; ``relay_devices``: whether devices forward traffic (``relay: all``).
    :attr:`known` maps ``(src, dst)`` names to answers already worked out (the
    :class:`~planner.topology.graph.Topology` reads it first).

    Example::

        table.pair(3, 0)[3]    # ('gpu3', 'gpu2', 'gpu0')
        table.bandwidth(0, 3)  # without working out the route
    """

    def __init__(self, adj: Adjacency, nodes: list[str], n: int, *, relay_devices: bool) -> None:
        self.adj = adj
        self.nodes = nodes
        self.n = n
        self.relay_devices = relay_devices
        self.tree = BottleneckTree(adj, n) if relay_devices else None
        self.known: dict[tuple[str, str], PairRoute] = {}
        self._searches: dict[tuple[int, float], HopSearch] = {}
        self._rows: dict[int, list[float]] = {}
        size = len(adj)
        self._max_pairs = max(1024, CACHE_BYTES // _PAIR_BYTES)
        self._max_nodes = max(size, CACHE_BYTES // _NODE_BYTES)
        self._max_searches = max(64, 4 * size)
        self._max_rows = max(8, CACHE_BYTES // (_ROW_BYTES * max(n, 1)))

    def bandwidth(self, i: int, j: int) -> float:
        """The best bottleneck between devices ``i`` and ``j`` (``inf`` when equal).

        Example::

            table.bandwidth(0, 3) / 1e9   # GB/s
        """
        if i == j:
            return math.inf
        if self.tree is not None:
            return self.tree.width(i, j)
        return self.bandwidth_row(min(i, j))[max(i, j)]

    def bandwidth_row(self, i: int) -> list[float]:
        """The best bottleneck from device ``i`` to every device, by index (``inf`` at
        ``i``): one climb of the tree, or one search under ``relay: switches``; kept.

        Example::

            table.bandwidth_row(0)[3]
        """
        row = self._rows.get(i)
        if row is None:
            if len(self._rows) >= self._max_rows:
                self._rows.clear()
            if self.tree is not None:
                row = self.tree.widths_from(i, self.n)
            else:
                row = widest_from(self.adj, i, self.n)
            self._rows[i] = row
        return row

    def pair(self, i: int, j: int) -> PairRoute:
        """The answer for devices ``i`` to ``j`` (``i != j``), worked out and kept if new.

        Worked out from the smaller index (as the route of ``j`` to ``i`` is this one
        reversed, and its latency is summed in that order).

        Example::

            bandwidth, latency_ms, hops, path = table.pair(0, 5)
        """
        names = self.nodes
        hit = self.known.get((names[i], names[j]))
        if hit is not None:
            return hit
        s, t = min(i, j), max(i, j)
        width = self.bandwidth(s, t)
        search = self._search(s, width)
        if not search.reach(t):  # cannot happen: the width says a route exists
            raise AssertionError(f"no route from {names[s]!r} to {names[t]!r}")
        back = tuple(names[k] for k in search.path(t))  # t .. s
        hops, latency = search.hops[t], search.latency_ms[t]
        if len(self.known) >= self._max_pairs:
            self.known.clear()
        self.known[names[t], names[s]] = down = (width, latency, hops, back)
        self.known[names[s], names[t]] = up = (width, latency, hops, back[::-1])
        return down if i > j else up

    def _search(self, source: int, width: float) -> HopSearch:
        key = (source, width)
        search = self._searches.get(key)
        if search is None:
            count = len(self._searches)
            # What the kept searches hold, counted every 32 new ones (they grow as used).
            if count >= self._max_searches or (
                count % 32 == 31 and sum(map(len, self._searches.values())) >= self._max_nodes
            ):
                self._searches.clear()
            below = None if self.relay_devices else self.n
            search = self._searches[key] = HopSearch(self.adj, source, width, below)
        return search

    def narrowest(self, devices: list[int]) -> float:
        """The narrowest bottleneck between two of ``devices`` (``inf`` for fewer than
        two). Relayed through any vertex, bottlenecks form an ultrametric (``b(a, c) >=
        min(b(a, b), b(b, c))``), so the pairs of the first device with the others hold
        it: linear. Under ``relay: switches`` every pair is asked.

        Example::

            table.narrowest([0, 8, 16])   # between hosts
        """
        if len(devices) < 2:
            return math.inf
        if self.tree is not None:
            row = self.bandwidth_row(devices[0])
            return min(row[k] for k in devices[1:])
        return min(self.bandwidth(a, b) for k, a in enumerate(devices) for b in devices[k + 1 :])

    def bandwidth_range(self) -> tuple[float, float] | None:
        """The narrowest and the widest bottleneck over device pairs (None for one device).

        Linear with relay through any vertex; with ``relay: switches`` every source's
        bottlenecks are worked out (devices squared).

        Example::

            low, high = table.bandwidth_range()
        """
        if self.tree is not None:
            widths = self.tree.device_widths()
        else:
            widths = [self.bandwidth(s, t) for s in range(self.n) for t in range(s + 1, self.n)]
        return (min(widths), max(widths)) if widths else None

    def bandwidth_matrix(self) -> np.ndarray:
        """Every pair's bottleneck, n x n (``inf`` on the diagonal): devices squared.

        Example::

            table.bandwidth_matrix()[0, 3]
        """
        if self.relay_devices:
            return all_pairs_bottleneck(self.adj, self.n)
        rows = [widest_from(self.adj, s, self.n) for s in range(self.n)]
        return np.asarray(rows, dtype=np.float64).reshape(self.n, self.n)

    def latency_matrix(self) -> np.ndarray:
        """Every pair's route latency in ms, n x n (0 on the diagonal): devices squared.

        Example::

            table.latency_matrix()[0, 3]
        """
        out = np.zeros((self.n, self.n), dtype=np.float64)
        for s in range(self.n):
            for t in range(s + 1, self.n):
                out[s, t] = out[t, s] = self.pair(s, t)[1]
        return out
