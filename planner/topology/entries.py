"""The entries of a topology file as records: devices, links, switches, ``hosts`` groups.

:mod:`planner.records` reads each entry (one InputError naming the file, the field and what
was expected); :mod:`planner.topology.load` expands their name ranges and builds the graph.
Sizes, bandwidths and times are written with units (``80 GiB``, ``450 GB/s``, ``1 us``,
:mod:`planner.units`) and read as bytes, bytes per second and milliseconds.

Example::

    link = read_record(LinkEntry, {"between": ["gpu0", "sw"], "bandwidth": "25 GB/s"},
                       file="t.yaml", field="links[0]")
    link.bandwidth_bytes_per_s, link.latency_ms, link.count     # (25e9, 0.0, 1)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from planner.errors import InputError
from planner.limits import (
    MAX_BANDWIDTH,
    MAX_BYTES,
    MAX_DEVICES,
    MAX_LINK_COUNT,
    MAX_SPEED,
    MAX_TIME_MS,
    MIN_BANDWIDTH,
    MIN_SPEED,
    check_int,
    check_name,
    check_number,
    short_repr,
)
from planner.records import Kind
from planner.topology.graph import DEFAULT_HOST
from planner.units import format_bytes, format_time_ms, parse_bandwidth, parse_bytes, parse_time_ms

__all__ = [
    "DEVICES",
    "DEVICE_KEYS",
    "DeviceEntry",
    "HostDevices",
    "HostGroup",
    "HostNetwork",
    "HostSwitch",
    "LinkEntry",
    "SwitchEntry",
]


def _fail(expected: str, value: Any) -> InputError:
    return InputError(f"expected {expected}; got {short_repr(value)}")


def _size(value: Any) -> int:
    size = parse_bytes(value)
    if size <= 0:
        raise _fail("a positive size", value)
    if size > MAX_BYTES:
        raise _fail(f"at most {format_bytes(MAX_BYTES)}", value)
    return size


def _bandwidth(value: Any) -> float:
    bandwidth = parse_bandwidth(value)
    if bandwidth <= 0:
        raise _fail("a positive bandwidth", value)
    if not MIN_BANDWIDTH <= bandwidth <= MAX_BANDWIDTH:
        raise _fail(f"a bandwidth from {MIN_BANDWIDTH:g} B/s to {MAX_BANDWIDTH:g} B/s", value)
    return bandwidth


def _time(what: str) -> Callable[[Any], float]:
    """A check of a time field: ``what`` (``a latency``) >= 0, at most ``MAX_TIME_MS``."""

    def check(value: Any) -> float:
        ms = parse_time_ms(value)
        if ms < 0:
            raise _fail(f"{what} >= 0", value)
        if ms > MAX_TIME_MS:
            raise _fail(f"{what} of at most {format_time_ms(MAX_TIME_MS)}", value)
        return ms

    return check


_latency = _time("a latency")
_overhead = _time("a time")


def _speed(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _fail("a positive number (1.0 = profiling device)", value)
    return check_number(value, field="", low=MIN_SPEED, high=MAX_SPEED)


def _whole(high: int) -> Kind:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _fail("a whole number >= 1", value)
        return check_int(value, field="", high=high)

    return Kind(f"a whole number from 1 to {high:,}", check)


def _text(value: Any) -> str:
    """A free-text field (``kind``, ``host``): short, without control characters."""
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise _fail("a string", value)
    return check_name(str(value), field=None) if value != "" else ""


def _pair(value: Any) -> tuple[str, str]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(x, str) for x in value)):
        raise _fail("a list of two names", value)
    return value[0], value[1]


def _per(value: Any) -> str:
    if value not in ("device", "host"):
        raise _fail("'device' or 'host'", value)
    return str(value)


SIZE = Kind("a size such as '80 GiB'", _size)
BANDWIDTH = Kind("a bandwidth such as '25 GB/s'", _bandwidth)
LATENCY = Kind("a time such as '1 us'", _latency)
SPEED = Kind("a positive number (1.0 = profiling device)", _speed)
OVERHEAD = Kind("a time such as '200 us'", _overhead)
TEXT = Kind("a string", _text)

_Text = Annotated[str, TEXT]
_LinkCount = Annotated[int, _whole(MAX_LINK_COUNT)]
_HostCount = Annotated[int, _whole(MAX_DEVICES)]

DEVICE_KEYS = frozenset({"name", "memory", "speed", "host", "kind", "message_overhead"})
"""The keys of a device entry (``defaults`` may give all but ``name``)."""


@dataclass(frozen=True)
class DeviceEntry:
    """``devices[k]``: one device, or several when ``name`` holds ``{a..b}`` ranges."""

    name: str  # a name pattern: expanded (and checked) by load.expand_names
    memory: Annotated[int, SIZE]
    speed: Annotated[float, SPEED] = 1.0
    host: _Text = DEFAULT_HOST
    kind: _Text = ""
    # ms of this device's own time per message it sends to or receives from another device
    message_overhead: Annotated[float, OVERHEAD] = 0.0


@dataclass(frozen=True)
class LinkEntry:
    """``links[k]``: a link between two names (each may be a range: every pair is linked);
    ``count`` parallel links share one entry (its bandwidth is per link)."""

    between: Annotated[tuple[str, str], Kind("a list of two names", _pair)]
    bandwidth: Annotated[float, BANDWIDTH]
    latency: Annotated[float, LATENCY] = 0.0
    count: _LinkCount = 1
    kind: _Text = ""


@dataclass(frozen=True)
class SwitchEntry:
    """``switches[k]`` written as an object (else just its name)."""

    name: str
    kind: _Text = ""


@dataclass(frozen=True)
class HostDevices:
    """A ``hosts`` group's ``devices``: ``count`` identical devices per host, named
    ``name`` + a number (their host is the group's)."""

    memory: Annotated[int, SIZE]
    count: _HostCount = 1
    name: _Text = "gpu"
    speed: Annotated[float, SPEED] = 1.0
    kind: _Text = ""
    message_overhead: Annotated[float, OVERHEAD] = 0.0


@dataclass(frozen=True)
class HostSwitch:
    """A ``hosts`` group's ``switch``: one per host, linked to each of its devices."""

    bandwidth: Annotated[float, BANDWIDTH]
    name: _Text = "switch"
    latency: Annotated[float, LATENCY] = 0.0
    count: _LinkCount = 1
    kind: _Text = ""


@dataclass(frozen=True)
class HostNetwork:
    """A ``hosts`` group's ``network``: one switch joining every device (``per: device``)
    or every host's switch (``per: host``)."""

    bandwidth: Annotated[float, BANDWIDTH]
    name: _Text = "network"
    latency: Annotated[float, LATENCY] = 0.0
    count: _LinkCount = 1
    kind: _Text = ""
    per: Annotated[str, Kind("'device' or 'host'", _per)] = "device"


def _devices(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(DEVICES.expected, value)
    return value


DEVICES = Kind("the per-host devices (a mapping)", _devices)


@dataclass(frozen=True)
class HostGroup:
    """One ``hosts`` group: ``count`` identical hosts named ``name`` + a number. Its
    ``devices`` are read as :class:`HostDevices` once the file's ``defaults`` are merged
    in."""

    # None: left out (refused by the loader with the same words as a non-mapping)
    devices: Annotated[dict[str, Any], DEVICES] | None = None
    count: _HostCount = 1
    name: _Text = "node"
    switch: HostSwitch | None = None
    network: HostNetwork | None = None
