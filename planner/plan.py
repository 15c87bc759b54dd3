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

Every part is read by :mod:`planner.records` (one InputError naming the file and the
field). Unknown keys: the plan's prediction, solver, baselines and file references keep keys they
do not know (``extra``: facts a newer solver reports) and write them back; the top level,
the stages and the schedule, which decide what ``run`` executes, refuse them (an unknown
key there could change what must run), naming the known ones. Numbers are checked against
:mod:`planner.limits`; the schedule's name must be a family's or, for a hand-written order,
a name that is not a family's order renamed.

Example::

    stages = parse_stages("0-3:gpu0,gpu1;4-7:gpu2")
    validate_stages(stages, num_layers=8, topology=None)
    plan = Plan.load("plan.json")
    plan.schedule.devices["gpu0"][:3], plan.predicted.iteration_ms
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Protocol

from planner.errors import InputError
from planner.fileio import atomic_write_json, read_json
from planner.limits import (
    MAX_ACTION_CHARS,
    MAX_DEVICES,
    MAX_LAYERS,
    MAX_MICROBATCH_SIZE,
    MAX_MICROBATCHES,
    MAX_TIME_MS,
    check_name,
    check_number,
)
from planner.plan_parts import (
    Baseline,
    FileRef,
    Prediction,
    SimulatedRun,
    SolverInfo,
)
from planner.records import EMPTY_IS_NONE, Integer, read_record
from planner.schedule import build_schedule
from planner.schedule.actions import Schedule
from planner.schedule.families import FAMILIES, is_interleaved
from planner.schedule.validate import validate_schedule
from planner.shape import PlanShape
from planner.stages import (
    StageSpec,
    as_stages,
    parse_stages,
    stages_from_data,
    validate_stages,
)
from planner.terminal import is_printable

__all__ = [
    "SCHEMA",
    "Baseline",
    "FileRef",
    "Plan",
    "PlanShape",
    "Prediction",
    "SimulatedPlan",
    "check_schedule_data",
    "check_schedule_name",
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


@dataclass
class Plan:
    """A complete plan; mirrors the contract's plan JSON field by field, every part typed
    (the file form is read by :func:`plan_from_dict` and :meth:`load` only).

    ``predicted`` and ``solver`` are None for a plan made by hand without them (written
    as ``{}``). ``step_ms`` is an optimizer step time the plan was simulated with instead
    of the profile's (``simulate --step-ms``; written in the schedule's ``meta``, where
    ``show`` and ``run`` find it).

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
    predicted: Prediction | None = None
    solver: SolverInfo | None = None
    baselines: list[Baseline] = field(default_factory=list)
    step_ms: float | None = None

    @property
    def shape(self) -> PlanShape:
        """The plan's stages, schedule name and microbatching as one hashable value (what
        the search and the peers exchange).

        Example::

            Plan.load("plan.json").shape.samples
        """
        return PlanShape(
            tuple(self.stages),
            self.schedule.name,
            self.microbatch_size,
            self.num_microbatches,
            self.schedule.virtual_stages,
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON object.

        Example::

            plan.to_dict()["predicted"]["iteration_ms"]
        """
        schedule = self.schedule.to_dict()
        if self.step_ms is not None:  # where show and older readers find it
            schedule["meta"] = {**schedule.get("meta", {}), "step_ms": self.step_ms}
        return {
            "schema": SCHEMA,
            "profile": self.profile.to_dict(),
            "topology": self.topology.to_dict(),
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "stages": [s.to_dict() for s in self.stages],
            "schedule": schedule,
            "predicted": {} if self.predicted is None else self.predicted.to_dict(),
            "solver": {} if self.solver is None else self.solver.to_dict(),
            "baselines": [b.to_dict() for b in self.baselines],
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
    step_ms: float | None = None,
) -> Plan:
    """The plan of a simulated partition, the one constructor of ``solve`` and
    ``simulate -o``: the schedule the simulation timed, its prediction
    (:meth:`Prediction.from_result`; ``global_lower_bound_ms``: the solver's bound),
    ``solver`` (default :meth:`SolverInfo.manual`) and the explicit optimizer step time the
    simulation was given, if any (``step_ms``).

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
        stages=list(stages),
        schedule=result.schedule,
        predicted=Prediction.from_result(result, global_lower_bound_ms=global_lower_bound_ms),
        solver=solver or SolverInfo.manual(),
        baselines=list(baselines),
        step_ms=step_ms,
    )


def plan_from_dict(data: Any, *, source: str = "<plan>") -> Plan:
    """Read a decoded plan JSON object: every part typed, the schedule validated against
    the stages; the first problem is one InputError naming ``source`` and the field.

    Example::

        plan = plan_from_dict(json.loads(text), source="plan.json")
    """

    if not isinstance(data, dict):
        raise InputError("expected a JSON object at the top level", file=source)
    if data.get("schema") != SCHEMA:
        raise InputError(
            f"expected {SCHEMA!r}, got {data.get('schema')!r}", file=source, field="schema"
        )
    bad = _non_finite(data, "")
    if bad is not None:
        raise InputError(f"expected a finite number, got {bad[1]!r}", file=source, field=bad[0])
    top = read_record(_PlanFile, data, file=source, ignore=("schema",))
    if top.profile.path is None:
        raise InputError("missing; expected a string", file=source, field="profile.path")
    schedule = _read_schedule(top.schedule, source=source)
    plan = Plan(
        profile=top.profile,
        topology=top.topology,
        microbatch_size=top.microbatch_size,
        num_microbatches=top.num_microbatches,
        stages=stages_from_data(top.stages, source=source),
        schedule=schedule,
        predicted=top.predicted,
        solver=top.solver,
        baselines=top.baselines,
        step_ms=_step_ms(schedule, source),
    )
    plan.validate(source=source)
    check_schedule_name(plan.schedule, plan.stages, source=source)
    return plan


@dataclass
class _PlanFile:
    """The top level of a plan file (beside ``schema``); the stages and the schedule are
    read by their own readers (:func:`~planner.stages.stages_from_data`,
    :func:`_read_schedule`), which say what they expect where they are missing."""

    UNKNOWN_HINT: ClassVar[str] = "was the plan written by a newer pipeplan?"

    profile: FileRef
    topology: FileRef
    microbatch_size: Annotated[int, Integer(1, MAX_MICROBATCH_SIZE)]
    num_microbatches: Annotated[int, Integer(1, MAX_MICROBATCHES)]
    stages: Any = None
    schedule: Any = None
    predicted: Annotated[Prediction | None, EMPTY_IS_NONE] = None
    solver: Annotated[SolverInfo | None, EMPTY_IS_NONE] = None
    baselines: list[Baseline] = field(default_factory=list)


def _step_ms(schedule: Schedule, source: str) -> float | None:
    """The schedule's ``meta.step_ms`` (``simulate --step-ms``), taken out of its meta."""
    value = schedule.meta.pop("step_ms", None)
    if value is None:
        return None
    check_number(value, field="schedule.meta.step_ms", high=MAX_TIME_MS, file=source)
    return float(value) if isinstance(value, float) else int(value)  # as written


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
            f"unknown field; expected one of {', '.join(sorted(_SCHEDULE_KEYS))} (was the "
            "plan written by a newer pipeplan?)",
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
    check_schedule_data(raw, source=source)
    return Schedule.from_dict(dict(raw), source=source)


