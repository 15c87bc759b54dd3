"""``pipeplan export --to torch``: the files torch.distributed.pipelining needs for a plan.

Written into one folder:

* ``schedule.csv``: one row per pipeline rank, pipeplan's exact order of compute and
  communication as ``_Action`` cells, for ``_PipelineScheduleRuntime._load_csv(path,
  format="compute_comms")`` (``schedule-dp{j}.csv`` per data-parallel replica ``j`` when
  the plan replicates its stages);
* ``schedule_compute.csv``: the same rows with F/B/I/W only, for ``_load_csv(path)``
  (torch adds the sends and receives itself; what torchtitan loads);
* ``pipeline.json``: the split (the module where each stage starts, for
  ``pipeline(split_spec=...)``; the modules and layers of each stage, its recompute
  (and recompute_layers: a checkpoint per layer), tensor_parallel, sequence_parallel and
  sharding), stage to rank, the device mesh
  (:func:`mesh_config`), microbatch size and count, optimizer, precision (fp32 or bf16:
  autocast around each stage's forward and the loss) and the model file;
* ``train_pipeline.py``: builds the stages and the schedule from these and trains
  (``torchrun --nproc-per-node N train_pipeline.py``), a starting point for your loop.

Microbatches and loss: the plan's microbatch size and count; the model file's ``loss_fn``
(pipeplan's default otherwise), divided by the number of microbatches with
``scale_grads=False``, so gradients are those of the whole batch's mean loss, as in
``pipeplan run`` and single-process training.

Tensor, sequence and sharded data parallelism: each rank builds its tensor-parallel shard
with the profiler's ``build_shard`` on the mesh's ``tp`` dimension; over its ``dp``
dimension a stage's gradients are summed (``sharding: none``), summed and stepped by one
owner per parameter (``zero1``), or reduce-scattered by FSDP2's ``fully_shard`` (``fsdp``,
whose ``UNSHARD``/``REDUCE_GRAD``/``RESHARD`` cells :func:`~planner.export.actions.fsdp_cells`
adds). The script's ``Optimizers`` and ``ZeroOne`` do on torch's collectives what
``pipeplan run``'s runtime will do for such plans (issue 22's runtime slice): one
arithmetic to fold together once both are in.

Example::

    outs = Outputs([("the plan", "plan.json")])
    export_torch(outs, load_export_source("plan.json"), outs.folder(Path("out"), "-o"))
    files = outs.commit()
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.export.actions import TorchLayout
from planner.export.source import ExportSource

if TYPE_CHECKING:
    from planner.outputs import Outputs

__all__ = ["MESH_DIMS", "SCHEMA", "csv_text", "export_torch", "mesh_config", "pipeline_config"]

SCHEMA = "pipeplan.export.torch/v1"
MESH_DIMS = ("pp", "dp", "tp")
"""The device mesh's dimensions, in torchtitan's order (``ParallelDims``: pp, then data
parallel, then tp); ``dp`` is replicated, ZeRO-1 or FSDP per stage (``stages[s].sharding``)."""
_TEMPLATE = Path(__file__).with_name("train_pipeline.py")


def csv_text(rows: list[list[str]]) -> str:
    """Rows of ``_Action`` cells as the CSV text torch's ``_load_csv`` reads.

    Example::

        csv_text([["0F0", "0SEND_F0"], ["1RECV_F0", "1F0"]])   # '0F0,0SEND_F0\\r\\n...'
    """
    out = io.StringIO()
    writer = csv.writer(out)
    for row in rows:
        writer.writerow(row)
    return out.getvalue()


def schedule_files(dp_degree: int, kind: str = "schedule") -> list[str]:
    """The CSV file name of each data-parallel replica.

    Example::

        schedule_files(2)     # ['schedule-dp0.csv', 'schedule-dp1.csv']
    """
    if dp_degree == 1:
        return [f"{kind}.csv"]
    return [f"{kind}-dp{j}.csv" for j in range(dp_degree)]


def mesh_config(layout: TorchLayout) -> dict[str, Any]:
    """``pipeline.json``'s ``mesh``: the dimensions in torchtitan's ``ParallelDims`` order
    (pipeline outermost, tensor parallel innermost), their degrees, and each global rank's
    coordinates and plan device, for ``init_device_mesh(device, shape,
    mesh_dim_names=names)``.

    Example::

        mesh_config(layout)["ranks"][3]   # {'rank': 3, 'pp': 1, 'dp': 0, 'tp': 1, 'device': 'cpu3'}
    """
    ranks = []
    for rank in range(layout.world_size):
        pp, dp, tp = layout.coordinates(rank)
        device = layout.devices[pp][dp][tp]
        ranks.append({"rank": rank, "pp": pp, "dp": dp, "tp": tp, "device": device})
    return {
        "dim_names": list(MESH_DIMS),
        "shape": [layout.pp_degree, layout.dp_degree, layout.tp_degree],
        "ranks": ranks,
    }


def pipeline_config(source: ExportSource, model: str | None) -> dict[str, Any]:
    """The ``pipeline.json`` object.

    Example::

        pipeline_config(source, "examples/gpt.py")["split_points"]   # ['blocks.2']
    """
    plan, layout, profile = source.plan, source.layout, source.profile
    return {
        "schema": SCHEMA,
        "plan": source.plan_path,
        "schedule": source.schedule.name,
        "model": model,
        "pp_degree": layout.pp_degree,
        "dp_degree": layout.dp_degree,
        "tp_degree": layout.tp_degree,
        "mesh": mesh_config(layout),
        "microbatch_size": plan.microbatch_size,
        "num_microbatches": plan.num_microbatches,
        "microbatches_local": layout.microbatches_per_replica,
        "stage_to_rank": layout.stage_to_rank,
        "split_points": [s.starts_at for s in source.splits[1:]],
        "stage_layers": [list(s.layers) for s in source.splits],
        "stages": [
            {
                "id": s.stage,
                "rank": layout.stage_to_rank[s.stage],
                "layers": list(s.layers),
                "layer_names": s.layer_names,
                "starts_at": s.starts_at,
                "modules": s.modules,
                "recompute": plan.stages[s.stage].recompute,
                "recompute_layers": plan.stages[s.stage].recompute_layers,
                "tensor_parallel": plan.stages[s.stage].tensor_parallel,
                "sequence_parallel": plan.stages[s.stage].sequence_parallel,
                "sharding": plan.stages[s.stage].sharding,
            }
            for s in source.splits
        ],
        "schedule_csv": schedule_files(layout.dp_degree),
        "schedule_compute_csv": schedule_files(layout.dp_degree, "schedule_compute"),
        "optimizer": profile.optimizer,
        "precision": profile.precision,
        "lr": None,
        "split_at": profile.settings.split_at,
        "capture": profile.settings.capture_method,
    }


def export_torch(
    outs: Outputs, source: ExportSource, out_dir: Path, *, model: str | None = None
) -> None:
    """Hand ``outs`` the files of the folder described in the module docstring (``out_dir``
    declared there); ``outs.commit()`` writes them, all or none.

    Example::

        export_torch(outs, source, Path("plan-torch"), model="/abs/examples/gpt.py")
    """
    layout = source.layout
    for j, name in enumerate(schedule_files(layout.dp_degree)):
        outs.write_text(out_dir / name, csv_text(layout.rows[j]))
    for j, name in enumerate(schedule_files(layout.dp_degree, "schedule_compute")):
        outs.write_text(out_dir / name, csv_text(layout.compute_rows[j]))
    outs.write_json(out_dir / "pipeline.json", pipeline_config(source, model))
    outs.write_text(out_dir / "train_pipeline.py", _TEMPLATE.read_text())
