"""A machine as a graph: devices and switches joined by links, routes on demand.

A :class:`Topology` wraps a :class:`networkx.Graph` whose nodes are devices (things that
compute) and switches (NVSwitch, PCIe switch, CPU socket, NIC, ...) and whose edges are links
with a bandwidth per direction and a latency. A transfer between two devices follows the route
of widest bottleneck, fewest hops on ties (:mod:`planner.topology.routing`), and costs
``sum(latency) + bytes / bottleneck``. A pair's route is worked out the first time it is asked
for and kept (:mod:`planner.topology.routes`, bounded caches): loading a topology costs what its
links cost, not what its device pairs would, and the solver's millions of transfer times are
dictionary lookups.

Example::

    topo = load_topology("topologies/dgx1-v100.yaml")
    topo.transfer_ms("gpu0", "gpu7", 64 * 2**20)   # 64 MiB over the widest route
    topo.route("gpu0", "gpu7")                     # ['gpu0', 'gpu4', 'gpu7']
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import networkx as nx
import numpy as np

from planner.errors import InputError
from planner.topology.collectives import allreduce_ms
from planner.topology.routes import PairRoute, RouteTable
from planner.topology.routing import first_duplicate, unreachable_without_relay
from planner.units import format_bandwidth, format_bytes, format_time_ms

__all__ = ["DEFAULT_HOST", "RELAY_MODES", "SCHEMA", "Device", "Topology"]

SCHEMA = "pipeplan.topology/v1"
DEFAULT_HOST = "host0"
RELAY_MODES = ("all", "switches")
_MAX_RINGS = 1 << 16  # kept all-reduce times


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
    # The device's own time per message it sends to or receives from another device, on
    # top of the link's: a CPU process's share of gloo's copies and threads and of posting
    # and waiting, time its compute loses where the host's cores are all busy. 0 for GPUs
    # (the copy engines and NCCL's kernels overlap the compute).
    message_overhead_ms: float = 0.0


class Topology:
    """Devices and switches joined by links; device-to-device routes worked out on demand.

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
        self._host_index = {h: i for i, h in enumerate(dict.fromkeys(d.host for d in self.devices))}
        # Ring all-reduce times by (devices, bytes): the simulator asks for the same rings
        # in every candidate it times (bounded like the route caches).
        self._rings: dict[tuple[tuple[str, ...], float], float] = {}
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
            dup = first_duplicate(d.name for d in self.devices)
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
        """The route table: bottlenecks by Kruskal's merges, routes on demand (see docs)."""
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
        relay_devices = self.relay == "all"
        if not relay_devices:
            lost = unreachable_without_relay(adj, n)
            if lost is not None:
                a, b = (self._nodes[k] for k in lost)
                raise InputError(
                    f"device {b!r} cannot be reached from {a!r} without passing through another "
                    "device, which 'relay: switches' forbids",
                    file=self.source,
                    field="links",
                )
        self._routes = RouteTable(adj, nodes, n, relay_devices=relay_devices)
        # Answers by (src, dst) name: transfer_ms is the solver's innermost call.
        self._known = self._routes.known

    def _pair(self, src: str, dst: str) -> PairRoute:
        """The route answer for two distinct devices (InputError for unknown names)."""
        return self._routes.pair(self.device_index(src), self.device_index(dst))

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

    def host_index(self, name: str) -> int:
        """Position of device ``name``'s host in :meth:`hosts` order.

        Example::

            topo.host_index("node1.gpu0")   # 1
        """
        return self._host_index[self.device(name).host]

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
        try:
            hit = self._known[src, dst]
        except (KeyError, TypeError):
            hit = self._pair(src, dst)
        return hit[1] + nbytes / hit[0] * 1e3

    def bandwidth(self, src: str, dst: str) -> float:
        """Bottleneck bytes/s of the route from ``src`` to ``dst``; ``inf`` if they are the same.

        Example::

            topo.bandwidth("gpu0", "gpu3") / 1e9   # GB/s
        """
        if src == dst:
            self.device_index(src)
            return math.inf
        try:
            return self._known[src, dst][0]
        except (KeyError, TypeError):
            return self._routes.bandwidth(self.device_index(src), self.device_index(dst))

    def bandwidths_from(self, src: str) -> list[float]:
        """The route bottleneck from ``src`` to every device, bytes/s, in device order
        (``inf`` at ``src``): linear in the devices, for walks that compare them all.

        Example::

            topo.bandwidths_from("gpu0")[topo.device_index("gpu3")]
        """
        return list(self._routes.bandwidth_row(self.device_index(src)))

    def narrowest_bandwidth(self, devices: Sequence[str]) -> float:
        """The smallest route bottleneck between two of ``devices``, bytes/s (``inf`` for
        fewer than two): linear in them, except under ``relay: switches`` (every pair).

        Example::

            topo.narrowest_bandwidth(["gpu0", "gpu8", "gpu16"])   # across the hosts
        """
        return self._routes.narrowest([self.device_index(d) for d in devices])

    def latency_ms(self, src: str, dst: str) -> float:
        """Sum of the link latencies along the route from ``src`` to ``dst``.

        Example::

            topo.latency_ms("gpu0", "gpu8")
        """
        if src == dst:
            self.device_index(src)
            return 0.0
        return self._pair(src, dst)[1]

    def hops(self, src: str, dst: str) -> int:
        """Number of links on the route from ``src`` to ``dst``.

        Example::

            topo.hops("gpu0", "gpu1")   # 2 through one switch
        """
        if src == dst:
            self.device_index(src)
            return 0
        return self._pair(src, dst)[2]

    def route(self, src: str, dst: str) -> list[str]:
        """Node names along the chosen route, ``src`` first and ``dst`` last.

        Example::

            topo.route("gpu0", "gpu5")   # ['gpu0', 'gpu1', 'gpu5'] on a DGX-1
        """
        if src == dst:
            self.device_index(src)
            return [src]
        return list(self._pair(src, dst)[3])

    def route_links(self, src: str, dst: str) -> list[tuple[str, str]]:
        """The directed hops ``(u, v)`` of the chosen route from ``src`` to ``dst``.

        Example::

            topo.route_links("gpu0", "gpu1")   # [('gpu0', 'nvswitch0'), ('nvswitch0', 'gpu1')]
        """
        if src == dst:
            self.device_index(src)
            return []
        path = self._pair(src, dst)[3]
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

    def bandwidth_range(self) -> tuple[float, float] | None:
        """The narrowest and the widest route bottleneck over device pairs, bytes/s (None
        for one device). Linear in the links, except under ``relay: switches`` (every pair).

        Example::

            low, high = topo.bandwidth_range()
        """
        return self._routes.bandwidth_range()

    def bandwidth_matrix(self) -> np.ndarray:
        """Device-by-device bottleneck bandwidths (bytes/s, ``inf`` on the diagonal), a new
        array. Devices squared in time and memory: for display and tests, not for a solve.

        Example::

            bw = topo.bandwidth_matrix(); bw[0, 1]
        """
        return self._routes.bandwidth_matrix()

    def latency_matrix(self) -> np.ndarray:
        """Device-by-device route latencies in milliseconds (0 on the diagonal), a new array.
        Devices squared (a route per pair): for display and tests, not for a solve.

        Example::

            lat = topo.latency_matrix(); lat[0, 1]
        """
        return self._routes.latency_matrix()

    # ------------------------------------------------------------------ collectives

    def allreduce_ms(self, devices: Sequence[str], nbytes: float) -> float:
        """Ring all-reduce of ``nbytes`` over ``devices``; 0.0 for one device
        (:func:`planner.topology.collectives.allreduce_ms`).

        Example::

            topo.allreduce_ms(["gpu0", "gpu8"], 4 * 2**30)   # across the InfiniBand
        """
        try:
            key = (tuple(devices), nbytes)
            hit = self._rings.get(key)
        except TypeError:  # an unhashable name: refused below, one line
            return allreduce_ms(self, devices, nbytes)
        if hit is None:
            hit = allreduce_ms(self, devices, nbytes)
            if len(self._rings) >= _MAX_RINGS:
                self._rings.clear()
            self._rings[key] = hit
        return hit

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

    def with_memory(self, memory_bytes: int, *, name: str | None = None) -> Topology:
        """A copy with every device's memory set to ``memory_bytes`` (named ``name``, or
        as this one).

        Example::

            tight = topo.with_memory(8 * 2**30, name=topo.name + "-tight")
        """
        devices = [replace(d, memory_bytes=memory_bytes) for d in self.devices]
        return Topology(
            self.name if name is None else name,
            self.graph.copy(),
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
            | (
                {"message_overhead": format_time_ms(d.message_overhead_ms, exact=True)}
                if d.message_overhead_ms
                else {}
            )
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
