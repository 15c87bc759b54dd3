"""The GPU catalog: peak throughput, memory and interconnect of the GPUs pipeplan plans for.

The catalog is a data file inside the package (``planner/data/gpus.yaml``), one entry per
GPU with the source of every number; ``pipeplan profile --analytic --gpu NAME`` reads it,
and ``pipeplan topology cluster`` takes its GPUs' memory and NVLink bandwidth from it. A
user's own GPU is a YAML file holding one entry of the same form (``--gpu my-gpu.yaml``).
:class:`Efficiency` names the fractions of the peaks each class of operation reaches.

Example::

    h100 = gpu_spec("h100-sxm")
    h100.peak_flops_per_s["bf16"]            # 989.4e12
    parse_efficiency("matmul=0.6", h100.efficiency).matmul   # 0.6
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from planner.datafile import decode_yaml, read_data
from planner.errors import InputError
from planner.limits import MAX_BANDWIDTH, MAX_BYTES, MIN_BANDWIDTH
from planner.records import NAME, Keys, Kind, Length, Name, OneOf, Text, read_record
from planner.units import parse_bandwidth, parse_bytes

__all__ = [
    "CATALOG_SCHEMA",
    "EFFICIENCY_NAMES",
    "MAX_TFLOPS",
    "PRECISION_KEYS",
    "Efficiency",
    "GpuEntry",
    "GpuSpec",
    "catalog_names",
    "gpu_from_dict",
    "gpu_spec",
    "load_catalog",
    "parse_efficiency",
]

CATALOG_SCHEMA = "pipeplan.gpus/v1"
EFFICIENCY_NAMES = ("matmul", "attention", "memory")
"""The classes of operation with an efficiency of their own (see planner/data/gpus.yaml)."""
PRECISION_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""Keys of an entry's ``tflops``; fp32, bf16 and fp16 are required."""
_REQUIRED_PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the peaks reached: matrix products, fused attention, memory traffic.

    Example::

        Efficiency(matmul=0.6).to_dict()   # {'matmul': 0.6, 'attention': 0.5, 'memory': 0.8}
    """

    matmul: float = 0.7
    attention: float = 0.5
    memory: float = 0.8

    def to_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in EFFICIENCY_NAMES}


@dataclass(frozen=True)
class GpuSpec:
    """One catalog entry. ``peak_flops_per_s`` maps a precision key to dense FLOP/s;
    ``measure``: the peaks are measured on this machine when profiling (the ``cpu`` entry)."""

    name: str
    description: str
    peak_flops_per_s: dict[str, float]
    memory_bytes: int
    memory_bytes_per_s: float
    interconnect_bytes_per_s: float
    source: str
    efficiency: Efficiency = field(default_factory=Efficiency)
    measure: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The entry as a profile records it (numbers in FLOP/s, bytes, bytes/s).

        Example::

            gpu_spec("h100-sxm").to_dict()["memory_bytes_per_s"]   # 3.35e12
        """
        return {
            "name": self.name,
            "description": self.description,
            "peak_flops_per_s": dict(self.peak_flops_per_s),
            "memory_bytes": self.memory_bytes,
            "memory_bytes_per_s": self.memory_bytes_per_s,
            "interconnect_bytes_per_s": self.interconnect_bytes_per_s,
            "source": self.source,
        }

    def with_measured(
        self, peak_flops_per_s: dict[str, float], memory_bytes_per_s: float
    ) -> GpuSpec:
        """This entry with measured peaks filled in (the ``cpu`` entry).

        Example::

            gpu_spec("cpu").with_measured({"fp32": 5e10, "bf16": 1e10, "fp16": 1e10}, 1e10)
        """
        return replace(
            self,
            peak_flops_per_s=dict(peak_flops_per_s),
            memory_bytes_per_s=memory_bytes_per_s,
            measure=False,
        )


def _catalog_text() -> str:
    return (resources.files("planner") / "data" / "gpus.yaml").read_text(encoding="utf-8")


