"""A run's settings, typed: what the checks before a run find, and what every worker reads.

:func:`planner.runtime.runner.check_plan` returns a :class:`RunSettings`: the run's
:class:`Training` (the optimizer, precision, threads and model split of the plan's profile,
when found) and the notes for the report; :func:`planner.runtime.runner.worker_config`
turns it into a :class:`WorkerConfig`, which travels to the worker processes as JSON
(:func:`planner.records.record_dict`, read back by :func:`planner.records.read_record`; the
plan inside it is read with :func:`planner.plan.plan_from_dict`).

Example::

    settings = check_plan(Plan.load("plan.json"), "model.py", "plan.json")
    settings.training.optimizer, settings.notes
    config = read_record(WorkerConfig, json.loads(Path("run/config.json").read_text()),
                         file="run/config.json")
    config.plan.schedule, config.placement.world_size
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from planner.plan import Plan, plan_from_dict
from planner.profile.model_check import ProfiledSplit
from planner.records import Kind
from planner.runtime.placement import Placement

if TYPE_CHECKING:
    from planner.profile.schema import Profile

__all__ = ["RunSettings", "Training", "WorkerConfig"]


@dataclass(frozen=True)
class Training:
    """How every rank trains: the plan's profile's optimizer, precision, torch threads and
    model split where it was found (else Adam, fp32, the launcher's thread count and an
    automatic capture checked only against the plan's layer count); ``run`` may override
    the optimizer and must agree with the precision.

    Example::

        Training(optimizer="sgd").precision     # 'fp32'
    """

    optimizer: str = "adam"
    precision: str = "fp32"
    threads: int | None = None
    split: ProfiledSplit = ProfiledSplit()


@dataclass
class RunSettings:
    """What a run takes from its plan's profile, when it is found (``profile``,
    ``profile_path``), and the notes for its report.

    Example::

        RunSettings(num_layers=6, training=Training(optimizer="sgd")).profile   # None
    """

    num_layers: int  # the plan's stages cover layers 0 .. num_layers - 1
    training: Training = Training()
    profile: Profile | None = None
    profile_path: str | None = None
    notes: list[str] = field(default_factory=list)


def _plan(data: Any) -> Plan:
    # The launcher read and validated this very plan before it wrote it.
    return plan_from_dict(data, source="the run's plan")


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker process of a run reads (as JSON in the run folder).

    ``init_method`` is the rendezvous (``tcp://...`` for a local launch, ``env://`` under
    torchrun); ``return_params`` makes rank 0 save the trained parameters; ``training``'s
    split is what every rank checks its model against.

    Example::

        read_record(WorkerConfig, record_dict(config), file="config.json") == config
    """

    plan: Annotated[Plan, Kind("a plan", _plan)]
    model: str
    placement: Placement
    steps: int
    warmup: int
    timeout_s: float
    run_dir: str
    training: Training
    lr: float | None = None
    return_params: bool = False
    init_method: str | None = None
