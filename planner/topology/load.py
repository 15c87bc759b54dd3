"""The topology file format (``pipeplan.topology/v1`` YAML): reading and validating it.

docs/topology.md describes the format; in short::

    name: dgx-h100
    devices:
      - {name: "gpu{0..7}", memory: 80 GiB, speed: 1.0, host: node0, kind: H100}
    switches: [nvswitch0]
    links:
      - {between: ["gpu{0..7}", nvswitch0], bandwidth: 450 GB/s, latency: 1 us}

Every problem is one :class:`~planner.errors.InputError` naming the file and the field.
:meth:`planner.topology.Topology.to_dict` writes the normalised form back.

Example::

    topo = load_topology("topologies/nvlink.yaml")
    topo = uniform_topology(4, bandwidth=25e9)
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any

import networkx as nx

from planner.datafile import decode_yaml, read_text
from planner.errors import InputError
from planner.fileio import check_input_file
from planner.limits import (
    MAX_BANDWIDTH,
    MAX_BYTES,
    MAX_DEVICES,
    MAX_LINK_COUNT,
    MAX_LINKS,
    MAX_SPEED,
    MAX_TIME_MS,
    MAX_TOPOLOGY_DEVICES,
    MIN_BANDWIDTH,
    MIN_SPEED,
    check_int,
    check_name,
    check_number,
)
from planner.topology.graph import DEFAULT_HOST, SCHEMA, Device, Topology
from planner.units import format_bytes, format_time_ms, parse_bandwidth, parse_bytes, parse_time_ms

__all__ = ["as_topology", "expand_names", "load_topology", "topology_from_dict", "uniform_topology"]

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
# Digits of a range bound: enough for MAX_DEVICES names starting anywhere below 10**9.
_RANGE_DIGITS = 9
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
    """Collects devices, switches and links from a parsed YAML mapping, validating as it goes."""

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

    def add_device(self, entry: dict[str, Any], field: str) -> None:
        pattern = entry.get("name")
        if not isinstance(pattern, str):
            raise self.fail(f"expected a device name; got {pattern!r}", f"{field}.name")
        if "memory" not in entry:
            raise self.fail("missing; expected a size such as '80 GiB'", f"{field}.memory")
        memory = parse_bytes(entry["memory"], file=self.source, field=f"{field}.memory")
        if memory <= 0:
            raise self.fail(f"expected a positive size; got {entry['memory']!r}", f"{field}.memory")
        if memory > MAX_BYTES:
            raise self.fail(
                f"expected at most {format_bytes(MAX_BYTES)}; got {entry['memory']!r}",
                f"{field}.memory",
            )
        speed = entry.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            raise self.fail(
                f"expected a positive number (1.0 = profiling device); got {speed!r}",
                f"{field}.speed",
            )
        check_number(speed, field=f"{field}.speed", low=MIN_SPEED, high=MAX_SPEED, file=self.source)
        host = entry.get("host", DEFAULT_HOST)
        kind = entry.get("kind", "")
        for key, value in (("host", host), ("kind", kind)):
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise self.fail(f"expected a string; got {value!r}", f"{field}.{key}")
            _text(value, self.source, f"{field}.{key}")
        names = expand_names(pattern, file=self.source, field=f"{field}.name")
        self.check_device_count(len(names), field)
        for name in names:
            self.claim(name, f"{field}.name")
            self.devices.append(Device(name, memory, float(speed), str(host), str(kind)))
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
        kind = _text(kind, self.source, field)
        for one in names:
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
        if not MIN_BANDWIDTH <= bw <= MAX_BANDWIDTH:
            raise self.fail(
                f"expected a bandwidth from {MIN_BANDWIDTH:g} B/s to {MAX_BANDWIDTH:g} B/s; "
                f"got {entry['bandwidth']!r}",
                f"{field}.bandwidth",
            )
        latency = 0.0
        if "latency" in entry:
            latency = parse_time_ms(entry["latency"], file=self.source, field=f"{field}.latency")
            if latency < 0:
                raise self.fail(
                    f"expected a latency >= 0; got {entry['latency']!r}", f"{field}.latency"
                )
            if latency > MAX_TIME_MS:
                raise self.fail(
                    f"expected a latency of at most {format_time_ms(MAX_TIME_MS)}; "
                    f"got {entry['latency']!r}",
                    f"{field}.latency",
                )
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise self.fail(f"expected a whole number >= 1; got {count!r}", f"{field}.count")
        check_int(count, field=f"{field}.count", high=MAX_LINK_COUNT, file=self.source)
        kind = _text(entry.get("kind", ""), self.source, f"{field}.kind")
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
                u, v, bandwidth=bw * count, latency_ms=latency, count=count, kind=kind
            )


def _text(value: object, source: str, field: str) -> str:
    """A free-text field (``kind``, ``host``) as a string: short, without control characters."""
    return check_name(str(value), file=source, field=field) if value != "" else ""


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        check_int(count, field=f"{gfield}.count", high=MAX_DEVICES, file=source)
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
        check_int(per_host, field=f"{gfield}.devices.count", high=MAX_DEVICES, file=source)
        builder.check_device_count(count * per_host, f"{gfield}.count")  # before any is built
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
    if isinstance(schema, str) and schema in other:
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
    check_name(name, file=source, field="name")
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
