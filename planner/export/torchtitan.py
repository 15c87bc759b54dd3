"""``pipeplan export --to torchtitan``: the job-config fields torchtitan reads for a plan.

Checked against torchtitan's source (TOML job configs): ``torchtitan/config/job_config.py``
(``Parallelism``) and ``torchtitan/distributed/pipeline_parallel.py`` at commit
``02ef790c79614758f85880e173d2338d7de502a3`` (see docs/export.md). There,

* ``parallelism.pipeline_parallel_schedule_csv`` set makes the schedule a
  ``_PipelineScheduleRuntime`` that ``_load_csv(path)``-s compute-only rows (torch adds the
  sends and receives), with ``loss_fn`` rescaled by the microbatch count and
  ``scale_grads=False``;
* ``parallelism.module_fqns_per_model_part`` lists each stage's modules (top-level children
  and entries of top-level ModuleLists); rank ``r`` builds stages ``r, r + p, ...`` (``loop``
  style; ``pipeline_parallel_schedule`` only picks that style and must name a real schedule);
* microbatches = ``training.local_batch_size // parallelism.pipeline_parallel_microbatch_size``.

So a plan exports when its stages sit on ranks in loop order and each module belongs to one
stage; the rest of :mod:`planner.export.source`'s refusals apply too.

Example::

    text = titan_toml(source, csv_path="plan-torchtitan/schedule_compute.csv")
"""

from __future__ import annotations

import json
from pathlib import Path

from planner.errors import InputError
from planner.export.source import ExportSource
from planner.export.split import titan_module
from planner.export.torch_pipelining import csv_text
from planner.outputs import Outputs

__all__ = ["TORCHTITAN_COMMIT", "export_torchtitan", "titan_modules", "titan_toml"]

TORCHTITAN_COMMIT = "02ef790c79614758f85880e173d2338d7de502a3"
"""The torchtitan commit whose pipeline_parallel.py the fields were checked against."""


def titan_modules(source: ExportSource) -> list[list[str]]:
    """``module_fqns_per_model_part``: each stage's modules at torchtitan's granularity.

    Example::

        titan_modules(source)    # [['tok_embeddings', 'layers.0'], ['layers.1', 'norm', 'output']]
    """
    owner: dict[str, int] = {}
    parts: list[list[str]] = []
    for split in source.splits:
        if split.modules is None:
            raise InputError(
                f"stage {split.stage}'s layer names {split.layer_names} abbreviate their "
                "modules ('a+...+z'), so its module list is unknown; profile with --split-at "
                "so that each layer calls at most three modules",
                file=source.profile_path,
                field="layers",
            )
        names = list(dict.fromkeys(titan_module(m) for m in split.modules))
        for name in names:
            if owner.setdefault(name, split.stage) != split.stage:
                raise InputError(
                    f"module {name!r} would belong to stages {owner[name]} and {split.stage}; "
                    "torchtitan keeps or drops whole top-level modules and ModuleList entries",
                    file=source.plan_path,
                    field="stages",
                )
        parts.append(names)
    return parts


def titan_toml(source: ExportSource, *, csv_path: str) -> str:
    """The TOML fragment to paste into a torchtitan job config.

    Example::

        print(titan_toml(source, csv_path="/abs/plan-torchtitan/schedule_compute.csv"))
    """
    layout, plan = source.layout, source.plan
    p = layout.pp_degree
    if layout.stage_to_rank != [s % p for s in range(len(layout.stage_to_rank))]:
        raise InputError(
            f"stages sit on ranks {layout.stage_to_rank}; torchtitan places stage s on rank "
            f"s mod {p} (its loop style)",
            file=source.plan_path,
            field="stages",
        )
    if any(rows != layout.compute_rows[0] for rows in layout.compute_rows):
        raise InputError(
            "the data-parallel replicas run different orders; torchtitan loads one CSV for all",
            file=source.plan_path,
            field="schedule.devices",
        )
    for stage in plan.stages:
        if stage.recompute:
            raise InputError(
                f"stage {stage.id} recomputes its activations; torchtitan's activation "
                "checkpointing is one setting for every block, not per stage; solve without "
                "recompute (or set [activation_checkpoint] yourself)",
                file=source.plan_path,
                field=f"stages[{stage.id}].recompute",
            )
    modules = titan_modules(source)
    style = "Interleaved1F1B" if layout.stages_per_rank > 1 else "1F1B"
    local_batch = plan.microbatch_size * layout.microbatches_per_replica
    lines = [
        f"# pipeplan export of {source.plan_path} (schedule {source.schedule.name}, "
        f"{len(source.splits)} stages on {p} pipeline ranks x {layout.dp_degree} "
        "data-parallel replicas).",
        f"# Fields as read by torchtitan commit {TORCHTITAN_COMMIT[:12]} "
        "(torchtitan/distributed/pipeline_parallel.py); see docs/export.md.",
        "# The module names are the profiled model's: they must be your torchtitan model's.",
        "[parallelism]",
        f"pipeline_parallel_degree = {p}",
        f"data_parallel_replicate_degree = {layout.dp_degree}",
        "data_parallel_shard_degree = 1",
        f'pipeline_parallel_schedule = "{style}"  # stage placement only; the CSV is the order',
        f"pipeline_parallel_schedule_csv = {json.dumps(csv_path)}",
        f"pipeline_parallel_microbatch_size = {plan.microbatch_size}",
        f"module_fqns_per_model_part = {json.dumps(modules)}",
        "",
        "[training]",
        f"local_batch_size = {local_batch}  # {layout.microbatches_per_replica} microbatches "
        "per data-parallel replica",
        "",
        "[activation_checkpoint]",
        'mode = "none"  # the plan recomputes nothing',
    ]
    return "\n".join(lines) + "\n"


def export_torchtitan(outs: Outputs, source: ExportSource, out_dir: Path) -> None:
    """Hand ``outs`` ``torchtitan.toml`` and the compute-only ``schedule_compute.csv`` it
    names (``out_dir`` declared there); ``outs.commit()`` writes them, both or neither.

    Example::

        export_torchtitan(outs, source, Path("plan-torchtitan"))
    """
    csv_path = out_dir / "schedule_compute.csv"
    toml = titan_toml(source, csv_path=str(csv_path.resolve()))
    outs.write_text(csv_path, csv_text(source.layout.compute_rows[0]))
    outs.write_text(out_dir / "torchtitan.toml", toml)
