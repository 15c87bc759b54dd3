"""The topology file format (``pipeplan.topology/v1`` YAML): reading and validating it.

docs/topology.md describes the format; in short::

    name: dgx-h100
    devices:
      - {name: "gpu{0..7}", memory: 80 GiB, speed: 1.0, host: node0, kind: H100}
    switches: [nvswitch0]
    links:
      - {between: ["gpu{0..7}", nvswitch0], bandwidth: 450 GB/s, latency: 1 us}

Every problem is one :class:`~planner.errors.InputError` naming the file and the field: the
entries are records (:mod:`planner.topology.entries`, read by :mod:`planner.records`), and
this module expands their name ranges and builds the graph.
:meth:`planner.topology.Topology.to_dict` writes the normalised form back.

Example::

    topo = load_topology("topologies/nvlink.yaml")
    topo = uniform_topology(4, bandwidth=25e9)
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import networkx as nx

from planner.datafile import decode_yaml, read_text
from planner.errors import InputError
from planner.fileio import check_input_file
from planner.limits import MAX_DEVICES, MAX_LINKS, MAX_TOPOLOGY_DEVICES, check_name
from planner.records import Kind, Name, read_record, read_value
from planner.topology.entries import (
    DEVICE_KEYS,
    DEVICES,
    DeviceEntry,
    HostDevices,
    HostGroup,
    LinkEntry,
    SwitchEntry,
)
from planner.topology.graph import DEFAULT_HOST, SCHEMA, Device, Topology

__all__ = ["as_topology", "expand_names", "load_topology", "topology_from_dict", "uniform_topology"]

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
# Digits of a range bound: enough for MAX_DEVICES names starting anywhere below 10**9.
_RANGE_DIGITS = 9


def expand_names(pattern: str, *, file: str | None = None, field: str | None = None) -> list[str]:
    """Expand ``{a..b}`` ranges (inclusive, several multiply) in a name.

    Example::

        expand_names("gpu{0..3}")          # ['gpu0', 'gpu1', 'gpu2', 'gpu3']
        expand_names("n{0..1}.g{0..1}")    # ['n0.g0', 'n0.g1', 'n1.g0', 'n1.g1']
    """
    check_name(pattern, file=file, field=field)
    spans = list(_RANGE.finditer(pattern))
    if not spans:
        return [pattern]
    pieces = _RANGE.split(pattern)  # text, a, b, text, a, b, ..., text
    ranges = []
    total = 1
    for m in spans:
        if max(len(m.group(1)), len(m.group(2))) > _RANGE_DIGITS:
            raise InputError(
                f"range {_clip(m.group(0))!r} has a bound of more than {_RANGE_DIGITS} digits; "
                f"expected at most {MAX_DEVICES:,} names in all",
                file=file,
                field=field,
            )
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise InputError(
                f"range {m.group(0)!r} in {pattern!r} counts down; expected {{low..high}}",
                file=file,
                field=field,
            )
        ranges.append(range(lo, hi + 1))
        total *= hi - lo + 1
        if total > MAX_DEVICES:  # checked before a single name is built
            raise InputError(
                f"{_clip(pattern)!r} expands to more than {MAX_DEVICES:,} names; "
                f"expected at most {MAX_DEVICES:,}",
                file=file,
                field=field,
            )
    texts = pieces[0::3]
    out = []
    for combo in itertools.product(*ranges):
        parts = [texts[0]]
        for k, value in enumerate(combo):
            parts += [str(value), texts[k + 1]]
        out.append("".join(parts))
    return out


class _Builder:
    """Builds the graph from the file's entries (read already): expands name ranges, refuses
    names given twice, links to undeclared names and second links between one pair."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.devices: list[Device] = []
        self.switches: list[tuple[str, str]] = []
        self.names: set[str] = set()
        self.graph = nx.Graph()
        self.link_origin: dict[frozenset[str], str] = {}
        self.num_links = 0

    def fail(self, message: str, field: str | None) -> InputError:
        return InputError(message, file=self.source, field=field)

    def claim(self, name: object, field: str) -> str:
        if not isinstance(name, str) or not name.strip():
            raise self.fail(f"expected a non-empty name; got {name!r}", field)
        check_name(name, file=self.source, field=field)
        if name in self.names:
            raise self.fail(f"duplicate name {name!r}; device and switch names must differ", field)
        self.names.add(name)
        return name

    def add_device(self, entry: DeviceEntry, field: str) -> None:
        names = expand_names(entry.name, file=self.source, field=f"{field}.name")
        self.check_device_count(len(names), field)
        for name in names:
            self.claim(name, f"{field}.name")
            self.devices.append(
                Device(
                    name, entry.memory, entry.speed, entry.host, entry.kind, entry.message_overhead
                )
            )
            self.graph.add_node(name)

    def check_device_count(self, more: int, field: str) -> None:
        """Refuse more than :data:`MAX_TOPOLOGY_DEVICES` devices, before they are built."""
        if len(self.devices) + more > MAX_TOPOLOGY_DEVICES:
            raise self.fail(
                f"{len(self.devices) + more:,} devices; expected at most "
                f"{MAX_TOPOLOGY_DEVICES:,} in one topology",
                field,
            )

    def add_switch(self, name: str, kind: str, field: str) -> None:
        names = expand_names(name, file=self.source, field=field)
        if len(self.switches) + len(names) > MAX_DEVICES:
            raise self.fail(f"more than {MAX_DEVICES:,} switches; expected at most that", field)
        for one in names:
            self.claim(one, field)
            self.switches.append((one, kind))
            self.graph.add_node(one, kind=kind)

    def add_link(self, entry: LinkEntry, field: str) -> None:
        between = list(entry.between)
        left = expand_names(between[0], file=self.source, field=f"{field}.between")
        right = expand_names(between[1], file=self.source, field=f"{field}.between")
        for name in left + right:
            if name not in self.names:
                raise self.fail(f"{name!r} is not a declared device or switch", f"{field}.between")
        if self.num_links + len(left) * len(right) > MAX_LINKS:  # before a pair is built
            raise self.fail(
                f"more than {MAX_LINKS:,} links ({len(left):,} x {len(right):,} here); "
                "expected at most that",
                f"{field}.between",
            )
        pairs = {frozenset((u, v)) for u in left for v in right if u != v}
        self.num_links += len(pairs)
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
                u,
                v,
                bandwidth=entry.bandwidth * entry.count,
                latency_ms=entry.latency,
                count=entry.count,
                kind=entry.kind,
            )


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"expected device defaults (a mapping); got {value!r}")
    return value


