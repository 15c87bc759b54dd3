"""Machines as graphs: devices, switches, links, and what a transfer between two devices costs.

A :class:`Topology` wraps a :class:`networkx.Graph` whose nodes are devices (things that
compute) and switches (NVSwitch, PCIe switch, CPU socket, NIC, ...) and whose edges are links
with a bandwidth per direction and a latency. A transfer between two devices follows the route
of widest bottleneck, fewest hops on ties, and costs ``sum(latency) + bytes / bottleneck``.
The routes for all device pairs are worked out once, when the topology is built, because the
solver asks for transfer times millions of times.

The file format (``pipeplan.topology/v1``) is described in docs/topology.md; in short::

    name: dgx-h100
    devices:
      - {name: "gpu{0..7}", memory: 80 GiB, speed: 1.0, host: node0, kind: H100}
    switches: [nvswitch0]
    links:
      - {between: ["gpu{0..7}", nvswitch0], bandwidth: 450 GB/s, latency: 1 us}

Example::

    topo = load_topology("topologies/dgx1-v100.yaml")
    topo.transfer_ms("gpu0", "gpu7", 64 * 2**20)   # 64 MiB over the widest route
    topo.route("gpu0", "gpu7")                     # ['gpu0', 'gpu4', 'gpu7']
    topo.allreduce_ms(["gpu0", "gpu1", "gpu2", "gpu3"], 2**30)
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from planner.errors import InputError
from planner.units import (
    format_bandwidth,
    format_bytes,
    format_time_ms,
    parse_bandwidth,
    parse_bytes,
    parse_time_ms,
)

__all__ = [
    "SCHEMA",
    "Device",
    "Topology",
    "as_topology",
    "expand_names",
    "load_topology",
    "topology_from_dict",
    "uniform_topology",
]

SCHEMA = "pipeplan.topology/v1"
DEFAULT_HOST = "host0"
RELAY_MODES = ("all", "switches")


@dataclass(frozen=True)
class Device:
    """One compute vertex: its memory, relative speed and the host it lives in.

    Example::

        Device("gpu0", memory_bytes=80 * 2**30, speed=1.0, host="node0", kind="H100")
    """

    name: str
    memory_bytes: int
    speed: float = 1.0  # divides profiled times; 1.0 = the profiling device
    host: str = DEFAULT_HOST
    kind: str = ""


class Topology:
    """Devices and switches joined by links, with all device-to-device routes precomputed.

    ``graph`` nodes carry ``role`` (``"device"`` or ``"switch"``) and ``kind``; edges carry
    ``bandwidth`` (bytes/s per direction, all parallel links together), ``latency_ms``,
    ``count`` (parallel links) and ``kind``. Nodes that are not devices are switches.

    Example::

        g = nx.Graph()
        g.add_edge("a", "sw", bandwidth=10e9, latency_ms=0.001)
        g.add_edge("b", "sw", bandwidth=10e9, latency_ms=0.001)
        topo = Topology("pair", g, [Device("a", 2**30), Device("b", 2**30)])
        topo.transfer_ms("a", "b", 1e9)   # 0.002 + 100.0
    """

    def __init__(
        self,
        name: str,
        graph: nx.Graph,
        devices: Sequence[Device],
        *,
        source: str = "<topology>",
        relay: str = "all",
        allreduce_efficiency: float = 1.0,
    ) -> None:
        self.name = name
        self.graph = graph
        self.devices = list(devices)
        self.source = source
        if relay not in RELAY_MODES:
            raise InputError(
                f"expected one of {', '.join(RELAY_MODES)}; got {relay!r}",
                file=source,
                field="relay",
            )
        # "all": any vertex forwards traffic (the contract's rule); "switches": devices are
        # endpoints only, as when peer copies are not relayed through a third GPU.
        self.relay = relay
        if not (
            isinstance(allreduce_efficiency, int | float)
            and not isinstance(allreduce_efficiency, bool)
            and 0 < allreduce_efficiency <= 1
        ):
            raise InputError(
                f"expected a number in (0, 1]; got {allreduce_efficiency!r}",
                file=source,
                field="allreduce_efficiency",
            )
        # The fraction of the ring model's bandwidth the backend's all-reduce reaches: about 1
        # for NCCL over NVLink, about a fifth for gloo over loopback TCP (topologies/cpu.yaml).
        self.allreduce_efficiency = float(allreduce_efficiency)
        self._index = {d.name: i for i, d in enumerate(self.devices)}
        self._check_graph()
        # Node ranks: devices first in device order, then switches in graph order. Routes tie
        # on bottleneck and hops are broken by the lexicographically smallest rank sequence.
        self._nodes = [d.name for d in self.devices] + [
            n for n in graph.nodes if n not in self._index
        ]
        self._rank = {n: i for i, n in enumerate(self._nodes)}
        for d in self.devices:
            graph.nodes[d.name].update(role="device", kind=d.kind)
        for n in self._nodes[len(self.devices) :]:
            graph.nodes[n].setdefault("kind", "")
            graph.nodes[n]["role"] = "switch"
        self._build_table()

    # ------------------------------------------------------------------ construction

    def _check_graph(self) -> None:
        if not self.devices:
            raise InputError("expected at least one device", file=self.source, field="devices")
        if len(self._index) != len(self.devices):
            dup = _first_duplicate(d.name for d in self.devices)
            raise InputError(f"duplicate device name {dup!r}", file=self.source, field="devices")
        for d in self.devices:
            self.graph.add_node(d.name)
        for u, v, data in self.graph.edges(data=True):
            bw, lat = data.get("bandwidth"), data.get("latency_ms", 0.0)
            if not isinstance(bw, (int, float)) or not bw > 0 or not math.isfinite(bw):
                raise InputError(
                    f"link {u}-{v}: expected a positive bandwidth; got {bw!r}",
                    file=self.source,
                    field="links",
                )
            if not isinstance(lat, (int, float)) or not lat >= 0 or not math.isfinite(lat):
                raise InputError(
                    f"link {u}-{v}: expected a latency >= 0; got {lat!r}",
                    file=self.source,
                    field="links",
                )
            data.setdefault("latency_ms", 0.0)
            data.setdefault("count", 1)
            data.setdefault("kind", "")
        first = self.devices[0].name
        reachable = nx.node_connected_component(self.graph, first)
        lost = [d.name for d in self.devices if d.name not in reachable]
        if lost:
            raise InputError(
                f"device {lost[0]!r} is not connected to {first!r} by any path of links"
                + (f" (nor are {len(lost) - 1} more)" if len(lost) > 1 else ""),
                file=self.source,
                field="links",
            )

    def _build_table(self) -> None:
        """Bottleneck, hops, latency and route trees for every device pair (see docs)."""
        n, nodes, rank = len(self.devices), self._nodes, self._rank
        # Adjacency by rank, neighbours sorted so that breadth-first search visits them in
        # rank order and thereby finds the lexicographically smallest fewest-hop route.
        adj: list[list[tuple[int, float, float]]] = [[] for _ in nodes]
        for u, v, data in self.graph.edges(data=True):
            a, b = rank[u], rank[v]
            adj[a].append((b, float(data["bandwidth"]), float(data["latency_ms"])))
            adj[b].append((a, float(data["bandwidth"]), float(data["latency_ms"])))
        for row in adj:
            row.sort()
        self._adj = adj
        relay_devices = self.relay == "all"
        if relay_devices:
            bottleneck = _all_pairs_bottleneck(self.graph, rank, n)
        else:
            bottleneck = np.vstack([_widest_from(adj, s, n) for s in range(n)])
            unreachable = np.argwhere(bottleneck == 0)
            if unreachable.size:
                a, b = (self._nodes[int(k)] for k in unreachable[0])
                raise InputError(
                    f"device {b!r} cannot be reached from {a!r} without passing through another "
                    "device, which 'relay: switches' forbids",
                    file=self.source,
                    field="links",
                )
        hops = np.zeros((n, n), dtype=np.int32)
        latency = np.zeros((n, n), dtype=np.float64)
        # trees[s][B] = parent array of the search from s over links of bandwidth >= B; it
        # holds the routes from s to every device t > s whose bottleneck is B.
        self._trees: list[dict[float, np.ndarray]] = [{} for _ in range(n)]
        for s in range(n - 1):
            widths = bottleneck[s, s + 1 :]
            for width in np.unique(widths):
                targets = (np.nonzero(widths == width)[0] + s + 1).tolist()
                parent, hop, lat = _fewest_hops(
                    adj, s, float(width), targets, None if relay_devices else n
                )
                self._trees[s][float(width)] = np.asarray(parent, dtype=np.int32)
                for t in targets:
                    hops[s, t] = hops[t, s] = hop[t]
                    latency[s, t] = latency[t, s] = lat[t]
        self._bandwidth = bottleneck
        self._hops = hops
        self._latency = latency
        # Plain nested lists: indexing them is several times faster than numpy scalars, and
        # transfer_ms is the solver's innermost call.
        self._bw_rows: list[list[float]] = bottleneck.tolist()
        self._lat_rows: list[list[float]] = latency.tolist()

    # ------------------------------------------------------------------ devices

    def device(self, name: str) -> Device:
        """The :class:`Device` called ``name``; :class:`InputError` for unknown names.

        Example::

            topo.device("gpu0").memory_bytes
        """
        return self.devices[self.device_index(name)]

    def device_index(self, name: str) -> int:
        """Position of device ``name`` in device order.

        Example::

            topo.device_index("gpu3")   # 3 in most bundled files
        """
        try:
            return self._index[name]
        except (KeyError, TypeError):
            known = ", ".join(self.device_names()[:8])
            more = ", ..." if len(self.devices) > 8 else ""
            raise InputError(
                f"unknown device {name!r}; expected one of {known}{more}",
                file=self.source,
                field="devices",
            ) from None

    def device_names(self) -> list[str]:
        """Device names in device (file) order.

        Example::

            topo.device_names()   # ['gpu0', 'gpu1', ...]
        """
        return [d.name for d in self.devices]

    @property
    def switches(self) -> list[str]:
        """Names of the non-compute vertices, in file order."""
        return self._nodes[len(self.devices) :]

    def hosts(self) -> dict[str, list[str]]:
        """Device names grouped by host, hosts in order of first appearance.

        Example::

            topo.hosts()   # {'node0': ['gpu0', ..., 'gpu7'], 'node1': [...]}
        """
        out: dict[str, list[str]] = {}
        for d in self.devices:
            out.setdefault(d.host, []).append(d.name)
        return out

    # ------------------------------------------------------------------ transfers

    def transfer_ms(self, src: str, dst: str, nbytes: float) -> float:
        """Milliseconds to move ``nbytes`` from ``src`` to ``dst``; 0.0 if they are the same.

        Example::

            topo.transfer_ms("gpu0", "gpu1", 2**20)
        """
        if src == dst:
            return 0.0
        i, j = self.device_index(src), self.device_index(dst)
        return self._lat_rows[i][j] + nbytes / self._bw_rows[i][j] * 1e3

    def bandwidth(self, src: str, dst: str) -> float:
        """Bottleneck bytes/s of the route from ``src`` to ``dst``; ``inf`` if they are the same.

        Example::

            topo.bandwidth("gpu0", "gpu3") / 1e9   # GB/s
        """
        if src == dst:
            self.device_index(src)
            return math.inf
        return self._bw_rows[self.device_index(src)][self.device_index(dst)]

    def latency_ms(self, src: str, dst: str) -> float:
        """Sum of the link latencies along the route from ``src`` to ``dst``.

        Example::

            topo.latency_ms("gpu0", "gpu8")
        """
        if src == dst:
            self.device_index(src)
            return 0.0
        return self._lat_rows[self.device_index(src)][self.device_index(dst)]

    def hops(self, src: str, dst: str) -> int:
        """Number of links on the route from ``src`` to ``dst``.

        Example::

            topo.hops("gpu0", "gpu1")   # 2 through one switch
        """
        return int(self._hops[self.device_index(src), self.device_index(dst)])

    def route(self, src: str, dst: str) -> list[str]:
        """Node names along the chosen route, ``src`` first and ``dst`` last.

        Example::

            topo.route("gpu0", "gpu5")   # ['gpu0', 'gpu1', 'gpu5'] on a DGX-1
        """
        i, j = self.device_index(src), self.device_index(dst)
        if i == j:
            return [src]
        s, t = min(i, j), max(i, j)
        parent = self._trees[s][self._bw_rows[s][t]]
        path = [t]
        while path[-1] != s:
            path.append(int(parent[path[-1]]))
        names = [self._nodes[k] for k in path]  # t .. s
        return names if i > j else names[::-1]

    def route_links(self, src: str, dst: str) -> list[tuple[str, str]]:
        """The directed hops ``(u, v)`` of the chosen route from ``src`` to ``dst``.

        Example::

            topo.route_links("gpu0", "gpu1")   # [('gpu0', 'nvswitch0'), ('nvswitch0', 'gpu1')]
        """
        path = self.route(src, dst)
        return list(zip(path, path[1:], strict=False))

    def link_bandwidth(self, u: str, v: str) -> float:
        """Bytes/s per direction of the link between ``u`` and ``v`` (parallel links summed).

        Example::

            topo.link_bandwidth("gpu0", "gpu3")   # 50e9: two NVLinks on a DGX-1
        """
        return float(self._link(u, v)["bandwidth"])

    def link_latency_ms(self, u: str, v: str) -> float:
        """Latency in milliseconds of the link between ``u`` and ``v``.

        Example::

            topo.link_latency_ms("gpu0", "nvswitch0")
        """
        return float(self._link(u, v)["latency_ms"])

    def _link(self, u: str, v: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = self.graph.edges[u, v]
        except KeyError:
            raise InputError(f"no link between {u!r} and {v!r}", file=self.source) from None
        return data

    def bandwidth_matrix(self) -> np.ndarray:
        """Device-by-device bottleneck bandwidths (bytes/s, ``inf`` on the diagonal), a copy.

        Example::

            bw = topo.bandwidth_matrix(); bw[0, 1]
        """
        return self._bandwidth.copy()

    def latency_matrix(self) -> np.ndarray:
        """Device-by-device route latencies in milliseconds (0 on the diagonal), a copy.

        Example::

            lat = topo.latency_matrix(); lat[0, 1]
        """
        return self._latency.copy()

    # ------------------------------------------------------------------ collectives

    def allreduce_ms(self, devices: Sequence[str], nbytes: float) -> float:
        """Ring all-reduce of ``nbytes`` over ``devices``; 0.0 for one device.

        The ring sends ``2 (n - 1)`` chunks of ``nbytes / n`` around; every step all devices
        send at once, so links shared by several ring hops (in the same direction) split their
        bandwidth. Of the given order and the order grouped by host, the faster ring is used,
        as NCCL groups rings by host.

        Example::

            topo.allreduce_ms(["gpu0", "gpu8"], 4 * 2**30)   # across the InfiniBand
        """
        names = list(devices)
        for name in names:
            self.device_index(name)
        if len(set(names)) != len(names):
            dup = _first_duplicate(names)
            raise InputError(f"device {dup!r} appears twice in an all-reduce", file=self.source)
        if len(names) <= 1:
            return 0.0
        host_rank = {h: i for i, h in enumerate(self.hosts())}
        grouped = sorted(names, key=lambda d: host_rank[self.device(d).host])
        orders = [names] if grouped == names else [names, grouped]
        return min(self._ring_ms(order, nbytes) for order in orders)

    def _ring_ms(self, ring: Sequence[str], nbytes: float) -> float:
        n = len(ring)
        hops = [self.route_links(ring[k], ring[(k + 1) % n]) for k in range(n)]
        use: dict[tuple[str, str], int] = {}
        for links in hops:
            for link in links:
                use[link] = use.get(link, 0) + 1
        chunk = nbytes / n
        step = 0.0
        for k, links in enumerate(hops):
            share = min(self.link_bandwidth(u, v) / use[(u, v)] for u, v in links)
            share *= self.allreduce_efficiency
            step = max(step, self.latency_ms(ring[k], ring[(k + 1) % n]) + chunk / share * 1e3)
        return 2 * (n - 1) * step

    # ------------------------------------------------------------------ variants & export

    def scaled(self, *, bandwidth: float = 1.0, speed: float = 1.0) -> Topology:
        """A copy with every link bandwidth and every device speed multiplied.

        Example::

            slow = topo.scaled(bandwidth=0.5)   # every transfer's byte term doubles
        """
        if not (bandwidth > 0 and speed > 0):
            raise ValueError("scale factors must be positive")
        graph = self.graph.copy()
        for _, _, data in graph.edges(data=True):
            data["bandwidth"] = data["bandwidth"] * bandwidth
        devices = [replace(d, speed=d.speed * speed) for d in self.devices]
        return Topology(
            self.name,
            graph,
            devices,
            source=self.source,
            relay=self.relay,
            allreduce_efficiency=self.allreduce_efficiency,
        )

    def links(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """Every link as ``(u, v, data)`` in a stable order (by node rank).

        Example::

            for u, v, data in topo.links(): print(u, v, data["bandwidth"])
        """
        rank = self._rank
        edges = []
        for u, v, data in self.graph.edges(data=True):
            a, b = (u, v) if rank[u] <= rank[v] else (v, u)
            edges.append((rank[a], rank[b], a, b, data))
        for _, _, a, b, data in sorted(edges, key=lambda e: (e[0], e[1])):
            yield a, b, data

    def to_dict(self) -> dict[str, Any]:
        """The normalised file form: names expanded, defaults explicit, exact units.

        :func:`topology_from_dict` reads it back to an equal topology.

        Example::

            yaml.safe_dump(topo.to_dict(), sort_keys=False)
        """
        devices = [
            {
                "name": d.name,
                "memory": format_bytes(d.memory_bytes, exact=True),
                "speed": d.speed,
                "host": d.host,
                "kind": d.kind,
            }
            for d in self.devices
        ]
        switches = [{"name": s, "kind": self.graph.nodes[s].get("kind", "")} for s in self.switches]
        links = []
        for u, v, data in self.links():
            count = int(data.get("count", 1))
            links.append(
                {
                    "between": [u, v],
                    "bandwidth": format_bandwidth(data["bandwidth"] / count, exact=True),
                    "count": count,
                    "latency": format_time_ms(data["latency_ms"], exact=True),
                    "kind": data.get("kind", ""),
                }
            )
        out: dict[str, Any] = {"schema": SCHEMA, "name": self.name}
        if self.relay != "all":
            out["relay"] = self.relay
        if self.allreduce_efficiency != 1.0:
            out["allreduce_efficiency"] = self.allreduce_efficiency
        return {
            **out,
            "devices": devices,
            "switches": switches,
            "links": links,
        }

    def to_yaml(self) -> str:
        """:meth:`to_dict` as YAML, one device, switch or link per line.

        Example::

            Path("mine.yaml").write_text(topo.to_yaml())
        """
        import yaml

        data = self.to_dict()

        def flow(item: object) -> str:
            text = yaml.safe_dump(item, default_flow_style=True, sort_keys=False, width=1000)
            return text.strip()

        lines = [f"schema: {data['schema']}", f"name: {json.dumps(data['name'])}"]
        if "relay" in data:
            lines.append(f"relay: {data['relay']}")
        if "allreduce_efficiency" in data:
            lines.append(f"allreduce_efficiency: {data['allreduce_efficiency']}")
        lines.append("devices:")
        lines += [f"  - {flow(d)}" for d in data["devices"]]
        if data["switches"]:
            lines.append("switches:")
            lines += [f"  - {flow(s)}" for s in data["switches"]]
        lines.append("links:" if data["links"] else "links: []")
        lines += [f"  - {flow(link)}" for link in data["links"]]
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return (
            f"Topology({self.name!r}, {len(self.devices)} devices, "
            f"{len(self.switches)} switches, {self.graph.number_of_edges()} links)"
        )


# ---------------------------------------------------------------------- routing helpers


def _all_pairs_bottleneck(graph: nx.Graph, rank: dict[str, int], n: int) -> np.ndarray:
    """Widest-path bottleneck of every device pair (Kruskal on links, widest first).

    Two devices first share a component when the link that joins their components is added;
    that link's bandwidth is the best bottleneck any route between them can have.
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


