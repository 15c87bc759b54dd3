"""The plan format (``pipeplan.plan/v1``): stages, schedule, predictions, solver facts.

A :class:`Plan` is what ``pipeplan solve`` and ``pipeplan simulate -o`` write (both through
:func:`plan_from_simulation`) and what ``pipeplan show``, ``run`` and ``export`` read. Its
parts are typed: the input files are :class:`~planner.plan_parts.FileRef`, the schedule a
:class:`~planner.schedule.actions.Schedule` (parsed and validated against the stages once,
when the plan is read), the prediction a :class:`~planner.plan_parts.Prediction`, the
solver's facts a :class:`~planner.plan_parts.SolverInfo` and each baseline row a
:class:`~planner.plan_parts.Baseline`. Its stages are :mod:`planner.stages`'s (re-exported
here: :func:`validate_stages` is the single check that a partition covers the model's
layers exactly once on known, distinct devices).

Unknown keys: the plan's top level and its prediction, solver, baselines and file
references keep keys they do not know (``extra``) and write them back; the schedule,
which ``run`` executes, refuses them (an unknown key could change what must run).

Example::

    stages = parse_stages("0-3:gpu0,gpu1;4-7:gpu2")
    validate_stages(stages, num_layers=8, topology=None)
    plan = Plan.load("plan.json")
    plan.schedule.devices["gpu0"][:3], plan.predicted.iteration_ms
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from planner.errors import InputError
from planner.fileio import atomic_write_json, read_json
from planner.plan_parts import (
    Baseline,
    FileRef,
    Prediction,
    SimulatedRun,
    SolverInfo,
)
from planner.schedule.actions import Schedule
from planner.schedule.families import is_interleaved
from planner.schedule.validate import validate_schedule
from planner.stages import (
    StageSpec,
    as_stages,
    parse_stages,
    stages_from_data,
    validate_stages,
)

__all__ = [
    "SCHEMA",
    "Baseline",
    "FileRef",
    "Plan",
    "Prediction",
    "SimulatedPlan",
    "SolverInfo",
    "StageSpec",
    "as_stages",
    "parse_stages",
    "plan_from_dict",
    "plan_from_simulation",
    "stages_from_data",
    "validate_stages",
]

SCHEMA = "pipeplan.plan/v1"
# The keys of a plan's schedule object (Schedule.to_dict); any other is refused.
_SCHEDULE_KEYS = frozenset(
    {"name", "virtual_stages", "num_stages", "num_microbatches", "flush", "devices"}
    | {"iterations", "meta"}
)
_KNOWN = frozenset(
    {"schema", "profile", "topology", "microbatch_size", "num_microbatches", "stages"}
    | {"schedule", "predicted", "solver", "baselines"}
)


@dataclass(init=False)
class Plan:
    """A complete plan; mirrors the contract's plan JSON field by field.

    ``predicted`` and ``solver`` are None for a plan made by hand without them (written
    as ``{}``). Each part may also be given in its file form (a dict, as the plan JSON
    holds it); it is then read with the same checks as a plan file, except that a
    schedule given as a dict is parsed but validated only by :meth:`load` /
    :func:`plan_from_dict` (a :class:`Schedule` object is taken as it is).

    Example::

        Plan(FileRef.of_file("p.json"), FileRef(None), 4, 8, stages,
             build_schedule("1f1b", stages, 8), Prediction.from_result(result))
    """

    profile: FileRef
    topology: FileRef
    microbatch_size: int
    num_microbatches: int
    stages: list[StageSpec]
    schedule: Schedule
    predicted: Prediction | None
    solver: SolverInfo | None
    baselines: list[Baseline]
    extra: dict[str, Any] = field(default_factory=dict)

    def __init__(
        self,
        profile: FileRef | Mapping[str, Any],
        topology: FileRef | Mapping[str, Any],
        microbatch_size: int,
        num_microbatches: int,
        stages: Sequence[StageSpec],
        schedule: Schedule | Mapping[str, Any],
        predicted: Prediction | Mapping[str, Any] | None = None,
        solver: SolverInfo | Mapping[str, Any] | None = None,
        baselines: Sequence[Baseline | Mapping[str, Any]] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.profile = _file_ref(profile, "profile")
        self.topology = _file_ref(topology, "topology")
        self.microbatch_size = microbatch_size
        self.num_microbatches = num_microbatches
        self.stages = list(stages)
        self.schedule = schedule if isinstance(schedule, Schedule) else _read_schedule(schedule)
        self.predicted = _prediction(predicted)
        self.solver = _solver(solver)
        self.baselines = [
            b if isinstance(b, Baseline) else Baseline.from_dict(b, i)
            for i, b in enumerate(baselines)
        ]
        self.extra = dict(extra or {})

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON object.

        Example::

            plan.to_dict()["predicted"]["iteration_ms"]
        """
        return {
            "schema": SCHEMA,
            "profile": self.profile.to_dict(),
            "topology": self.topology.to_dict(),
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "stages": [s.to_dict() for s in self.stages],
            "schedule": self.schedule.to_dict(),
            "predicted": {} if self.predicted is None else self.predicted.to_dict(),
            "solver": {} if self.solver is None else self.solver.to_dict(),
            "baselines": [b.to_dict() for b in self.baselines],
            **self.extra,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan atomically as JSON.

        Example::

            plan.save("plan.json")
        """
        atomic_write_json(path, self.to_dict())

    def validate(self, *, source: str = "<plan>") -> None:
        """Refuse unsound stages (devices shared only by interleaved chunks) and a schedule
        that is not a valid, deadlock-free execution of them with the plan's microbatches.
        :meth:`load` and :func:`plan_from_dict` run it; a plan built in memory may.

        Example::

            plan.validate(source="plan.json")     # InputError naming the first problem
        """
        schedule, stages = self.schedule, self.stages
        num_layers = max(s.last for s in stages) + 1
        shared = is_interleaved(schedule.name) or schedule.virtual_stages > 1
        validate_stages(stages, num_layers, None, source=source, allow_shared_devices=shared)
        for key, have, want in (
            ("num_stages", schedule.num_stages, len(stages)),
            ("num_microbatches", schedule.num_microbatches, self.num_microbatches),
        ):
            if have != want:
                what = "number of stages" if key == "num_stages" else key
                raise InputError(
                    f"expected {want} (the plan's {what}), got {have}",
                    file=source,
                    field=f"schedule.{key}",
                )
        validate_schedule(schedule, stages, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read and validate a plan file; problems name the file and the field.

        Example::

            plan = Plan.load("plan.json")
        """
        return plan_from_dict(read_json(path), source=str(path))


class SimulatedPlan(SimulatedRun, Protocol):
    """What :func:`plan_from_simulation` reads of a simulation: the prediction's numbers
    and the schedule it timed (:class:`planner.simulate.SimResult` has them)."""

    @property
    def schedule(self) -> Schedule: ...


def plan_from_simulation(
    result: SimulatedPlan,
    stages: Sequence[StageSpec],
    *,
    profile: FileRef,
    topology: FileRef,
    solver: SolverInfo | None = None,
    baselines: Sequence[Baseline] = (),
    global_lower_bound_ms: float | None = None,
    band_ms: Sequence[float] | None = None,
) -> Plan:
    """The plan of a simulated partition, the one constructor of ``solve`` and
    ``simulate -o``: the schedule the simulation timed, its prediction
    (:meth:`Prediction.from_result`; ``global_lower_bound_ms``: the solver's bound;
    ``band_ms``: the prediction's ``[low, high]`` band) and ``solver`` (default
    :meth:`SolverInfo.manual`).

    Example::

        result = simulate(profile, None, stages, "1f1b", 8)
        plan = plan_from_simulation(result, stages, profile=FileRef.of_file("p.json"),
                                    topology=FileRef(None))
    """
    return Plan(
        profile=profile,
        topology=topology,
        microbatch_size=result.microbatch_size,
        num_microbatches=result.num_microbatches,
        stages=[StageSpec(s.id, (s.first, s.last), list(s.devices), s.recompute) for s in stages],
        schedule=result.schedule,
        predicted=Prediction.from_result(
            result, global_lower_bound_ms=global_lower_bound_ms, band_ms=band_ms
        ),
        solver=solver or SolverInfo.manual(),
        baselines=list(baselines),
    )


def plan_from_dict(data: Any, *, source: str = "<plan>") -> Plan:
    """Read a decoded plan JSON object: every part typed, the schedule validated against
    the stages; the first problem is one InputError naming ``source`` and the field.

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
    profile = FileRef.from_dict(data.get("profile"), "profile", source=source)
    topology = FileRef.from_dict(data.get("topology"), "topology", source=source, optional=True)
    for key in ("microbatch_size", "num_microbatches"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail(key, f"expected a positive integer, got {value!r}")
    stages = stages_from_data(data.get("stages"), source=source)
    schedule = _read_schedule(data.get("schedule"), source=source)
    baselines = data.get("baselines", [])
    if not isinstance(baselines, list):
        fail("baselines", "expected a list of {name, iteration_ms, feasible} objects")
    plan = Plan(
        profile=profile,
        topology=topology,
        microbatch_size=data["microbatch_size"],
        num_microbatches=data["num_microbatches"],
        stages=stages,
        schedule=schedule,
        predicted=_prediction(data.get("predicted"), source=source),
        solver=_solver(data.get("solver"), source=source),
        baselines=[Baseline.from_dict(b, i, source=source) for i, b in enumerate(baselines)],
        extra={k: v for k, v in data.items() if k not in _KNOWN},
    )
    plan.validate(source=source)
    return plan


def _read_schedule(raw: Any, *, source: str = "<plan>") -> Schedule:
    """A schedule object's structure (no validation against stages); unknown keys and
    non-boolean ``flush`` refused."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise InputError(
            'expected an object with a "name" and the per-device op order',
            file=source,
            field="schedule",
        )
    unknown = sorted(set(raw) - _SCHEDULE_KEYS)
    if unknown:
        raise InputError(
            f"unknown field (this pipeplan knows {', '.join(sorted(_SCHEDULE_KEYS))}; "
            "was the plan written by a newer version?)",
            file=source,
            field=f"schedule.{unknown[0]}",
        )
    if not isinstance(raw.get("flush", True), bool):
        raise InputError(
            f"expected true or false, got {raw['flush']!r}", file=source, field="schedule.flush"
        )
    if not isinstance(raw.get("meta") or {}, Mapping):
        raise InputError(
            f"expected an object, got {raw['meta']!r}", file=source, field="schedule.meta"
        )
    return Schedule.from_dict(dict(raw), source=source)


def _file_ref(ref: FileRef | Mapping[str, Any], key: str) -> FileRef:
    if isinstance(ref, FileRef):
        return ref
    return FileRef.from_dict(ref, key, optional=key == "topology")


def _prediction(
    raw: Prediction | Mapping[str, Any] | None, *, source: str = "<plan>"
) -> Prediction | None:
    """None for a plan without a prediction (absent or ``{}``)."""
    if raw is None or isinstance(raw, Prediction):
        return raw
    if isinstance(raw, Mapping) and not raw:
        return None
    return Prediction.from_dict(raw, source=source)


def _solver(
    raw: SolverInfo | Mapping[str, Any] | None, *, source: str = "<plan>"
) -> SolverInfo | None:
    """None for a plan without solver facts (absent or ``{}``)."""
    if raw is None or isinstance(raw, SolverInfo):
        return raw
    if isinstance(raw, Mapping) and not raw:
        return None
    return SolverInfo.from_dict(raw, source=source)


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