def load_catalog() -> dict[str, GpuSpec]:
    """Every entry of the catalog shipped in the package, by name.

    Example::

        sorted(load_catalog())   # ['a100-40gb-sxm', 'a100-80gb-sxm', 'b200', 'cpu', ...]
    """
    source = "planner/data/gpus.yaml"
    data = decode_yaml(_catalog_text(), source=source)
    if not isinstance(data, dict) or data.get("schema") != CATALOG_SCHEMA:
        raise InputError(f"expected schema {CATALOG_SCHEMA!r}", file=source, field="schema")
    catalog = read_record(_Catalog, data, file=source, ignore={"schema"})
    default = replace(Efficiency(), **catalog.default_efficiency)
    return {
        name: _spec(entry, name=name, source=source, where=f"gpus.{name}", default=default)
        for name, entry in catalog.gpus.items()
    }


def catalog_names() -> list[str]:
    """The names ``--gpu`` accepts, in catalog order.

    Example::

        "h100-sxm" in catalog_names()   # True
    """
    return list(load_catalog())


def gpu_spec(name_or_path: str | os.PathLike[str]) -> GpuSpec:
    """A catalog entry by name, or a user's entry from a YAML file (``--gpu my.yaml``).

    Example::

        gpu_spec("a100-80gb-sxm").memory_bytes      # 85899345920
        gpu_spec("gpus/my-gpu.yaml").name
    """
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text:
        return _user_entry(Path(text))
    catalog = load_catalog()
    if text not in catalog:
        raise InputError(
            f"unknown GPU {text!r}; expected one of {', '.join(catalog)}, or a YAML file "
            "with an entry of your own (docs/profile.md#analytic-profiles)",
            field="--gpu",
        )
    return catalog[text]


def _user_entry(path: Path) -> GpuSpec:
    source = str(path)
    if not path.is_file():
        raise InputError("file does not exist; expected a GPU entry in YAML", file=source)
    data = read_data(path, what="a GPU entry in YAML")
    name = data.get("name", path.stem) if isinstance(data, dict) else path.stem
    return gpu_from_dict(data, name=str(name), source=source, default=Efficiency())