def _widest_from(adj: list[list[tuple[int, float, float]]], source: int, n: int) -> np.ndarray:
    """Best bottleneck from ``source`` to every device when devices do not forward traffic.

    A max-bottleneck Dijkstra (the bottleneck has optimal substructure) that does not expand
    devices other than ``source``; ranks ``< n`` are devices. Unreachable devices get 0.
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


def _fewest_hops(
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


def _first_duplicate(names: Iterable[str]) -> str:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return ""


# ---------------------------------------------------------------------- file format

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_TOP_KEYS = {
    "schema",
    "name",
    "description",
    "defaults",
    "devices",
    "switches",
    "links",
    "hosts",
    "relay",
    "allreduce_efficiency",
}
_DEVICE_KEYS = {"name", "memory", "speed", "host", "kind"}
_LINK_KEYS = {"between", "bandwidth", "latency", "count", "kind"}


def expand_names(pattern: str, *, file: str | None = None, field: str | None = None) -> list[str]:
    """Expand ``{a..b}`` ranges (inclusive, several multiply) in a name.

    Example::

        expand_names("gpu{0..3}")          # ['gpu0', 'gpu1', 'gpu2', 'gpu3']
        expand_names("n{0..1}.g{0..1}")    # ['n0.g0', 'n0.g1', 'n1.g0', 'n1.g1']
    """
    spans = list(_RANGE.finditer(pattern))
    if not spans:
        return [pattern]
    pieces = _RANGE.split(pattern)  # text, a, b, text, a, b, ..., text
    ranges = []
    for m in spans:
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise InputError(
                f"range {m.group(0)!r} in {pattern!r} counts down; expected {{low..high}}",
                file=file,
                field=field,
            )
        ranges.append(range(lo, hi + 1))
    texts = pieces[0::3]
    out = []
    for combo in itertools.product(*ranges):
        parts = [texts[0]]
        for k, value in enumerate(combo):
            parts += [str(value), texts[k + 1]]
        out.append("".join(parts))
    return out


class _Builder:
    """Collects devices, switches and links from a parsed YAML mapping, validating as it goes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.devices: list[Device] = []
        self.switches: list[tuple[str, str]] = []
        self.names: set[str] = set()
        self.graph = nx.Graph()
        self.link_origin: dict[frozenset[str], str] = {}

    def fail(self, message: str, field: str | None) -> InputError:
        return InputError(message, file=self.source, field=field)

    def claim(self, name: object, field: str) -> str:
        if not isinstance(name, str) or not name.strip():
            raise self.fail(f"expected a non-empty name; got {name!r}", field)
        if name in self.names:
            raise self.fail(f"duplicate name {name!r}; device and switch names must differ", field)
        self.names.add(name)
        return name

    def add_device(self, entry: dict[str, Any], field: str) -> None:
        pattern = entry.get("name")
        if not isinstance(pattern, str):
            raise self.fail(f"expected a device name; got {pattern!r}", f"{field}.name")
        if "memory" not in entry:
            raise self.fail("missing; expected a size such as '80 GiB'", f"{field}.memory")
        memory = parse_bytes(entry["memory"], file=self.source, field=f"{field}.memory")
        if memory <= 0:
            raise self.fail(f"expected a positive size; got {entry['memory']!r}", f"{field}.memory")
        speed = entry.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            raise self.fail(
                f"expected a positive number (1.0 = profiling device); got {speed!r}",
                f"{field}.speed",
            )
        if not math.isfinite(speed):
            raise self.fail(f"expected a finite number; got {speed!r}", f"{field}.speed")
        host = entry.get("host", DEFAULT_HOST)
        kind = entry.get("kind", "")
        for key, value in (("host", host), ("kind", kind)):
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise self.fail(f"expected a string; got {value!r}", f"{field}.{key}")
        for name in expand_names(pattern, file=self.source, field=f"{field}.name"):
            self.claim(name, f"{field}.name")
            self.devices.append(Device(name, memory, float(speed), str(host), str(kind)))
            self.graph.add_node(name)

    def add_switch(self, name: str, kind: str, field: str) -> None:
        for one in expand_names(name, file=self.source, field=field):
            self.claim(one, field)
            self.switches.append((one, kind))
            self.graph.add_node(one, kind=kind)

    def add_link(self, entry: dict[str, Any], field: str) -> None:
        between = entry.get("between")
        if (
            not isinstance(between, list)
            or len(between) != 2
            or not all(isinstance(x, str) for x in between)
        ):
            raise self.fail(f"expected a list of two names; got {between!r}", f"{field}.between")
        if "bandwidth" not in entry:
            raise self.fail("missing; expected e.g. '25 GB/s'", f"{field}.bandwidth")
        bw = parse_bandwidth(entry["bandwidth"], file=self.source, field=f"{field}.bandwidth")
        if bw <= 0:
            raise self.fail(
                f"expected a positive bandwidth; got {entry['bandwidth']!r}", f"{field}.bandwidth"
            )
        latency = 0.0
        if "latency" in entry:
            latency = parse_time_ms(entry["latency"], file=self.source, field=f"{field}.latency")
            if latency < 0:
                raise self.fail(
                    f"expected a latency >= 0; got {entry['latency']!r}", f"{field}.latency"
                )
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise self.fail(f"expected a whole number >= 1; got {count!r}", f"{field}.count")
        kind = str(entry.get("kind", ""))
        left = expand_names(between[0], file=self.source, field=f"{field}.between")
        right = expand_names(between[1], file=self.source, field=f"{field}.between")
        for name in left + right:
            if name not in self.names:
                raise self.fail(f"{name!r} is not a declared device or switch", f"{field}.between")
        pairs = {frozenset((u, v)) for u in left for v in right if u != v}
        if not pairs:
            raise self.fail(f"a link needs two different ends; got {between!r}", f"{field}.between")
        for pair in sorted(pairs, key=sorted):
            u, v = sorted(pair)
            if pair in self.link_origin:
                raise self.fail(
                    f"second link between {u!r} and {v!r} (first in {self.link_origin[pair]}); "
                    "expected one entry, with 'count: N' for N parallel links",
                    f"{field}.between",
                )
            self.link_origin[pair] = field
            self.graph.add_edge(
                u, v, bandwidth=bw * count, latency_ms=latency, count=count, kind=kind
            )


