"""Export a plan to the trainers people already use: torch.distributed.pipelining, torchtitan.

``export_plan`` checks the plan (refusing, with one line, what those runtimes cannot train
exactly; see :mod:`planner.export.source`) and writes a folder:

* ``--to torch``: ``schedule.csv`` (per-rank ``_Action`` rows for
  ``_PipelineScheduleRuntime``), ``schedule_compute.csv``, ``pipeline.json`` (split points,
  stage modules and layers, ranks, microbatches) and ``train_pipeline.py`` (builds the
  stages and the schedule and trains); :mod:`planner.export.torch_pipelining`;
* ``--to torchtitan``: ``torchtitan_config.py`` (a torchtitan 0.3 config registry),
  ``torchtitan.toml`` (the same ``[parallelism]`` fields for torchtitan 0.2.x, tensor and
  FSDP degrees included) and the ``schedule_compute.csv`` both name;
  :mod:`planner.export.torchtitan`.

Tensor-parallel, sequence-parallel, ZeRO-1 and FSDP plans export to both (what each
target cannot express is refused with one line); with ``--model`` a tensor-parallel
degree the model's plan cannot split is refused first (:func:`check_tensor_parallel`).

The package depends only on the plan, profile, schedule and (for ``--model``) the profiler's
splitter; nothing imports it but the ``export`` command.

Example::

    result = export_plan("plan.json", "torch", "plan-torch", model="examples/gpt.py")
    result.files      # [Path('plan-torch/schedule.csv'), ...]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.export.source import ExportSource, load_export_source
from planner.export.torch_pipelining import export_torch
from planner.export.torchtitan import export_torchtitan
from planner.fileio import check_input_file
from planner.outputs import Outputs
from planner.plan_inputs import plan_files
from planner.profile.isolated import call_isolated
from planner.profile.loader import UserModel, check_model_path, load_model_file
from planner.profile.model_check import ProfiledSplit, check_source, check_split

__all__ = [
    "TARGETS",
    "ExportResult",
    "check_model",
    "check_model_file",
    "check_tensor_parallel",
    "export_plan",
    "stale_files",
]

TARGETS = ("torch", "torchtitan")


@dataclass
class ExportResult:
    """What an export wrote, and how to run it."""

    target: str
    out_dir: Path
    files: list[Path]
    pp_degree: int
    dp_degree: int
    notes: list[str] = field(default_factory=list)
    tp_degree: int = 1

    @property
    def world_size(self) -> int:
        return self.pp_degree * self.dp_degree * self.tp_degree


def check_model(source: ExportSource, model: str | os.PathLike[str]) -> str:
    """Refuse a model file that is not the one profiled, or that splits into other layers
    (:mod:`planner.profile.model_check`, the checks ``run`` makes too); returns its
    absolute path.

    Example::

        check_model(load_export_source("plan.json"), "examples/gpt.py")
    """
    import torch

    from planner.profile.split import capture_model  # lazy: pulls torch

    user = load_model_file(model)
    profile = source.profile
    check_source(str(model), user.source_sha256, profile)
    if user.takes_whole_output():
        raise InputError(
            "loss_fn takes the whole Hugging Face ModelOutput, but torch's PipelineStage "
            "passes tensors only; export gives the last stage's .logits: make loss_fn take them",
            file=str(model),
            field="loss_fn",
        )
    torch.manual_seed(0)
    net = user.build()
    inputs, _ = user.batch(source.plan.microbatch_size)
    expected = ProfiledSplit.of(profile)
    split = capture_model(net, inputs, expected.split_at, capture=expected.capture)
    covered = max(s.last for s in source.plan.stages) + 1
    check_split(split, expected, model=str(model), covered=covered)
    check_tensor_parallel(source, user, net)
    return str(Path(model).resolve())


def check_tensor_parallel(source: ExportSource, user: UserModel, net: Any) -> None:
    """Refuse, before anything is written, a tensor-parallel plan whose model's plan
    (``tp_plan()`` or Hugging Face's) the script's ``build_shard`` would refuse: the
    profiler's own checks (a degree that does not divide the heads or a split dimension,
    no plan, no sequence-parallel form, ...).

    Example::

        check_tensor_parallel(source, load_model_file("examples/gpt.py"), gpt)
    """
    from planner.profile.tensor_parallel import TensorParallelRequest, check_request

    checked: set[tuple[int, bool]] = set()
    for stage in source.plan.stages:
        setting = (stage.tensor_parallel, stage.sequence_parallel)
        if stage.tensor_parallel == 1 or setting in checked:
            continue
        checked.add(setting)
        try:
            request = TensorParallelRequest((setting[0],), setting[1])
            check_request(user, net, request, source.profile.settings.split_at)
        except InputError as err:  # the profiler's words; the plan's field
            raise InputError(
                f"{err.message} (the model file {user.path})",
                file=source.plan_path,
                field=f"stages[{stage.id}].tensor_parallel",
            ) from None


def check_model_file(plan: str, model: str) -> str:
    """:func:`check_model` of the plan at path ``plan`` (what a child process runs).

    Example::

        check_model_file("plan.json", "examples/gpt.py")
    """
    return check_model(load_export_source(plan), model)


# Every name an export writes (torch's and torchtitan's), to find an earlier export's files.
_EXPORT_NAMES = (
    "schedule.csv",
    "schedule-dp*.csv",
    "schedule_compute.csv",
    "schedule_compute-dp*.csv",
    "pipeline.json",
    "train_pipeline.py",
    "torchtitan.toml",
    "torchtitan_config.py",
)


def stale_files(folder: Path, written: Sequence[Path]) -> list[Path]:
    """Files in ``folder`` named as an export names its files but not among ``written``:
    left by an earlier export into the same folder (a ``torchtitan.toml`` from a plan with
    other settings, ``schedule-dp3.csv`` of a plan with more replicas). Export does not
    remove them; it names them in a note.

    Example::

        stale_files(Path("plan-torch"), files)   # [PosixPath('plan-torch/schedule-dp3.csv')]
    """
    done = {p.resolve() for p in written}
    found = {p for pattern in _EXPORT_NAMES for p in folder.glob(pattern) if p.is_file()}
    return sorted(p for p in found if p.resolve() not in done)


def export_plan(
    plan: str | os.PathLike[str],
    to: str,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    model: str | os.PathLike[str] | None = None,
    isolate: bool = False,
) -> ExportResult:
    """Check ``plan`` and write the export for ``to`` (``torch`` or ``torchtitan``).

    ``out_dir`` defaults to ``PLANSTEM-TO`` in the current folder and is created (its parent
    must exist); it is checked before anything else and its files are written all or none
    (:class:`planner.outputs.Outputs`), never over the plan, its profile or topology, or
    the model. ``model`` is checked against the profile and recorded for the script; with
    ``isolate`` (the command line) its code runs in a child process
    (:mod:`planner.profile.isolated`), so its exits and crashes are reported, never this
    process's own.

    Example::

        export_plan("plan.json", "torchtitan")      # plan-torchtitan/torchtitan_config.py, ...
    """
    if to not in TARGETS:
        raise InputError(
            f"unknown target {to!r}; expected one of {', '.join(TARGETS)}", field="--to"
        )
    outs = Outputs([("the plan", check_input_file(plan)), ("--model", model)])
    target = outs.folder(
        Path(out_dir) if out_dir is not None else Path(f"{Path(plan).stem}-{to}"), "-o"
    )
    source = load_export_source(plan)
    outs.add_inputs(plan_files(source.plan, Path(plan)))
    model_path = None
    if model is not None and isolate:
        check_model_path(model)
        model_path = call_isolated(
            check_model_file, str(plan), str(model), model=Path(model), doing="checking it"
        )
    elif model is not None:
        model_path = check_model(source, model)
    notes: list[str] = []
    if to == "torch":
        export_torch(outs, source, target, model=model_path)
        if model_path is None:
            notes.append("no --model given: pass --model to train_pipeline.py")
    else:
        notes.extend(export_torchtitan(outs, source, target))
    files = outs.commit()
    stale = stale_files(target, files)
    if stale:
        notes.append(
            f"{target} also holds {', '.join(p.name for p in stale)} from an earlier export "
            "(not part of this one): remove them"
        )
    layout = source.layout
    return ExportResult(
        to, target, files, layout.pp_degree, layout.dp_degree, notes, layout.tp_degree
    )
