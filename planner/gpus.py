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
from typing import Any

from planner.errors import InputError
from planner.units import parse_bandwidth, parse_bytes

__all__ = [
    "CATALOG_SCHEMA",
    "EFFICIENCY_NAMES",
    "PRECISION_KEYS",
    "Efficiency",
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
_ENTRY_KEYS = {
    "name",
    "description",
    "tflops",
    "memory",
    "memory_bandwidth",
    "interconnect_bandwidth",
    "source",
    "efficiency",
    "measure",
}


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
    import yaml

    source = "planner/data/gpus.yaml"
    data = yaml.safe_load(_catalog_text())
    if not isinstance(data, dict) or data.get("schema") != CATALOG_SCHEMA:
        raise InputError(f"expected schema {CATALOG_SCHEMA!r}", file=source, field="schema")
    default = _efficiency(data.get("default_efficiency", {}), Efficiency(), source)
    entries = data.get("gpus")
    if not isinstance(entries, dict) or not entries:
        raise InputError("expected a mapping of GPU names to entries", file=source, field="gpus")
    return {
        str(name): gpu_from_dict(entry, name=str(name), source=source, default=default)
        for name, entry in entries.items()
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
    import yaml

    source = str(path)
    if not path.is_file():
        raise InputError("file does not exist; expected a GPU entry in YAML", file=source)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):
        raise InputError("not valid YAML; expected a GPU entry", file=source) from None
    if not isinstance(data, dict):
        raise InputError("expected a mapping (one GPU entry)", file=source)
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise InputError(f"expected a non-empty name, got {name!r}", file=source, field="name")
    return gpu_from_dict(data, name=name, source=source, default=Efficiency())


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

    def at(key: str) -> str:
        return f"{where}.{key}" if where else key

    if not isinstance(entry, dict):
        raise InputError("expected a mapping", file=source, field=where or None)
    for key in entry:
        if key not in _ENTRY_KEYS:
            raise InputError(
                f"unknown field {key!r}; expected one of {', '.join(sorted(_ENTRY_KEYS))}",
                file=source,
                field=at(str(key)),
            )
    source_text = entry.get("source")
    if not isinstance(source_text, str) or not source_text.strip():
        raise InputError(
            "expected where the numbers come from (a datasheet, a measurement)",
            file=source,
            field=at("source"),
        )
    efficiency = _efficiency(entry.get("efficiency", {}), default or Efficiency(), source, where)
    measure = entry.get("measure", False)
    if not isinstance(measure, bool):
        raise InputError(
            f"expected true or false, got {measure!r}", file=source, field=at("measure")
        )
    description = str(entry.get("description", name))
    source_text = " ".join(source_text.split())
    if measure:  # peaks come from a measurement when profiling (the cpu entry)
        return GpuSpec(name, description, {}, 0, 0.0, 0.0, source_text, efficiency, measure=True)
    return GpuSpec(
        name=name,
        description=description,
        peak_flops_per_s=_tflops(entry.get("tflops"), source, at("tflops")),
        memory_bytes=_positive(parse_bytes, entry, "memory", source, at("memory")),
        memory_bytes_per_s=_positive(
            parse_bandwidth, entry, "memory_bandwidth", source, at("memory_bandwidth")
        ),
        interconnect_bytes_per_s=parse_bandwidth(
            entry.get("interconnect_bandwidth", "0 GB/s"),
            file=source,
            field=at("interconnect_bandwidth"),
        ),
        source=source_text,
        efficiency=efficiency,
    )


def _positive(parse: Any, entry: dict[str, Any], key: str, source: str, field: str) -> Any:
    if key not in entry:
        raise InputError("missing", file=source, field=field)
    value = parse(entry[key], file=source, field=field)
    if not value > 0:
        raise InputError(f"expected a positive value, got {entry[key]!r}", file=source, field=field)
    return value


def _tflops(raw: Any, source: str, field: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise InputError(
            f"expected a mapping of precision to dense TFLOP/s ({', '.join(PRECISION_KEYS)})",
            file=source,
            field=field,
        )
    out: dict[str, float] = {}
    for key, value in raw.items():
        if key not in PRECISION_KEYS:
            raise InputError(
                f"unknown precision {key!r}; expected {', '.join(PRECISION_KEYS)}",
                file=source,
                field=f"{field}.{key}",
            )
        if not _positive_number(value):
            raise InputError(
                f"expected a positive number of TFLOP/s, got {value!r}",
                file=source,
                field=f"{field}.{key}",
            )
        out[str(key)] = float(value) * 1e12
    missing = [k for k in _REQUIRED_PRECISIONS if k not in out]
    if missing:
        raise InputError(f"missing {', '.join(missing)}", file=source, field=field)
    return out


def _positive_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _efficiency(raw: Any, base: Efficiency, source: str, where: str = "") -> Efficiency:
    field = f"{where}.efficiency" if where else "efficiency"
    if not isinstance(raw, dict):
        raise InputError(
            f"expected a mapping of {', '.join(EFFICIENCY_NAMES)} to fractions",
            file=source,
            field=field,
        )
    values = base.to_dict()
    for key, value in raw.items():
        values[_efficiency_name(key, field, source)] = _fraction(value, f"{field}.{key}", source)
    return Efficiency(**values)


def _efficiency_name(key: Any, field: str, source: str | None) -> str:
    if key not in EFFICIENCY_NAMES:
        raise InputError(
            f"unknown efficiency {key!r}; expected {', '.join(EFFICIENCY_NAMES)}",
            file=source,
            field=field,
        )
    return str(key)


def _fraction(value: Any, field: str, source: str | None) -> float:
    if not _positive_number(value) or value > 1:
        raise InputError(f"expected a fraction in (0, 1], got {value!r}", file=source, field=field)
    return float(value)


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
        name = _efficiency_name(key, "--efficiency", None)
        try:
            number: Any = float(raw)
        except ValueError:
            number = raw
        values[name] = _fraction(number, "--efficiency", None)
    return Efficiency(**values)