def _mapping(value: object, what: str, source: str, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"expected {what} (a mapping); got {value!r}", file=source, field=field)
    return value


def _known_keys(entry: dict[str, Any], allowed: set[str], source: str, field: str) -> None:
    for key in entry:
        if key not in allowed:
            raise InputError(
                f"unknown field {key!r}; expected one of {', '.join(sorted(allowed))}",
                file=source,
                field=f"{field}.{key}" if field else str(key),
            )


def _add_hosts(
    builder: _Builder, spec: object, field: str, defaults: dict[str, Any] | None = None
) -> None:
    """Expand the ``hosts`` shorthand: N identical hosts, a switch inside, a network between."""
    source = builder.source
    groups = spec if isinstance(spec, list) else [spec]
    counters: dict[str, int] = {}

    def next_name(prefix: str) -> str:
        k = counters.get(prefix, 0)
        counters[prefix] = k + 1
        return f"{prefix}{k}"

    for g, group in enumerate(groups):
        gfield = f"{field}[{g}]" if isinstance(spec, list) else field
        group = _mapping(group, "a hosts group", source, gfield)
        _known_keys(group, {"count", "name", "devices", "switch", "network"}, source, gfield)
        count = group.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InputError(
                f"expected a whole number >= 1; got {count!r}", file=source, field=f"{gfield}.count"
            )
        host_prefix = str(group.get("name", "node"))
        dev = dict(
            _mapping(group.get("devices"), "the per-host devices", source, f"{gfield}.devices")
        )
        _known_keys(dev, _DEVICE_KEYS - {"host"} | {"count"}, source, f"{gfield}.devices")
        per_host = dev.pop("count", 1)
        if isinstance(per_host, bool) or not isinstance(per_host, int) or per_host < 1:
            raise InputError(
                f"expected a whole number >= 1; got {per_host!r}",
                file=source,
                field=f"{gfield}.devices.count",
            )
        dev_prefix = str(dev.pop("name", "gpu"))
        switch = group.get("switch")
        network = group.get("network")
        if switch is not None:
            switch = _mapping(switch, "the in-host switch", source, f"{gfield}.switch")
            _known_keys(
                switch,
                {"name", "bandwidth", "latency", "count", "kind"},
                source,
                f"{gfield}.switch",
            )
        if network is not None:
            network = _mapping(network, "the network", source, f"{gfield}.network")
            _known_keys(
                network,
                {"name", "bandwidth", "latency", "count", "kind", "per"},
                source,
                f"{gfield}.network",
            )
            per = network.get("per", "device")
            if per not in ("device", "host"):
                raise InputError(
                    f"expected 'device' or 'host'; got {per!r}",
                    file=source,
                    field=f"{gfield}.network.per",
                )
            if per == "host" and switch is None:
                raise InputError(
                    "'per: host' attaches the network to the in-host switch; "
                    "expected a 'switch' entry as well",
                    file=source,
                    field=f"{gfield}.network.per",
                )
            net_name = str(network.get("name", "network"))
            if net_name not in builder.names:
                builder.add_switch(net_name, str(network.get("kind", "")), f"{gfield}.network")
        for _ in range(count):
            host = next_name(host_prefix)
            names = [next_name(dev_prefix) for _ in range(per_host)]
            for name in names:
                entry = {**(defaults or {}), **dev, "name": name, "host": host}
                builder.add_device(entry, f"{gfield}.devices")
            link_fields = ("bandwidth", "latency", "count", "kind")
            if switch is not None:
                sw = next_name(str(switch.get("name", "switch")))
                builder.add_switch(sw, str(switch.get("kind", "")), f"{gfield}.switch")
                for name in names:
                    link = {k: switch[k] for k in link_fields if k in switch}
                    builder.add_link({**link, "between": [name, sw]}, f"{gfield}.switch")
            if network is not None:
                ends = names if network.get("per", "device") == "device" else [sw]
                for end in ends:
                    link = {k: network[k] for k in link_fields if k in network}
                    builder.add_link({**link, "between": [end, net_name]}, f"{gfield}.network")


