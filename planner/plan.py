"""The plan format (``pipeplan.plan/v1``): stages, schedule, predictions, solver facts.

A :class:`Plan` is what ``pipeplan solve`` and ``pipeplan simulate -o`` write and what
``pipeplan show`` and ``pipeplan run`` read. Its stages are :mod:`planner.stages`'s
(re-exported here: :func:`validate_stages` is the single check that a partition covers
the model's layers exactly once on known, distinct devices).

Example::

    stages = parse_stages("0-3:gpu0,gpu1;4-7:gpu2")
    validate_stages(stages, num_layers=8, topology=None)
    plan = Plan.load("plan.json")
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from planner.errors import InputError
from planner.fileio import atomic_write_json, read_json
from planner.stages import (
    StageSpec,
    as_stages,
    parse_stages,
    stages_from_data,
    validate_stages,
)

__all__ = [
    "SCHEMA",
    "Plan",
    "StageSpec",
    "as_stages",
    "parse_stages",
    "plan_from_dict",
    "stages_from_data",
    "validate_stages",
]

SCHEMA = "pipeplan.plan/v1"


@dataclass
class Plan:
    """A complete plan; mirrors the contract's plan JSON field by field."""

    profile: dict[str, Any]
    topology: dict[str, Any]
    microbatch_size: int
    num_microbatches: int
    stages: list[StageSpec]
    schedule: dict[str, Any]
    predicted: dict[str, Any] = field(default_factory=dict)
    solver: dict[str, Any] = field(default_factory=dict)
    baselines: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "profile": dict(self.profile),
            "topology": dict(self.topology),
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "stages": [s.to_dict() for s in self.stages],
            "schedule": self.schedule,
            "predicted": self.predicted,
            "solver": self.solver,
            "baselines": list(self.baselines),
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan atomically as JSON.

        Example::

            plan.save("plan.json")
        """
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read and validate a plan file; problems name the file and the field.

        Example::

            plan = Plan.load("plan.json")
        """
        return plan_from_dict(read_json(path), source=str(path))


def plan_from_dict(data: Any, *, source: str = "<plan>") -> Plan:
    """Validate a decoded plan JSON object.

    Example::

        plan = plan_from_dict(json.loads(text), source="plan.json")
    """

    def fail(where: str, message: str) -> Any:
        raise InputError(message, file=source, field=where)

    if not isinstance(data, dict):
        fail("", "expected a JSON object at the top level")
    if data.get("schema") != SCHEMA:
        fail("schema", f"expected {SCHEMA!r}, got {data.get('schema')!r}")
    bad = _non_finite(data, "")
    if bad is not None:
        fail(bad[0], f"expected a finite number, got {bad[1]!r}")
    for key in ("profile", "topology"):
        ref = data.get(key)
        path_ok = isinstance(ref, dict) and (
            isinstance(ref.get("path"), str) or (key == "topology" and ref.get("path") is None)
        )
        if not path_ok:
            fail(key, 'expected an object {"path": ..., "sha256": ...}')
    for key in ("microbatch_size", "num_microbatches"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail(key, f"expected a positive integer, got {value!r}")
    stages = stages_from_data(data.get("stages"), source=source)
    schedule = data.get("schedule")
    if not isinstance(schedule, dict) or not isinstance(schedule.get("name"), str):
        fail("schedule", 'expected an object with a "name" and the per-device op order')
    for key in ("predicted", "solver"):
        if not isinstance(data.get(key, {}), dict):
            fail(key, "expected an object")
    baselines = data.get("baselines", [])
    if not isinstance(baselines, list) or not all(isinstance(b, dict) for b in baselines):
        fail("baselines", "expected a list of {name, iteration_ms, feasible} objects")
    num_layers = max(s.last for s in stages) + 1
    virtual = schedule.get("virtual_stages", 1)
    shared = schedule.get("name") == "interleaved" or (isinstance(virtual, int) and virtual > 1)
    validate_stages(stages, num_layers, None, source=source, allow_shared_devices=shared)
    return Plan(
        profile=dict(data["profile"]),
        topology=dict(data["topology"]),
        microbatch_size=data["microbatch_size"],
        num_microbatches=data["num_microbatches"],
        stages=stages,
        schedule=schedule,
        predicted=dict(data.get("predicted", {})),
        solver=dict(data.get("solver", {})),
        baselines=list(baselines),
    )


def _non_finite(obj: Any, where: str) -> tuple[str, float] | None:
    """The dotted path and value of the first NaN/Infinity in decoded JSON, if any."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where, obj
    if isinstance(obj, dict):
        items: Any = ((f"{where}.{k}" if where else str(k), v) for k, v in obj.items())
    elif isinstance(obj, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for path, value in items:
        found = _non_finite(value, path)
        if found is not None:
            return found
    return None
