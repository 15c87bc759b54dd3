"""The typed parts of a plan file: file references, the prediction, the solver's facts.

Each part mirrors one object of the ``pipeplan.plan/v1`` JSON (docs/api.md): ``from_dict``
reads it (an :class:`~planner.errors.InputError` names the file and the field at fault)
and ``to_dict`` writes the same keys in the same order. Keys a part does not know (written
by a newer pipeplan, or added by hand) are kept in its ``extra`` and written back, so a plan
read and saved again loses nothing; a missing optional field is None and is not written.

One rule for every writer (``solve`` and ``simulate -o``): :meth:`Prediction.from_result`
turns a simulation into the plan's prediction, with the simulator's numbers exactly as
computed (no rounding) and per-device maps in device-name order.

Example::

    ref = FileRef.of_file("profiles/gpt.json")          # path and sha256
    pred = Prediction.from_result(result)                 # result: planner.simulate.SimResult
    pred.iteration_ms, pred.memory_bytes["gpu0"]
    SolverInfo.manual().to_dict()       # {'method': 'manual', 'status': 'given', ...}
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol

from planner.errors import InputError
from planner.fileio import sha256_file

__all__ = [
    "Baseline",
    "FieldReader",
    "FileRef",
    "IlpInfo",
    "Prediction",
    "SimulatedRun",
    "SolverInfo",
    "WithoutPeers",
    "path_for_plan",
]


# Each part below reads and writes its own fields through FieldReader, one call per field:
# their to_dict / from_dict look alike in shape (duplicates pairs them), not in fields.
class FieldReader:
    """Reads the fields of one decoded JSON object; every problem is one InputError that
    names the file and the dotted field. Keys never asked for are :meth:`rest`.

    Example::

        read = FieldReader(data["predicted"], "predicted", source="plan.json")
        read.number("iteration_ms"), read.rest()
    """

    def __init__(self, data: Any, where: str, *, source: str) -> None:
        self.where, self.source = where, source
        if not isinstance(data, Mapping):
            self.fail("", f"expected an object, got {data!r}")
        self.data: Mapping[str, Any] = data
        self.used: set[str] = set()

    def fail(self, key: str, message: str) -> NoReturn:
        where = f"{self.where}.{key}" if key and self.where else key or self.where
        raise InputError(message, file=self.source, field=where)

    def _read(self, key: str, expected: str, ok: Callable[[Any], bool], *, required: bool) -> Any:
        """The value of ``key`` if ``ok(value)``; None when absent (or null) and not
        ``required``; else one InputError saying what was ``expected``."""
        self.used.add(key)
        value = self.data.get(key)
        if value is None and not required:
            return None
        if key not in self.data:
            self.fail(key, f"missing; expected {expected}")
        if not ok(value):
            self.fail(key, f"expected {expected}, got {value!r}")
        return value

    def string(self, key: str) -> str:
        return str(self._read(key, "a string", _is_string, required=True))

    def opt_string(self, key: str) -> str | None:
        return self._read(key, "a string", _is_string, required=False)

    def number(self, key: str) -> float:
        return self._read(key, "a number", _is_number, required=True)

    def opt_number(self, key: str) -> float | None:
        return self._read(key, "a number", _is_number, required=False)

    def nullable_number(self, key: str) -> float | None:
        """A number or null; the key itself is required."""
        if key not in self.data:
            self.fail(key, "missing; expected a number (or null)")
        return self.opt_number(key)

    def integer(self, key: str, *, minimum: int = 0) -> int:
        return int(self._read(key, f"an integer >= {minimum}", _at_least(minimum), required=True))

    def opt_integer(self, key: str, *, minimum: int = 0) -> int | None:
        return self._read(key, f"an integer >= {minimum}", _at_least(minimum), required=False)

    def boolean(self, key: str) -> bool:
        return bool(self._read(key, "true or false", _is_bool, required=True))

    def opt_boolean(self, key: str) -> bool | None:
        return self._read(key, "true or false", _is_bool, required=False)

    def bytes_map(self, key: str) -> dict[str, int]:
        """``{device: bytes}`` with integer byte counts."""
        ok = _map_of(_at_least(0))
        return dict(self._read(key, "{device: bytes} with integers >= 0", ok, required=True))

    def opt_ms_map(self, key: str) -> dict[str, float] | None:
        """``{device: milliseconds}``, or None when absent."""
        value = self._read(key, "{device: milliseconds}", _map_of(_is_number), required=False)
        return None if value is None else dict(value)

    def opt_numbers(self, key: str) -> list[float] | None:
        value = self._read(key, "a list of numbers", _list_of(_is_number), required=False)
        return None if value is None else list(value)

    def opt_integers(self, key: str) -> list[int] | None:
        value = self._read(key, "a list of integers", _list_of(_is_integer), required=False)
        return None if value is None else list(value)

    def rest(self) -> dict[str, Any]:
        """The keys not read, as they are (kept and written back)."""
        return {k: v for k, v in self.data.items() if k not in self.used}


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(minimum: int) -> Callable[[Any], bool]:
    return lambda value: _is_integer(value) and value >= minimum


def _map_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: (
        isinstance(value, Mapping) and all(isinstance(k, str) and ok(v) for k, v in value.items())
    )


def _list_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(ok(v) for v in value)


def _without_none(pairs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pairs.items() if v is not None}


def path_for_plan(path: str | os.PathLike[str], plan_path: str | os.PathLike[str]) -> str:
    """How a plan saved at ``plan_path`` names an input file so that it is found from any
    folder: a relative path as given when the plan is written in the current folder, else
    relative to the plan's folder (a plan's files are looked up in the current folder, then
    beside the plan); absolute paths as given.

    Example::

        path_for_plan("profiles/gpt.json", "plan.json")        # 'profiles/gpt.json'
        path_for_plan("profiles/gpt.json", "out/plan.json")    # '../profiles/gpt.json'
    """
    given = Path(path)
    plan_dir = Path(plan_path).resolve().parent
    if given.is_absolute() or plan_dir == Path.cwd().resolve():
        return str(path)
    return os.path.relpath(given.resolve(), plan_dir)


# ---------------------------------------------------------------------------- file refs


@dataclass(frozen=True)
class FileRef:
    """A plan's input file: the path as given and its sha256 (checked before reuse).

    ``path`` is None for a plan made without that file (no topology), ``"<memory>"`` for
    an object that was never saved (its sha256 is then that of its JSON form).

    Example::

        FileRef.of_file("profiles/gpt.json").sha256[:12]
    """

    path: str | None
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def of_file(cls, path: str | os.PathLike[str]) -> FileRef:
        """The file at ``path`` and its sha256 now.

        Example::

            FileRef.of_file("topologies/nvlink.yaml")
        """
        return cls(str(path), sha256_file(path))

    def for_plan(self, plan_path: str | os.PathLike[str]) -> FileRef:
        """This reference as a plan saved at ``plan_path`` names it (:func:`path_for_plan`),
        read relative to the current folder now.

        Example::

            FileRef.of_file("profiles/gpt.json").for_plan("out/plan.json").path
            # '../profiles/gpt.json'
        """
        if self.path is None or self.path.startswith("<"):
            return self
        return FileRef(path_for_plan(self.path, plan_path), self.sha256, self.extra)

    @classmethod
    def in_memory(cls, data: Any) -> FileRef:
        """An object that was never saved: ``"<memory>"`` and the sha256 of its JSON form.

        Example::

            FileRef.in_memory(profile.to_dict())
        """
        blob = json.dumps(data, sort_keys=True).encode("utf-8")
        return cls("<memory>", hashlib.sha256(blob).hexdigest())

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, **self.extra}

    @classmethod
    def from_dict(
        cls, data: Any, where: str, *, source: str = "<plan>", optional: bool = False
    ) -> FileRef:
        """Read ``{"path": ..., "sha256": ...}``; ``optional``: the path may be null.

        Example::

            FileRef.from_dict({"path": "p.json", "sha256": "ab12..."}, "profile")
        """
        if not isinstance(data, Mapping):
            raise InputError(
                'expected an object {"path": ..., "sha256": ...}', file=source, field=where
            )
        read = FieldReader(data, where, source=source)
        path = read.opt_string("path") if optional else read.string("path")
        return cls(path, read.opt_string("sha256"), read.rest())


# --------------------------------------------------------------------------- prediction


class SimulatedRun(Protocol):
    """What :meth:`Prediction.from_result` reads of a simulation
    (:class:`planner.simulate.SimResult` has it all)."""

    @property
    def iteration_ms(self) -> float: ...
    @property
    def bubble_fraction(self) -> float: ...
    @property
    def lower_bound_ms(self) -> float: ...
    @property
    def memory_bytes(self) -> Mapping[str, int]: ...
    @property
    def memory_limit_bytes(self) -> Mapping[str, int]: ...
    @property
    def busy_ms(self) -> Mapping[str, float]: ...
    @property
    def staleness(self) -> Sequence[int] | None: ...
    @property
    def step_ms(self) -> Sequence[float]: ...
    @property
    def microbatch_size(self) -> int: ...
    @property
    def num_microbatches(self) -> int: ...


@dataclass
class Prediction:
    """The plan's ``predicted`` object: what the simulator says one iteration costs.

    ``lower_bound_ms`` bounds this very plan (max of average work, busiest device, one
    microbatch's critical path); ``global_lower_bound_ms`` (solver plans) bounds every
    plan of the solver's search, and ``plan_lower_bound_ms`` repeats ``lower_bound_ms``
    under its former name for readers of older plans. ``busy_ms`` is each device's compute
    time, ``staleness`` (asynchronous schedules) each stage's weight age in optimizer
    steps, ``step_ms`` each stage's optimizer step when the iteration includes it.
    ``iteration_band_ms`` (optional) is ``[low, high]``: the iteration with every layer at
    the low and at the high end of its profiled spread (:mod:`planner.simulate.band`);
    plans without it read and write back without it.
    """

    iteration_ms: float
    samples_per_s: float
    bubble_fraction: float
    lower_bound_ms: float
    memory_bytes: dict[str, int]
    memory_limit_bytes: dict[str, int]
    busy_ms: dict[str, float] | None = None
    staleness: list[int] | None = None
    step_ms: list[float] | None = None
    global_lower_bound_ms: float | None = None
    plan_lower_bound_ms: float | None = None
    iteration_band_ms: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_result(
        cls,
        result: SimulatedRun,
        *,
        global_lower_bound_ms: float | None = None,
        band_ms: Sequence[float] | None = None,
    ) -> Prediction:
        """The prediction of a simulation, as ``solve`` and ``simulate -o`` write it.

        Numbers are the simulator's, unrounded; device maps are sorted by device name;
        ``step_ms`` is present when the iteration includes an optimizer step.
        ``global_lower_bound_ms`` (the solver's bound over all plans) also writes
        ``plan_lower_bound_ms``, and stands in for a plan bound the result lacks;
        ``band_ms`` (``[low, high]``, :func:`planner.simulate.band.prediction_band`) is
        the prediction's band.

        Example::

            Prediction.from_result(simulate(profile, topo, stages, "1f1b", 8)).iteration_ms
        """
        it = float(result.iteration_ms)
        samples = result.microbatch_size * result.num_microbatches
        bound = float(result.lower_bound_ms or global_lower_bound_ms or 0.0)
        steps = [float(x) for x in result.step_ms]
        staleness = result.staleness
        return cls(
            iteration_ms=it,
            samples_per_s=samples / it * 1000.0 if it > 0 else 0.0,
            bubble_fraction=float(result.bubble_fraction),
            lower_bound_ms=bound,
            memory_bytes={d: int(b) for d, b in sorted(result.memory_bytes.items())},
            memory_limit_bytes=dict(sorted(result.memory_limit_bytes.items())),
            busy_ms=dict(sorted(result.busy_ms.items())),
            staleness=None if staleness is None else list(staleness),
            step_ms=steps if any(steps) else None,
            global_lower_bound_ms=global_lower_bound_ms,
            plan_lower_bound_ms=None if global_lower_bound_ms is None else bound,
            iteration_band_ms=None if band_ms is None else [float(x) for x in band_ms],
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan's ``predicted`` object (optional fields only when known).

        Example::

            plan.predicted.to_dict()["iteration_ms"]
        """
        out: dict[str, Any] = {
            "iteration_ms": self.iteration_ms,
            "samples_per_s": self.samples_per_s,
            "bubble_fraction": self.bubble_fraction,
            "lower_bound_ms": self.lower_bound_ms,
        }
        out.update(
            _without_none(
                {
                    "plan_lower_bound_ms": self.plan_lower_bound_ms,
                    "global_lower_bound_ms": self.global_lower_bound_ms,
                }
            )
        )
        out["memory_bytes"] = dict(self.memory_bytes)
        out["memory_limit_bytes"] = dict(self.memory_limit_bytes)
        optional = {
            "busy_ms": None if self.busy_ms is None else dict(self.busy_ms),
            "staleness": None if self.staleness is None else list(self.staleness),
            "step_ms": None if self.step_ms is None else list(self.step_ms),
            "iteration_band_ms": None
            if self.iteration_band_ms is None
            else list(self.iteration_band_ms),
        }
        return {**out, **_without_none(optional), **self.extra}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<plan>") -> Prediction:
        """Read a plan's ``predicted`` object (the contract's six fields are required).

        Example::

            Prediction.from_dict(json.load(open("plan.json"))["predicted"])
        """
        read = FieldReader(data, "predicted", source=source)
        return cls(
            iteration_ms=read.number("iteration_ms"),
            samples_per_s=read.number("samples_per_s"),
            bubble_fraction=read.number("bubble_fraction"),
            lower_bound_ms=read.number("lower_bound_ms"),
            memory_bytes=read.bytes_map("memory_bytes"),
            memory_limit_bytes=read.bytes_map("memory_limit_bytes"),
            busy_ms=read.opt_ms_map("busy_ms"),
            staleness=read.opt_integers("staleness"),
            step_ms=read.opt_numbers("step_ms"),
            global_lower_bound_ms=read.opt_number("global_lower_bound_ms"),
            plan_lower_bound_ms=read.opt_number("plan_lower_bound_ms"),
            iteration_band_ms=_band(read),
            extra=read.rest(),
        )


def _band(read: FieldReader) -> list[float] | None:
    """``predicted.iteration_band_ms``: ``[low, high]`` with ``0 <= low <= high``, or None."""
    band = read.opt_numbers("iteration_band_ms")
    if band is not None and (len(band) != 2 or not 0 <= band[0] <= band[1]):
        read.fail("iteration_band_ms", f"expected [low, high] with 0 <= low <= high, got {band}")
    return band


# ------------------------------------------------------------------------------- solver


@dataclass(frozen=True)
class IlpInfo:
    """What the ILP (CBC) reported: its status and gap, time, objective and bound."""

    status: str
    gap: float | None
    seconds: float
    objective_ms: float | None
    bound_ms: float | None
    num_stages: int
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "gap": self.gap,
            "seconds": self.seconds,
            "objective_ms": self.objective_ms,
            "bound_ms": self.bound_ms,
            "num_stages": self.num_stages,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<plan>") -> IlpInfo:
        read = FieldReader(data, "solver.ilp", source=source)
        return cls(
            status=read.string("status"),
            gap=read.nullable_number("gap"),
            seconds=read.number("seconds"),
            objective_ms=read.nullable_number("objective_ms"),
            bound_ms=read.nullable_number("bound_ms"),
            num_stages=read.integer("num_stages", minimum=1),
            extra=read.rest(),
        )


@dataclass(frozen=True)
class WithoutPeers:
    """What the search found on its own, before any peer plan joined its pool; its time is
    scaled to the plan's samples per iteration."""

    iteration_ms: float
    microbatch_size: int
    num_microbatches: int
    schedule: str
    stages: list[tuple[tuple[int, int], tuple[str, ...]]]
    origin: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration_ms": self.iteration_ms,
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "schedule": self.schedule,
            "stages": [[list(r), list(d)] for r, d in self.stages],
            "origin": self.origin,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<plan>") -> WithoutPeers:
        read = FieldReader(data, "solver.without_peers", source=source)
        read.used.add("stages")
        stages = _stage_pairs(read.data.get("stages"))
        if stages is None:
            read.fail("stages", "expected [[[first, last], [device, ...]], ...]")
        return cls(
            iteration_ms=read.number("iteration_ms"),
            microbatch_size=read.integer("microbatch_size", minimum=1),
            num_microbatches=read.integer("num_microbatches", minimum=1),
            schedule=read.string("schedule"),
            stages=stages,
            origin=read.string("origin"),
            extra=read.rest(),
        )


def _stage_pairs(raw: Any) -> list[tuple[tuple[int, int], tuple[str, ...]]] | None:
    """``[[[first, last], [device, ...]], ...]`` as tuples; None when it is not that."""
    if not isinstance(raw, list):
        return None
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            return None
        layers, devices = item
        if not (isinstance(layers, list) and len(layers) == 2 and all(map(_is_integer, layers))):
            return None
        if not (isinstance(devices, list) and all(isinstance(d, str) for d in devices)):
            return None
        out.append(((layers[0], layers[1]), tuple(devices)))
    return out


@dataclass
class SolverInfo:
    """The plan's ``solver`` object: how the plan was found.

    ``gap`` is the plan's time over the solver's global lower bound, minus one;
    ``simulations`` counts the simulator calls; ``ilp`` and ``without_peers`` are
    present where the search ran the ILP and compared with peers. ``ties`` counts the
    plans at most ``tie_tolerance`` (relative) slower than the fastest plan, which tie
    with it (docs/solve.md#ties-within-the-noise), and ``fastest_ms`` is that fastest
    plan's time where the preference among the ties chose another.

    Example::

        SolverInfo.manual()      # a partition given by hand (simulate -o)
    """

    method: str
    status: str
    seconds: float
    gap: float | None
    simulations: int | None = None
    ilp: IlpInfo | None = None
    without_peers: WithoutPeers | None = None
    ties: int | None = None
    tie_tolerance: float | None = None
    fastest_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def manual(cls) -> SolverInfo:
        """A plan whose partition was given, not searched for (``simulate -o``).

        Example::

            SolverInfo.manual().method      # 'manual'
        """
        return cls("manual", "given", 0.0, None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "status": self.status,
            "seconds": self.seconds,
            "gap": self.gap,
        }
        if self.simulations is not None:
            out["simulations"] = self.simulations
        if self.ilp is not None:
            out["ilp"] = self.ilp.to_dict()
        if self.without_peers is not None:
            out["without_peers"] = self.without_peers.to_dict()
        ties = {"ties": self.ties, "tie_tolerance": self.tie_tolerance}
        out.update(_without_none({**ties, "fastest_ms": self.fastest_ms}))
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<plan>") -> SolverInfo:
        """Read a plan's ``solver`` object (``method``, ``status``, ``seconds`` and
        ``gap`` are required).

        Example::

            SolverInfo.from_dict({"method": "manual", "status": "given", "seconds": 0.0,
                                  "gap": None})
        """
        read = FieldReader(data, "solver", source=source)
        read.used.update({"ilp", "without_peers"})
        ilp, alone = read.data.get("ilp"), read.data.get("without_peers")
        return cls(
            method=read.string("method"),
            status=read.string("status"),
            seconds=read.number("seconds"),
            gap=read.nullable_number("gap"),
            simulations=read.opt_integer("simulations"),
            ilp=None if ilp is None else IlpInfo.from_dict(ilp, source=source),
            without_peers=None if alone is None else WithoutPeers.from_dict(alone, source=source),
            ties=read.opt_integer("ties"),
            tie_tolerance=read.opt_number("tie_tolerance"),
            fastest_ms=read.opt_number("fastest_ms"),
            extra=read.rest(),
        )


# ---------------------------------------------------------------------------- baselines


@dataclass(frozen=True)
class Baseline:
    """One row of the plan's ``baselines``: a peer's plan on the same inputs.

    ``kind`` is ``"tuned peer"`` (the peer at its best configuration, described by the
    fields from ``configuration`` to ``recompute``; ``configurations`` and ``simulations``
    count its sweep) or ``"peer default"`` (one stage per device); rows of plans written
    before tuned peers existed have no kind. ``iteration_ms`` is scaled to the plan's
    samples per iteration; None (with a ``reason``) when the peer has no plan.

    Example::

        Baseline("DeepSpeed", 12.5, True, kind="tuned peer").to_dict()
    """

    name: str
    iteration_ms: float | None
    feasible: bool
    kind: str | None = None
    reason: str | None = None
    configuration: str | None = None
    partition: str | None = None
    depth: int | None = None
    data_parallel: int | None = None
    microbatch_size: int | None = None
    num_microbatches: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    recompute: bool | None = None
    configurations: int | None = None
    simulations: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def tuned(self) -> bool:
        """A tuned peer's row (else a peer default, or a row of an older plan)."""
        return self.kind == "tuned peer"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.kind is not None:
            out["kind"] = self.kind
        out.update(iteration_ms=self.iteration_ms, feasible=self.feasible)
        optional = {
            "reason": self.reason,
            "configuration": self.configuration,
            "partition": self.partition,
            "depth": self.depth,
            "data_parallel": self.data_parallel,
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "schedule": self.schedule,
            "virtual_stages": self.virtual_stages,
            "recompute": self.recompute,
            "configurations": self.configurations,
            "simulations": self.simulations,
        }
        return {**out, **_without_none(optional), **self.extra}

    @classmethod
    def from_dict(cls, data: Any, index: int, *, source: str = "<plan>") -> Baseline:
        """Read ``baselines[index]`` (``name``, ``iteration_ms``, ``feasible`` required).

        Example::

            Baseline.from_dict({"name": "uniform", "iteration_ms": 9.5, "feasible": True}, 0)
        """
        read = FieldReader(data, f"baselines[{index}]", source=source)
        return cls(
            name=read.string("name"),
            iteration_ms=read.nullable_number("iteration_ms"),
            feasible=read.boolean("feasible"),
            kind=read.opt_string("kind"),
            reason=read.opt_string("reason"),
            configuration=read.opt_string("configuration"),
            partition=read.opt_string("partition"),
            depth=read.opt_integer("depth", minimum=1),
            data_parallel=read.opt_integer("data_parallel", minimum=1),
            microbatch_size=read.opt_integer("microbatch_size", minimum=1),
            num_microbatches=read.opt_integer("num_microbatches", minimum=1),
            schedule=read.opt_string("schedule"),
            virtual_stages=read.opt_integer("virtual_stages", minimum=1),
            recompute=read.opt_boolean("recompute"),
            configurations=read.opt_integer("configurations"),
            simulations=read.opt_integer("simulations"),
            extra=read.rest(),
        )