def topology_from_dict(data: object, source: str = "<topology>") -> Topology:
    """Validate a parsed topology mapping and build the :class:`Topology`.

    Example::

        topology_from_dict({
            "devices": [{"name": "gpu{0..1}", "memory": "16 GiB"}],
            "links": [{"between": ["gpu0", "gpu1"], "bandwidth": "25 GB/s"}],
        })
    """
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise InputError(
            f"expected a mapping with 'devices' and 'links' at the top; got {kind}", file=source
        )
    schema = data.get("schema", SCHEMA)
    # Checked before the keys: a profile or plan passed here would otherwise be reported as
    # an "unknown field" instead of the wrong kind of file.
    other = {"pipeplan.profile/v1": "profile", "pipeplan.plan/v1": "plan"}
    if schema in other:
        raise InputError(
            f"this is a pipeplan {other[schema]} ({schema!r}); expected a topology YAML "
            f"({SCHEMA!r})",
            file=source,
            field="schema",
        )
    if schema != SCHEMA:
        raise InputError(f"expected {SCHEMA!r}; got {schema!r}", file=source, field="schema")
    _known_keys(data, _TOP_KEYS, source, "")
    if "devices" not in data and "hosts" not in data:
        raise InputError(
            "missing; expected a list of devices (or a 'hosts' shorthand)",
            file=source,
            field="devices",
        )
    builder = _Builder(source)
    defaults = _mapping(data.get("defaults", {}), "device defaults", source, "defaults")
    _known_keys(defaults, _DEVICE_KEYS - {"name"}, source, "defaults")
    if "hosts" in data:
        _add_hosts(builder, data["hosts"], "hosts", defaults)
    devices = data.get("devices", [])
    if not isinstance(devices, list) or ("hosts" not in data and not devices):
        raise InputError(
            f"expected a non-empty list of devices; got {devices!r}", file=source, field="devices"
        )
    for k, entry in enumerate(devices):
        entry = _mapping(entry, "a device", source, f"devices[{k}]")
        _known_keys(entry, _DEVICE_KEYS, source, f"devices[{k}]")
        builder.add_device({**defaults, **entry}, f"devices[{k}]")
    switches = data.get("switches", [])
    if not isinstance(switches, list):
        raise InputError(
            f"expected a list of switch names; got {switches!r}", file=source, field="switches"
        )
    for k, entry in enumerate(switches):
        if isinstance(entry, dict):
            _known_keys(entry, {"name", "kind"}, source, f"switches[{k}]")
            name, kind = entry.get("name"), str(entry.get("kind", ""))
        else:
            name, kind = entry, ""
        if not isinstance(name, str):
            raise InputError(
                f"expected a switch name; got {name!r}", file=source, field=f"switches[{k}]"
            )
        builder.add_switch(name, kind, f"switches[{k}]")
    links = data.get("links", [])
    if not isinstance(links, list):
        raise InputError(f"expected a list of links; got {links!r}", file=source, field="links")
    for k, entry in enumerate(links):
        entry = _mapping(entry, "a link", source, f"links[{k}]")
        _known_keys(entry, _LINK_KEYS, source, f"links[{k}]")
        builder.add_link(entry, f"links[{k}]")
    for name, _ in builder.switches:
        if builder.graph.degree(name) == 0:
            raise InputError(f"switch {name!r} has no links", file=source, field="switches")
    name = data.get("name", Path(source).stem if source != "<topology>" else "topology")
    if not isinstance(name, str) or not name:
        raise InputError(f"expected a non-empty string; got {name!r}", file=source, field="name")
    relay = data.get("relay", "all")
    efficiency = data.get("allreduce_efficiency", 1.0)
    return Topology(
        name,
        builder.graph,
        builder.devices,
        source=source,
        relay=relay,
        allreduce_efficiency=efficiency,
    )


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read, validate and build a topology file (``pipeplan.topology/v1`` YAML).

    Example::

        topo = load_topology("topologies/nvlink.yaml")
    """
    import yaml

    source = str(path)
    file = Path(path)
    if not file.is_file():
        raise InputError("file does not exist", file=source)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError("not a text file; expected topology YAML", file=source) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise InputError(f"not valid YAML{at}: {problem}", file=source) from None
    return topology_from_dict(data, source)


def uniform_topology(
    n: int,
    *,
    bandwidth: float = 100e9,
    latency_ms: float = 0.0,
    memory_bytes: int = 80 * 2**30,
    speed: float = 1.0,
    name: str = "uniform",
) -> Topology:
    """``n`` identical devices ``gpu0..gpu{n-1}`` on one switch.

    Every pair then sees ``bandwidth`` (bytes/s) and ``latency_ms`` (each of the two links
    carries half of it).

    Example::

        topo = uniform_topology(4, bandwidth=25e9)
        topo.transfer_ms("gpu0", "gpu3", 25e6)   # 1.0
    """
    if n < 1:
        raise ValueError("a topology needs at least one device")
    graph = nx.Graph()
    devices = [Device(f"gpu{i}", memory_bytes, speed, DEFAULT_HOST, "") for i in range(n)]
    for d in devices:
        graph.add_edge(
            d.name, "switch0", bandwidth=bandwidth, latency_ms=latency_ms / 2, count=1, kind=""
        )
    return Topology(name, graph, devices)


def as_topology(topology: Topology | str | os.PathLike[str]) -> Topology:
    """A Topology, loading it first when given a path.

    Example::

        as_topology("topologies/nvlink.yaml").device_names()
    """
    if isinstance(topology, str | os.PathLike):
        return load_topology(topology)
    return topology