def _positive_number(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not value > 0:
        raise InputError("expected a positive number")
    return float(value)


def _tflops(value: Any) -> float:
    try:
        tflops = _positive_number(value)
    except InputError:
        TFLOPS.fail(value)
    if tflops > MAX_TFLOPS:
        TFLOPS.fail(value)
    return tflops * 1e12


def _fraction(value: Any) -> float:
    try:
        ok = _positive_number(value) <= 1
    except InputError:
        ok = False
    if not ok:
        FRACTION.fail(value)
    return float(value)


def _size(value: Any) -> int:
    size = parse_bytes(value)
    if not 0 < size <= MAX_BYTES:
        SIZE.fail(value)
    return size


def _bandwidth(value: Any, *, low: float) -> float:
    speed = parse_bandwidth(value)
    if not low <= speed <= MAX_BANDWIDTH:
        (BANDWIDTH if low > 0 else LINK).fail(value)
    return speed


def _source(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        SOURCE.fail(value)
    return " ".join(value.split())


MAX_TFLOPS = 1e6
"""Dense TFLOP/s of one entry at most (1 EFLOP/s; a B200 has 2,250 in bf16)."""
TFLOPS = Kind(f"a positive number of dense TFLOP/s, at most {MAX_TFLOPS:g}", _tflops)
SIZE = Kind("a positive size such as '80 GiB' (at most 1 EiB)", _size)
BANDWIDTH = Kind(
    "a positive bandwidth such as '3.35 TB/s' (at most 1 EB/s)",
    lambda value: _bandwidth(value, low=MIN_BANDWIDTH),
)
LINK = Kind(
    "a bandwidth such as '450 GB/s' ('0 GB/s': none; at most 1 EB/s)",
    lambda value: _bandwidth(value, low=0.0),
)
FRACTION = Kind("a fraction in (0, 1]", _fraction)
SOURCE = Kind("where the numbers come from (a datasheet, a measurement)", _source)
_Efficiencies = Annotated[dict[str, Annotated[float, FRACTION]], Keys(OneOf(EFFICIENCY_NAMES))]


@dataclass(frozen=True)
class GpuEntry:
    """One entry as ``planner/data/gpus.yaml`` and a ``--gpu my-gpu.yaml`` file write it
    (read by :func:`planner.records.read_record`; :func:`gpu_from_dict` makes the
    :class:`GpuSpec`). ``tflops``, ``memory`` and ``memory_bandwidth`` are required unless
    ``measure`` (the ``cpu`` entry, whose peaks are measured when profiling).

    Example::

        read_record(GpuEntry, {"source": "my datasheet", "measure": True}, file="my.yaml")
    """

    source: Annotated[str, SOURCE]
    name: Name | None = None
    description: Annotated[str, Text()] | None = None
    tflops: Annotated[dict[str, Annotated[float, TFLOPS]], Keys(OneOf(PRECISION_KEYS))] | None = (
        None
    )
    memory: Annotated[int, SIZE] | None = None
    memory_bandwidth: Annotated[float, BANDWIDTH] | None = None
    interconnect_bandwidth: Annotated[float, LINK] = 0.0
    efficiency: _Efficiencies = field(default_factory=dict)
    measure: bool = False


@dataclass(frozen=True)
class _Catalog:
    """``planner/data/gpus.yaml``: the entries by name and the default efficiencies."""

    gpus: Annotated[dict[str, GpuEntry], Keys(NAME), Length(1, 1000)]
    default_efficiency: _Efficiencies = field(default_factory=dict)


def gpu_from_dict(
    entry: Any, *, name: str, source: str = "<gpu>", default: Efficiency | None = None
) -> GpuSpec:
    """Validate one entry (a mapping as in planner/data/gpus.yaml); every problem is one
    InputError naming the file and the field.

    Example::

        gpu_from_dict({"tflops": {"fp32": 10, "bf16": 80, "fp16": 80}, "memory": "24 GiB",
                       "memory_bandwidth": "1 TB/s", "source": "my datasheet"}, name="mine")
    """
    where = f"gpus.{name}" if source.startswith("planner/") else ""
    read = read_record(GpuEntry, entry, file=source, field=where)
    return _spec(read, name=name, source=source, where=where, default=default or Efficiency())


def _spec(entry: GpuEntry, *, name: str, source: str, where: str, default: Efficiency) -> GpuSpec:
    """The :class:`GpuSpec` of a read entry: the required fields of a datasheet entry."""

    def at(key: str) -> str:
        return f"{where}.{key}" if where else key

    efficiency = replace(default, **entry.efficiency)
    description = entry.description or name
    if entry.measure:  # peaks come from a measurement when profiling (the cpu entry)
        return GpuSpec(name, description, {}, 0, 0.0, 0.0, entry.source, efficiency, measure=True)
    if entry.tflops is None:
        raise InputError(
            f"expected a mapping of precision to dense TFLOP/s ({', '.join(PRECISION_KEYS)})",
            file=source,
            field=at("tflops"),
        )
    missing = [k for k in _REQUIRED_PRECISIONS if k not in entry.tflops]
    if missing:
        raise InputError(f"missing {', '.join(missing)}", file=source, field=at("tflops"))
    for key in ("memory", "memory_bandwidth"):
        if getattr(entry, key) is None:
            raise InputError("missing", file=source, field=at(key))
    assert entry.memory is not None and entry.memory_bandwidth is not None
    return GpuSpec(
        name=name,
        description=description,
        peak_flops_per_s=dict(entry.tflops),
        memory_bytes=entry.memory,
        memory_bytes_per_s=entry.memory_bandwidth,
        interconnect_bytes_per_s=entry.interconnect_bandwidth,
        source=entry.source,
        efficiency=efficiency,
    )


def parse_efficiency(text: str | None, base: Efficiency) -> Efficiency:
    """``--efficiency matmul=0.6,memory=0.8`` applied over ``base`` (the GPU's defaults).

    Example::

        parse_efficiency("memory=0.9", Efficiency()).memory    # 0.9
    """
    if text is None or not text.strip():
        return base
    values = base.to_dict()
    for item in text.split(","):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise InputError(
                f"expected NAME=FRACTION pairs separated by commas (e.g. matmul=0.6), got {item!r}",
                field="--efficiency",
            )
        try:
            name = OneOf(EFFICIENCY_NAMES).check(key)
            number: Any = float(raw)
        except ValueError:
            number = raw
        except InputError as exc:
            raise InputError(
                f"unknown efficiency {key!r}; {exc.message}", field="--efficiency"
            ) from None
        try:
            values[name] = FRACTION.check(number)
        except InputError as exc:
            raise InputError(exc.message, field="--efficiency") from None
    return Efficiency(**values)