# A schedule action's stage and microbatch numbers (``SEND_F12.345->gpu7``): at most the
# digits of MAX_LAYERS and MAX_MICROBATCHES, so that reading them allocates nothing large.
_ACTION_NUMBERS = re.compile(r"^\s*[A-Za-z_]*(\d*)(?:\.(\d*))?")


def check_schedule_data(raw: Mapping[str, Any], *, source: str = "<plan>") -> None:
    """The limits of a decoded schedule object, checked before its actions are parsed: a
    printable name, device names, at most :data:`MAX_ACTION_CHARS` characters an action,
    stage and microbatch numbers below :data:`MAX_LAYERS` and :data:`MAX_MICROBATCHES`.

    Example::

        check_schedule_data(json.load(open("plan.json"))["schedule"], source="plan.json")
    """
    check_name(raw.get("name"), file=source, field="schedule.name")
    devices = raw.get("devices")
    if not isinstance(devices, Mapping):
        return  # Schedule.from_dict says what was expected
    if len(devices) > MAX_DEVICES:
        raise InputError(
            f"{len(devices):,} devices; expected at most {MAX_DEVICES:,}",
            file=source,
            field="schedule.devices",
        )
    for dev, items in devices.items():
        where = f"schedule.devices.{dev}"
        check_name(dev, file=source, field="schedule.devices")
        for i, item in enumerate(items if isinstance(items, list) else ()):
            if not isinstance(item, str):
                continue  # Action.parse says what was expected
            numbers = _ACTION_NUMBERS.match(item)
            too_long = len(item) > MAX_ACTION_CHARS or not is_printable(item)
            if too_long or (numbers is not None and max(map(len, numbers.groups(""))) > 6):
                raise InputError(
                    f"expected an action such as F0.3 or SEND_F0.3->gpu1 (at most "
                    f"{MAX_ACTION_CHARS} characters, stage < {MAX_LAYERS:,}, microbatch < "
                    f"{MAX_MICROBATCHES:,})",
                    file=source,
                    field=f"{where}[{i}]",
                )


def check_schedule_name(
    schedule: Schedule, stages: Sequence[StageSpec], *, source: str = "<plan>"
) -> None:
    """Refuse a schedule whose name contradicts its lists: a family's name on lists that
    do not keep its rule (its ``flush``; backwards split into I and W only by ``zb`` and
    ``optimized``), or a name outside the families on lists that are exactly what a family
    generates (a generated plan renamed, e.g. ``bogus``: name it after the family). Any
    other name is a hand-written order's (``simulate --schedule FILE``).

    Example::

        check_schedule_name(plan.schedule, plan.stages, source="plan.json")
    """
    name = schedule.name
    known = ", ".join(FAMILIES)

    def fail(message: str) -> None:
        raise InputError(message, file=source, field="schedule.name")

    if name in FAMILIES:
        rules = FAMILIES[name]
        if rules.flush != schedule.flush:
            fail(
                f"schedule {name!r} {'flushes' if rules.flush else 'does not flush'} every "
                f"iteration, but schedule.flush is {str(schedule.flush).lower()}"
            )
        if schedule.splits_backward and not (rules.split_backward or rules.searched):
            fail(
                f"schedule {name!r} does not split backwards into input (I) and weight (W) "
                "halves, but the lists do; expected 'zb' (or a hand-written order's own name)"
            )
        return
    for family_name, rules in FAMILIES.items():
        if rules.searched or rules.flush != schedule.flush:
            continue
        try:
            generated = build_schedule(family_name, stages, schedule.num_microbatches)
        except InputError:
            continue  # the family cannot run these stages
        if generated.num_stages == schedule.num_stages and _same_lists(generated, schedule):
            fail(
                f"unknown schedule {name!r}; expected one of {known} (these lists are exactly "
                f"what {family_name!r} generates; a hand-written order may have its own name)"
            )


def _same_lists(a: Schedule, b: Schedule) -> bool:
    return {d: [str(x) for x in acts] for d, acts in a.devices.items()} == {
        d: [str(x) for x in acts] for d, acts in b.devices.items()
    }


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