_DEFAULTS = Kind("device defaults (a mapping)", _mapping)


@dataclass
class _TopologyFile:
    """The top level of a topology file (beside ``schema``). ``devices``, ``switches``,
    ``hosts`` and ``defaults`` are read entry by entry (the defaults merged into each
    device first); ``relay`` and ``allreduce_efficiency`` are checked by :class:`Topology`."""

    name: Name | None = None
    description: Any = None
    defaults: Annotated[dict[str, Any], _DEFAULTS] = field(default_factory=dict)
    devices: Any = None
    switches: list[Any] = field(default_factory=list)
    links: list[Any] = field(default_factory=list)
    hosts: Any = None
    relay: Any = "all"
    allreduce_efficiency: Any = 1.0


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
    if isinstance(schema, str) and schema in other:
        raise InputError(
            f"this is a pipeplan {other[schema]} ({schema!r}); expected a topology YAML "
            f"({SCHEMA!r})",
            file=source,
            field="schema",
        )
    if schema != SCHEMA:
        raise InputError(f"expected {SCHEMA!r}; got {schema!r}", file=source, field="schema")
    top = read_record(_TopologyFile, data, file=source, ignore=("schema",))
    if top.devices is None and top.hosts is None:
        raise InputError(
            "missing; expected a list of devices (or a 'hosts' shorthand)",
            file=source,
            field="devices",
        )
    defaults = _defaults(top.defaults, source)
    builder = _Builder(source)
    if top.hosts is not None:
        _add_hosts(builder, top.hosts, defaults)
    devices = [] if top.devices is None else top.devices
    if not isinstance(devices, list) or (top.hosts is None and not devices):
        raise InputError(
            f"expected a non-empty list of devices; got {devices!r}", file=source, field="devices"
        )
    for k, raw in enumerate(devices):
        where = f"devices[{k}]"
        entry = {**defaults, **raw} if isinstance(raw, dict) else raw
        builder.add_device(read_record(DeviceEntry, entry, file=source, field=where), where)
    for k, raw in enumerate(top.switches):
        where = f"switches[{k}]"
        switch = (
            read_record(SwitchEntry, raw, file=source, field=where)
            if isinstance(raw, dict)
            else SwitchEntry(raw)
            if isinstance(raw, str)
            else None
        )
        if switch is None:
            raise InputError(f"expected a switch name; got {raw!r}", file=source, field=where)
        builder.add_switch(switch.name, switch.kind, where)
    links = read_value(list[LinkEntry], top.links, file=source, field="links")
    for k, link in enumerate(links):
        builder.add_link(link, f"links[{k}]")
    for name, _ in builder.switches:
        if builder.graph.degree(name) == 0:
            raise InputError(f"switch {name!r} has no links", file=source, field="switches")
    name = top.name or (Path(source).stem if source != "<topology>" else "topology")
    return Topology(
        name,
        builder.graph,
        builder.devices,
        source=source,
        relay=top.relay,
        allreduce_efficiency=top.allreduce_efficiency,
    )


