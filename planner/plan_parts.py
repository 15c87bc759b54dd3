"""The typed parts of a plan file: file references, the prediction, the solver's facts.

Each part mirrors one object of the ``pipeplan.plan/v1`` JSON (docs/api.md): it is a record
(:func:`planner.records.read_record` reads it, an :class:`~planner.errors.InputError` naming
the file and the field at fault) and ``to_dict`` writes the same keys in the same order.
Keys a part does not know (written by a newer pipeplan, or added by hand) are kept in its
``extra`` and written back, so a plan read and saved again loses nothing; a missing optional
field is None and is not written.

One rule for every writer (``solve`` and ``simulate -o``): :meth:`Prediction.from_result`
turns a simulation into the plan's prediction, with the simulator's numbers exactly as
computed (no rounding) and per-device maps in device-name order.

Example::

    ref = FileRef.of_file("profiles/gpt.json")          # path and sha256
    pred = Prediction.from_result(result)                 # result: planner.simulate.SimResult
    pred.iteration_ms, pred.memory_bytes["gpu0"]
    SolverInfo.manual().to_dict()       # {'method': 'manual', 'status': 'given', ...}
    read_record(Prediction, data["predicted"], file="plan.json", field="predicted")
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Protocol

from planner.fileio import sha256_file
from planner.records import Default, Integer

__all__ = [
    "Baseline",
    "FileRef",
    "IlpInfo",
    "Prediction",
    "SimulatedRun",
    "SolverInfo",
    "WithoutPeers",
    "path_for_plan",
]

# Counts a plan part holds: at least one, or at least zero.
_Positive = Annotated[int, Integer(1)]
_Count = Annotated[int, Integer(0)]


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

    path: Annotated[str | None, Default(None)]
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
    """

    iteration_ms: float
    samples_per_s: float
    bubble_fraction: float
    lower_bound_ms: float
    memory_bytes: dict[str, _Count]
    memory_limit_bytes: dict[str, _Count]
    busy_ms: dict[str, float] | None = None
    staleness: list[int] | None = None
    step_ms: list[float] | None = None
    global_lower_bound_ms: float | None = None
    plan_lower_bound_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_result(
        cls, result: SimulatedRun, *, global_lower_bound_ms: float | None = None
    ) -> Prediction:
        """The prediction of a simulation, as ``solve`` and ``simulate -o`` write it.

        Numbers are the simulator's, unrounded; device maps are sorted by device name;
        ``step_ms`` is present when the iteration includes an optimizer step.
        ``global_lower_bound_ms`` (the solver's bound over all plans) also writes
        ``plan_lower_bound_ms``, and stands in for a plan bound the result lacks.

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
        }
        return {**out, **_without_none(optional), **self.extra}


# ------------------------------------------------------------------------------- solver


@dataclass(frozen=True)
class IlpInfo:
    """What the ILP (CBC) reported: its status and gap, time, objective and bound."""

    status: str
    gap: float | None
    seconds: float
    objective_ms: float | None
    bound_ms: float | None
    num_stages: _Positive
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


@dataclass(frozen=True)
class WithoutPeers:
    """What the search found on its own, before any peer plan joined its pool; its time is
    scaled to the plan's samples per iteration."""

    iteration_ms: float
    microbatch_size: _Positive
    num_microbatches: _Positive
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


@dataclass
class SolverInfo:
    """The plan's ``solver`` object: how the plan was found.

    ``gap`` is the plan's time over the solver's global lower bound, minus one;
    ``simulations`` counts the simulator calls; ``ilp`` and ``without_peers`` are
    present where the search ran the ILP and compared with peers.

    Example::

        SolverInfo.manual()      # a partition given by hand (simulate -o)
    """

    method: str
    status: str
    seconds: float
    gap: float | None
    simulations: _Count | None = None
    ilp: IlpInfo | None = None
    without_peers: WithoutPeers | None = None
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
        return {**out, **self.extra}


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
    depth: _Positive | None = None
    data_parallel: _Positive | None = None
    microbatch_size: _Positive | None = None
    num_microbatches: _Positive | None = None
    schedule: str | None = None
    virtual_stages: _Positive | None = None
    recompute: bool | None = None
    configurations: _Count | None = None
    simulations: _Count | None = None
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
