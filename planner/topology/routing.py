"""Routes through a topology graph: widest bottleneck first, then fewest hops.

The bottleneck of a device pair comes from Kruskal's algorithm on the links, widest first:
two devices first share a component when the link joining their components is added, and
:class:`BottleneckTree` keeps those merges as a tree (the pair's bottleneck is the width of
their lowest common ancestor), so no table of all pairs is ever built. With ``relay:
switches`` (devices do not forward) it comes from a max-bottleneck Dijkstra per source that
does not expand other devices (:func:`widest_from`). The route itself is a breadth-first
search over the links at least that wide, neighbours in rank order, so ties go to the
lexicographically smallest fewest-hop route; :class:`HopSearch` advances that search only
as far as the devices asked of it. Nodes are numbered by rank: devices first, in device
order.

Example::

    tree = BottleneckTree(adjacency, num_devices)
    search = HopSearch(adjacency, 0, tree.width(0, 3))
    search.reach(3), search.hops[3], search.latency_ms[3]
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

import numpy as np

__all__ = [
    "Adjacency",
    "all_pairs_bottleneck",
    "BottleneckTree",
    "HopSearch",
    "first_duplicate",
    "unreachable_without_relay",
    "widest_from",
]

# Per node (by rank) its links as (neighbour rank, bandwidth bytes/s, latency ms), sorted.
Adjacency = list[list[tuple[int, float, float]]]


class BottleneckTree:
    """Kruskal's merges (links added widest first) as a tree over the graph's nodes.

    Leaves are the nodes; each merge of two components is a new node above both, holding
    the width of the link that made it. Two devices' best bottleneck is the width of their
    lowest common ancestor: the link that first joined their components. Built in
    O(links log links) and O(nodes log nodes) memory; a query climbs O(log nodes) levels.

    Example::

        tree = BottleneckTree(adj, n)
        tree.width(0, 5)          # bytes/s of the widest route's narrowest link
        tree.device_widths()      # every value width(i, j) takes over device pairs
    """

    def __init__(self, adj: Adjacency, n: int) -> None:
        size = len(adj)
        edges = sorted(
            ((bw, u, v) for u, row in enumerate(adj) for v, bw, _ in row if u < v),
            key=lambda e: -e[0],
        )
        leader = list(range(size))  # union-find over nodes
        top = list(range(size))  # per union-find root: its component's tree node
        parent = list(range(size))
        width = [math.inf] * size
        has_device = [i < n for i in range(size)]
        joined: list[float] = []  # widths of merges of two components that hold devices

        def find(x: int) -> int:
            while leader[x] != x:
                leader[x] = leader[leader[x]]
                x = leader[x]
            return x

        for bw, u, v in edges:
            ru, rv = find(u), find(v)
            if ru == rv:
                continue
            a, b, node = top[ru], top[rv], len(parent)
            parent[a] = parent[b] = node
            parent.append(node)
            width.append(bw)
            has_device.append(has_device[a] or has_device[b])
            if has_device[a] and has_device[b]:
                joined.append(bw)
            leader[rv] = ru
            top[ru] = node
        # Children have smaller numbers than their parents: depths from the top down.
        depth = [0] * len(parent)
        for node in range(len(parent) - 1, -1, -1):
            if parent[node] != node:
                depth[node] = depth[parent[node]] + 1
        up = [parent]
        for _ in range(max(1, max(depth, default=0).bit_length()) - 1):
            last = up[-1]
            up.append([last[last[x]] for x in range(len(last))])
        self._up = up
        self._depth = depth
        self._width = width
        self._joined = joined
        self._runs: tuple[np.ndarray, list[int], list[int]] | None = None

    def width(self, i: int, j: int) -> float:
        """The best bottleneck between nodes ``i`` and ``j`` (``inf`` for ``i == j``, 0.0
        for nodes in different components).

        Example::

            tree.width(rank["gpu0"], rank["gpu3"])
        """
        if i == j:
            return math.inf
        up, depth = self._up, self._depth
        if depth[i] < depth[j]:
            i, j = j, i
        lift, level = depth[i] - depth[j], 0
        while lift:
            if lift & 1:
                i = up[level][i]
            lift >>= 1
            level += 1
        if i == j:
            return self._width[i]
        for level in range(len(up) - 1, -1, -1):
            a, b = up[level][i], up[level][j]
            if a != b:
                i, j = a, b
        if up[0][i] == i:
            return 0.0
        return self._width[up[0][i]]

    def widths_from(self, i: int, n: int) -> list[float]:
        """The best bottleneck from node ``i`` to each of the devices ``0 .. n - 1``
        (``inf`` for ``i`` itself, 0.0 where no route exists), in one climb from ``i`` to
        its root: linear in the devices, not ``n`` separate queries.

        Example::

            tree.widths_from(rank["gpu0"], n)[rank["gpu3"]]
        """
        order, first, last = self._leaf_order(n)
        out = np.zeros(n, dtype=np.float64)  # by leaf order until the end
        parent, width = self._up[0], self._width
        child, node = i, parent[i]
        if i < n:
            out[first[i]] = math.inf
        while node != child:
            # Devices under node but not under child meet i first at node.
            out[first[node] : first[child]] = width[node]
            out[last[child] : last[node]] = width[node]
            child, node = node, parent[node]
        result: list[float] = out[order].tolist()
        return result

    def _leaf_order(self, n: int) -> tuple[np.ndarray, list[int], list[int]]:
        """Devices numbered so that each tree node's devices are one run: per device its
        place in that order, per node where its run starts and ends (cached)."""
        if self._runs is None:
            parent = self._up[0]
            children: list[list[int]] = [[] for _ in parent]
            for node in range(len(parent) - 1, -1, -1):
                if parent[node] != node:
                    children[parent[node]].append(node)
            first, last = [0] * len(parent), [0] * len(parent)
            place = np.zeros(n, dtype=np.int64)
            count = 0
            roots = [node for node in range(len(parent)) if parent[node] == node]
            for root in roots:
                stack = [(root, False)]
                while stack:
                    node, done = stack.pop()
                    if done:
                        last[node] = count
                        continue
                    first[node] = count
                    if node < n:
                        place[node] = count
                        count += 1
                    stack.append((node, True))
                    stack.extend((c, False) for c in children[node])
            self._runs = (place, first, last)
        return self._runs

    def device_widths(self) -> list[float]:
        """Every bottleneck some pair of devices has (one entry per merge; empty for one
        device): its minimum and maximum are the topology's bandwidth range.

        Example::

            min(tree.device_widths()), max(tree.device_widths())
        """
        return list(self._joined)


def widest_from(adj: Adjacency, source: int, n: int) -> list[float]:
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
    return best[:n]


class HopSearch:
    """A breadth-first search from ``source`` over links of bandwidth >= ``width``, one level
    at a time and only as deep as the targets asked of it need; resumed for the next.

    A node's parent is the first node of the level above, in queue order, linked to it:
    the search checks whether a target hangs off the deepest level it has by looking at the
    target's own links (a few), and builds the next level (every link of the level) only
    when it does not. So a route of two hops through a switch of 16,384 links costs a few
    steps, not a walk along that switch's links. Nodes of rank below ``endpoints_below``
    (devices, under ``relay: switches``) other than the source are reached but not expanded.
    Neighbours are visited in rank order, so each route is the lexicographically smallest
    among the fewest-hop ones, and every node gets exactly the parent, hop count and
    summed latency a whole breadth-first search would give it.

    Example::

        search = HopSearch(adj, src, width)
        search.reach(dst) and search.path(dst)   # [dst, ..., src]
    """

    __slots__ = ("_adj", "_below", "_level", "_source", "_width", "hops", "latency_ms", "parent")

    def __init__(
        self, adj: Adjacency, source: int, width: float, endpoints_below: int | None = None
    ) -> None:
        self._adj = adj
        self._width = width
        self._source = source
        self._below = -1 if endpoints_below is None else endpoints_below
        # Reached nodes: parent, hops, latency from the source (summed from the source on).
        self.parent: dict[int, int] = {source: source}
        self.hops: dict[int, int] = {source: 0}
        self.latency_ms: dict[int, float] = {source: 0.0}
        # The deepest level built, in queue order: node -> position.
        self._level: dict[int, int] = {source: 0}

    def __len__(self) -> int:
        """Nodes reached so far (what the search holds in memory)."""
        return len(self.parent)

    def reach(self, target: int) -> bool:
        """Search until ``target`` is reached (True) or nothing is left to expand (False).

        Example::

            search.reach(rank["gpu7"])
        """
        if target in self.parent:
            return True
        while self._level:
            if self._hangs_off(target):
                return True
            self._next_level()
        return False

    def _relays(self, node: int) -> bool:
        return node >= self._below or node == self._source

    def _hangs_off(self, target: int) -> bool:
        """Whether ``target`` is on the level below the deepest one; if so, it is reached
        through its first linked node of that level (what building the level would give)."""
        level, width = self._level, self._width
        first, y, link_lat = len(level), -1, 0.0
        for node, bw, node_lat in self._adj[target]:
            at = level.get(node, first)
            if at < first and bw >= width and self._relays(node):
                first, y, link_lat = at, node, node_lat
        if y < 0:
            return False
        self.parent[target] = y
        self.hops[target] = self.hops[y] + 1
        self.latency_ms[target] = self.latency_ms[y] + link_lat
        return True

    def _next_level(self) -> None:
        """Build the next level from every link of the deepest one, in queue order (nodes
        already reached through :meth:`_hangs_off` get the same entries again)."""
        parent, hops, lat, width = self.parent, self.hops, self.latency_ms, self._width
        above = self._level
        depth = hops[next(iter(above))] + 1
        below: dict[int, int] = {}
        for u in above:
            if not self._relays(u):
                continue
            for v, bw, link_lat in self._adj[u]:
                if bw < width or v in below:
                    continue
                if v in parent and hops[v] < depth:
                    continue
                parent[v] = u
                hops[v] = depth
                lat[v] = lat[u] + link_lat
                below[v] = len(below)
        self._level = below

    def path(self, target: int) -> list[int]:
        """Ranks from ``target`` back to the source (``target`` must be reached).

        Example::

            search.path(rank["gpu7"])   # [7, 4, 0]
        """
        parent, out = self.parent, [target]
        while out[-1] != self._source:
            out.append(parent[out[-1]])
        return out


def unreachable_without_relay(adj: Adjacency, n: int) -> tuple[int, int] | None:
    """The first device pair ``(a, b)``, ``a < b`` (by ``a``, then ``b``), that no route
    joins without passing through another device; None when every pair is joined.

    Two devices are joined when a link joins them or both reach one component of the
    switches alone. Linear when one such component reaches every device (every bundled
    topology and every cluster); else each device's reach is counted, which grows with
    devices squared.

    Example::

        unreachable_without_relay(adj, n)   # (0, 2): gpu0 and gpu2 only meet through gpu1
    """
    size = len(adj)
    leader = list(range(size))

    def find(x: int) -> int:
        while leader[x] != x:
            leader[x] = leader[leader[x]]
            x = leader[x]
        return x

    for u in range(n, size):
        for v, _, _ in adj[u]:
            if v >= n:
                leader[find(v)] = find(u)
    attached = [sorted({find(v) for v, _, _ in adj[d] if v >= n}) for d in range(n)]
    devices_of: dict[int, list[int]] = {}
    for d, parts in enumerate(attached):
        for part in parts:
            devices_of.setdefault(part, []).append(d)
    if any(len(members) == n for members in devices_of.values()):
        return None
    for a in range(n):
        joined = {a, *(v for v, _, _ in adj[a] if v < n)}
        for part in attached[a]:
            joined.update(devices_of[part])
        if len(joined) < n:
            return a, next(b for b in range(n) if b not in joined)
    return None


def all_pairs_bottleneck(adj: Adjacency, n: int) -> np.ndarray:
    """Every device pair's bottleneck as an n x n matrix (``inf`` on the diagonal), by
    Kruskal's algorithm on the links, widest first: the values
    :meth:`BottleneckTree.width` gives, for ``topology show --json`` and tests. Quadratic
    in devices, in time and memory: no solve calls it.

    Example::

        all_pairs_bottleneck(adj, n)[0, 3]   # bytes/s
    """
    out = np.zeros((n, n), dtype=np.float64)
    np.fill_diagonal(out, math.inf)
    leader = list(range(len(adj)))
    members: list[list[int]] = [[i] if i < n else [] for i in range(len(adj))]

    def find(x: int) -> int:
        while leader[x] != x:
            leader[x] = leader[leader[x]]
            x = leader[x]
        return x

    edges = sorted(
        ((bw, u, v) for u, row in enumerate(adj) for v, bw, _ in row if u < v),
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
        leader[rv] = ru
        a.extend(b)
        members[rv] = []
    return out


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