def _defaults(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The device defaults: any device key but ``name``."""
    for key in raw:
        if key not in DEVICE_KEYS - {"name"}:
            raise InputError(
                f"unknown field; expected one of {', '.join(sorted(DEVICE_KEYS - {'name'}))}",
                file=source,
                field=f"defaults.{key}",
            )
    return raw


def _add_hosts(builder: _Builder, spec: object, defaults: dict[str, Any]) -> None:
    """Expand the ``hosts`` shorthand: N identical hosts, a switch inside, a network between."""
    source = builder.source
    groups = spec if isinstance(spec, list) else [spec]
    counters: dict[str, int] = {}

    def next_name(prefix: str) -> str:
        k = counters.get(prefix, 0)
        counters[prefix] = k + 1
        return f"{prefix}{k}"

    for g, raw in enumerate(groups):
        where = f"hosts[{g}]" if isinstance(spec, list) else "hosts"
        group = read_record(HostGroup, raw, file=source, field=where)
        if group.devices is None:
            raise InputError(
                f"expected {DEVICES.expected}; got None", file=source, field=f"{where}.devices"
            )
        shared = {k: v for k, v in defaults.items() if k != "host"}  # the group's hosts
        dev = read_record(
            HostDevices, {**shared, **group.devices}, file=source, field=f"{where}.devices"
        )
        builder.check_device_count(group.count * dev.count, f"{where}.count")  # before any
        switch, network = group.switch, group.network
        if network is not None and network.per == "host" and switch is None:
            raise InputError(
                "'per: host' attaches the network to the in-host switch; "
                "expected a 'switch' entry as well",
                file=source,
                field=f"{where}.network.per",
            )
        if network is not None and network.name not in builder.names:
            builder.add_switch(network.name, network.kind, f"{where}.network")
        for _ in range(group.count):
            host = next_name(group.name)
            names = [next_name(dev.name) for _ in range(dev.count)]
            for name in names:
                entry = DeviceEntry(
                    name, dev.memory, dev.speed, host, dev.kind, dev.message_overhead
                )
                builder.add_device(entry, f"{where}.devices")
            if switch is not None:
                sw = next_name(switch.name)
                builder.add_switch(sw, switch.kind, f"{where}.switch")
                for name in names:
                    link = LinkEntry(
                        (name, sw), switch.bandwidth, switch.latency, switch.count, switch.kind
                    )
                    builder.add_link(link, f"{where}.switch")
            if network is not None:
                ends = names if network.per == "device" else [sw]
                for end in ends:
                    link = LinkEntry(
                        (end, network.name),
                        network.bandwidth,
                        network.latency,
                        network.count,
                        network.kind,
                    )
                    builder.add_link(link, f"{where}.network")


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read, validate and build a topology file (``pipeplan.topology/v1`` YAML).

    Example::

        topo = load_topology("topologies/nvlink.yaml")
    """
    source = str(path)
    file = check_input_file(path)
    # Strict: duplicate keys, long integers, deep nesting and huge files are refused.
    data = decode_yaml(read_text(file, what="a topology YAML"), source=source)
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
