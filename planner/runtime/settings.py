"""A run's settings, typed: what the checks before a run find, and what every worker reads.

:func:`planner.runtime.runner.check_plan` returns a :class:`RunSettings` (the optimizer,
graph capture, precision and threads of the plan's profile, when found, and the notes for
the report); :func:`planner.runtime.runner.worker_config` turns it into a
:class:`WorkerConfig`, which travels to the worker processes as JSON (``to_dict`` /
``from_dict``; the plan inside it is read with :func:`planner.plan.plan_from_dict`).

Example::

    settings = check_plan(Plan.load("plan.json"), "model.py", "plan.json")
    settings.optimizer, settings.notes
    config = WorkerConfig.from_dict(json.loads(Path("run/config.json").read_text()))
    config.plan.schedule, config.placement.world_size
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.plan import Plan, plan_from_dict
from planner.runtime.placement import Placement

if TYPE_CHECKING:
    from planner.profile.schema import Profile

__all__ = ["RunSettings", "WorkerConfig"]


@dataclass
class RunSettings:
    """What a run takes from its plan's profile, when it is found, and the notes for its
    report. Without the profile: Adam, automatic graph capture, the precision asked for.

    Example::

        RunSettings(num_layers=6, optimizer="sgd").precision     # None: not profiled
    """

    num_layers: int  # the plan's stages cover layers 0 .. num_layers - 1
    optimizer: str = "adam"
    split_at: str | None = None
    capture: str = "auto"
    precision: str | None = None  # the profile's
    threads: int | None = None  # the profile's torch threads
    profile: Profile | None = None
    profile_path: str | None = None
    layer_names: list[str] | None = None  # the profile's, checked against the model's split
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker process of a run reads (as JSON in the run folder).

    ``init_method`` is the rendezvous (``tcp://...`` for a local launch, ``env://`` under
    torchrun); ``return_params`` makes rank 0 save the trained parameters; ``layer_names``
    (the profile's, when it was found) is what every rank checks its split against;
    ``count_collectives`` records the collectives of each forward and backward
    (:mod:`planner.runtime.collective_count`).

    Example::

        config = WorkerConfig.from_dict(config.to_dict())
    """

    plan: Plan
    plan_source: str
    model: str
    placement: Placement
    steps: int
    warmup: int
    timeout_s: float
    run_dir: str
    threads: int
    optimizer: str
    split_at: str | None = None
    capture: str = "auto"
    precision: str = "fp32"
    lr: float | None = None
    return_params: bool = False
    init_method: str | None = None
    layer_names: list[str] | None = None
    count_collectives: bool = False  # record each action's collectives (a check, slower)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form the workers read.

        Example::

            Path("run/config.json").write_text(json.dumps(config.to_dict()))
        """
        return {
            "plan": self.plan.to_dict(),
            "plan_source": self.plan_source,
            "model": self.model,
            "placement": self.placement.to_dict(),
            "steps": self.steps,
            "warmup": self.warmup,
            "timeout_s": self.timeout_s,
            "run_dir": self.run_dir,
            "threads": self.threads,
            "optimizer": self.optimizer,
            "split_at": self.split_at,
            "capture": self.capture,
            "precision": self.precision,
            "lr": self.lr,
            "return_params": self.return_params,
            "init_method": self.init_method,
            "layer_names": self.layer_names,
            "count_collectives": self.count_collectives,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerConfig:
        """Read what :meth:`to_dict` wrote (the plan checked as ``Plan.load`` checks it).

        Example::

            config = WorkerConfig.from_dict(json.loads(Path(path).read_text()))
        """
        source = str(data["plan_source"])
        return cls(
            plan=plan_from_dict(data["plan"], source=source),
            plan_source=source,
            model=str(data["model"]),
            placement=Placement.from_dict(data["placement"]),
            steps=int(data["steps"]),
            warmup=int(data["warmup"]),
            timeout_s=float(data["timeout_s"]),
            run_dir=str(data["run_dir"]),
            threads=int(data["threads"]),
            optimizer=str(data["optimizer"]),
            split_at=data.get("split_at"),
            capture=str(data.get("capture") or "auto"),
            precision=str(data.get("precision") or "fp32"),
            lr=data.get("lr"),
            return_params=bool(data.get("return_params")),
            init_method=data.get("init_method"),
            layer_names=data.get("layer_names"),
            count_collectives=bool(data.get("count_collectives")),
        )
