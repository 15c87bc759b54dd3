"""Parsing and printing of sizes, bandwidths and times with explicit units.

Topology files say ``80 GiB``, ``450 GB/s`` and ``1 us``; inside pipeplan everything is
bytes, bytes per second and milliseconds. A number without a unit is an error, because
``memory: 80`` could mean anything. Binary prefixes (``KiB``) are powers of 1024, decimal
prefixes (``KB``, ``kB``) powers of 1000. ``B`` is a byte and ``b``/``bit`` a bit, so
``25 GB/s`` and ``200 Gbit/s`` (or ``200 Gb/s``, ``200 Gbps``) are the same bandwidth.

Example::

    parse_bytes("80 GiB")            # 85899345920
    parse_bandwidth("200 Gbit/s")    # 25e9 bytes/s
    parse_time_ms("1 us")            # 0.001
    format_bandwidth(25e9)           # '25 GB/s'
"""

from __future__ import annotations

import math
import re

from planner.errors import InputError

__all__ = [
    "parse_bytes",
    "parse_bandwidth",
    "parse_time_ms",
    "format_bytes",
    "format_bandwidth",
    "format_time_ms",
]

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-zµ/]+)\s*$")

_DECIMAL = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def _size_units() -> dict[str, float]:
    # Unit -> bytes. Bits are accepted for bandwidths only (see _bandwidth_units).
    units: dict[str, float] = {}
    for prefix, factor in {**_DECIMAL, **_BINARY}.items():
        units[f"{prefix}B"] = float(factor)
    units["bytes"] = units["byte"] = 1.0
    return units


def _bandwidth_units() -> dict[str, float]:
    # Unit -> bytes per second.
    units: dict[str, float] = {}
    for prefix, factor in {**_DECIMAL, **_BINARY}.items():
        units[f"{prefix}B/s"] = float(factor)
        units[f"{prefix}Bps"] = float(factor)
        units[f"{prefix}bit/s"] = factor / 8
        units[f"{prefix}b/s"] = factor / 8
        units[f"{prefix}bps"] = factor / 8
    return units


_SIZE_UNITS = _size_units()
_BANDWIDTH_UNITS = _bandwidth_units()
_TIME_UNITS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}
_KNOWN = {
    "a size": "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)",
    "a bandwidth": "B/s, KB/s, MB/s, GB/s, TB/s, GiB/s, ... or Mbit/s, Gbit/s, Tbit/s (Gb/s, Gbps)",
    "a time": "ns, us, ms or s",
}


def _parse(
    value: object,
    units: dict[str, float],
    *,
    what: str,
    example: str,
    file: str | None,
    field: str | None,
) -> float:
    """Split ``value`` into number and unit and return number * unit factor."""
    expectation = f"expected {what} with a unit, e.g. {example!r}"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"{expectation}; got {value!r}", file=file, field=field)
    if not isinstance(value, str):
        raise InputError(f"{expectation}; got the bare number {value!r}", file=file, field=field)
    match = _QUANTITY.match(value)
    if match is None:
        raise InputError(f"{expectation}; got {value!r}", file=file, field=field)
    number, unit = float(match.group(1)), match.group(2)
    if unit not in units:
        raise InputError(
            f"unknown unit {unit!r} in {value!r}; expected {what} in {_KNOWN[what]}",
            file=file,
            field=field,
        )
    result = number * units[unit]
    if not math.isfinite(result):
        raise InputError(f"{expectation}; got the non-finite {value!r}", file=file, field=field)
    return result


def parse_bytes(value: object, *, file: str | None = None, field: str | None = None) -> int:
    """Parse a memory size such as ``"80 GiB"`` or ``"512 MB"`` into bytes.

    Example::

        parse_bytes("1 KiB")   # 1024
        parse_bytes("1 KB")    # 1000
    """
    units = _SIZE_UNITS
    return int(round(_parse(value, units, what="a size", example="80 GiB", file=file, field=field)))


def parse_bandwidth(value: object, *, file: str | None = None, field: str | None = None) -> float:
    """Parse a bandwidth such as ``"450 GB/s"`` or ``"400 Gbit/s"`` into bytes per second.

    Example::

        parse_bandwidth("400 Gbit/s")   # 50e9
    """
    return _parse(
        value, _BANDWIDTH_UNITS, what="a bandwidth", example="450 GB/s", file=file, field=field
    )


def parse_time_ms(value: object, *, file: str | None = None, field: str | None = None) -> float:
    """Parse a duration such as ``"1 us"`` or ``"2.5 ms"`` into milliseconds.

    Example::

        parse_time_ms("500 ns")   # 0.0005
    """
    return _parse(value, _TIME_UNITS, what="a time", example="1 us", file=file, field=field)


def _format(value: float, steps: list[tuple[float, str]]) -> str:
    for factor, unit in steps:
        if abs(value) >= factor:
            return f"{value / factor:.4g} {unit}"
    factor, unit = steps[-1]
    return f"{value / factor:.4g} {unit}"


def _exact(value: float, steps: list[tuple[float, str]]) -> str:
    # The largest unit whose shortest decimal form reads back to exactly ``value``.
    for factor, unit in steps:
        text = repr(value / factor)
        if abs(value) >= factor and float(text) * factor == value:
            return f"{text.removesuffix('.0')} {unit}"
    factor, unit = steps[-1]
    return f"{repr(value / factor).removesuffix('.0')} {unit}"


def format_bytes(nbytes: float, *, binary: bool = True, exact: bool = False) -> str:
    """Human-readable size that :func:`parse_bytes` reads back (exactly with ``exact=True``).

    Example::

        format_bytes(80 * 2**30)   # '80 GiB'
    """
    if exact:
        steps = [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB")]
        steps += [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1, "B")]
        return _exact(float(nbytes), steps)
    if binary:
        steps = [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1, "B")]
    else:
        steps = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1, "B")]
    return _format(float(nbytes), steps)


def format_bandwidth(bytes_per_s: float, *, exact: bool = False) -> str:
    """Human-readable bandwidth (decimal, as vendors quote it) that :func:`parse_bandwidth` reads.

    Example::

        format_bandwidth(25e9)   # '25 GB/s'
    """
    if math.isinf(bytes_per_s):
        return "inf"
    steps = [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s"), (1, "B/s")]
    if exact:
        return _exact(float(bytes_per_s), steps)
    return _format(float(bytes_per_s), steps)


def format_time_ms(ms: float, *, exact: bool = False) -> str:
    """Human-readable duration that :func:`parse_time_ms` reads back.

    Example::

        format_time_ms(0.001)   # '1 us'
    """
    if ms == 0:
        return "0 us"
    steps = [(1e3, "s"), (1.0, "ms"), (1e-3, "us"), (1e-6, "ns")]
    if exact:
        return _exact(float(ms), steps)
    return _format(float(ms), steps)
