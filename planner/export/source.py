"""Reading a plan for export, and refusing what torch.distributed.pipelining cannot run.

:func:`load_export_source` reads the plan and its profile (for the layer names), checks
the schedule, and raises one InputError line naming the feature for every plan that torch's
runtime would not train exactly as ``pipeplan run`` does:

* ``2bw`` (two weight versions, no flush between iterations): torch flushes every step;
* replicated stages with different replica counts (torch has one data-parallel degree);
  equal counts export as a data-parallel dimension (``dp_degree``), tensor-parallel groups
  as a tensor-parallel one (``tp_degree``), sharded replicas as ZeRO-1 or FSDP over the
  data-parallel one (:mod:`planner.export.torch_pipelining`);
* recomputed stages under zero-bubble's split backward (``I`` then ``W``); under a whole
  backward (gpipe, 1f1b, interleaved) a recomputed stage exports as its module under
  non-reentrant activation checkpointing, as ``pipeplan run`` recomputes it;
* parameters tied across stages (torch keeps one copy per stage and never syncs them);
* precision fp16 (pipeplan run's loss scaling is agreed over all stages); bf16 exports as
  autocast around each stage's forward and the loss, as ``pipeplan run`` trains;
* a profile imported from PipeDream (its layers are graph nodes, not modules);
* a stage that starts at a layer calling no module (no name to split before).

Example::

    source = load_export_source("plan.json")
    source.layout.rows[0]          # CSV rows of data-parallel replica 0
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from planner.errors import InputError
from planner.export.actions import TorchLayout, torch_layout
from planner.export.split import StageSplit, stage_splits
from planner.plan import Plan
from planner.plan_inputs import check_unchanged, find_file
from planner.profile.schema import Profile, load_profile
from planner.schedule import ActionType, Schedule

__all__ = ["ExportSource", "load_export_source"]


@dataclass
class ExportSource:
    """A plan checked for export, with its profile, schedule, ranks and stage names."""

    plan: Plan
    plan_path: str
    profile: Profile
    profile_path: str
    schedule: Schedule
    layout: TorchLayout
    splits: list[StageSplit]


def load_export_source(plan_path: str | os.PathLike[str]) -> ExportSource:
    """Load ``plan_path`` and check that torch can run it exactly (module docstring).

    Example::

        source = load_export_source("plan.json")
    """
    where = str(plan_path)
    plan = Plan.load(plan_path)
    schedule = plan.schedule  # validated against the stages by Plan.load
    _refuse_schedule(plan, schedule, where)
    found = find_file(plan.profile, where)
    if found is None:
        raise InputError(
            f"the plan's profile {plan.profile.path!r} was not found (next to the "
            "plan or from here); export needs its layer names",
            file=where,
            field="profile.path",
        )
    check_unchanged(found, plan.profile, "profile", where)
    profile = load_profile(found)
    _refuse_profile(plan, profile, str(found), where)
    layout = torch_layout(plan.stages, schedule, source=where)
    splits = stage_splits(plan.stages, [layer.name for layer in profile.layers], source=where)
    for split in splits[1:]:
        if split.starts_at is None:
            raise InputError(
                f"stage {split.stage} starts at layer {split.layer_names[0]!r}, which calls no "
                "module, so there is no module name to split before; move the cut",
                file=where,
                field=f"stages[{split.stage}].layers",
            )
    return ExportSource(plan, where, profile, str(found), schedule, layout, splits)


def _refuse_schedule(plan: Plan, schedule: Schedule, where: str) -> None:
    if schedule.weight_versions == 2:
        raise InputError(
            "schedule 2bw (PipeDream-2BW: two weight versions, no flush between iterations) "
            "cannot be expressed in torch.distributed.pipelining, which flushes every step; "
            "solve with --schedule gpipe, 1f1b, interleaved or zb",
            file=where,
            field="schedule.name",
        )
    if schedule.iterations != 1:
        raise InputError(
            f"the schedule lists {schedule.iterations} iterations; torch runs one per step",
            file=where,
            field="schedule.iterations",
        )
    split_backward = any(a.kind is ActionType.I for acts in schedule.devices.values() for a in acts)
    for stage in plan.stages:
        if stage.recompute and split_backward:
            raise InputError(
                f"stage {stage.id} recomputes its activations (recompute: true) under a split "
                "backward (I then W), which torch.distributed.pipelining does not pair with "
                "activation checkpointing; solve without recompute or with 1f1b",
                file=where,
                field=f"stages[{stage.id}].recompute",
            )


def _refuse_profile(plan: Plan, profile: Profile, profile_path: str, where: str) -> None:
    if "pipedream" in profile.meta:
        raise InputError(
            "the plan's profile was imported from PipeDream: its layers are graph nodes, "
            "not modules of a model.py that torch could split",
            file=profile_path,
            field="meta.pipedream",
        )
    if profile.precision == "fp16":
        raise InputError(
            "precision fp16 needs pipeplan run's loss scaling agreed over all stages, which "
            "the export does not carry; export a plan profiled at fp32 (or at bf16, to torch)",
            file=profile_path,
            field="precision",
        )
    for tie in profile.tied_parameters:
        holders = [s.id for s in plan.stages if tie.held_by(s.first, s.last)]
        if len(holders) > 1:
            raise InputError(
                f"parameter {tie.name!r} is tied across stages {holders}: "
                "torch.distributed.pipelining keeps a separate copy per stage and never "
                "syncs them; put the layers that share it in one stage (pipeplan simulate "
                "--stages ... -o plan.json), or train this plan with pipeplan run",
                file=where,
                field="stages",
            )
