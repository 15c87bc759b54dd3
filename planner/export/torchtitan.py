"""``pipeplan export --to torchtitan``: the job-config fields torchtitan reads for a plan,
as a torchtitan 0.3 Python config (:func:`titan_python`, :data:`TITAN_RELEASE`) and as a
0.2.x TOML fragment (:func:`titan_toml`), from one :class:`TitanFields`.

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
stage; the rest of :mod:`planner.export.source`'s refusals apply too. A Hugging Face
Llama-style model (``model.embed_tokens``, ``model.layers.N``, ``model.norm``, ``lm_head``)
is named as torchtitan's Llama 3 names the same modules (``tok_embeddings``, ``layers.N``,
``norm``, ``output``: torchtitan's ``Llama3StateDictAdapter.from_hf_map``, commit
``000204a4a8bf``), its rotary embedding left out (torchtitan keeps ``freqs_cis`` on the
root), so the plan applies to torchtitan's own model of the same shape.

Tensor parallelism and sharding were checked against the last TOML-era torchtitan,
commit ``238fa9953e4a`` (2026-02-23, before the config refactor #2386 that replaced TOML
job configs by Python dataclasses; :data:`TORCHTITAN_PARALLEL_COMMIT`):
``torchtitan/config/job_config.py`` and ``torchtitan/models/llama3/infra/parallelize.py``:

* ``parallelism.tensor_parallel_degree``: ``apply_tp`` always parallelizes the norms over
  the sequence (``SequenceParallel``), so sequence parallelism is on with every degree
  above 1 and there is no field to turn it off (``enable_sequence_parallel`` came with
  commit ``aa68af18e``, 2026-03-29, in the Python configs, 0.3.0 has it): for a plan
  without it only ``torchtitan_config.py`` is written;
* ``parallelism.data_parallel_shard_degree``: FSDP2's ``fully_shard`` over that many ranks
  (``fsdp_reshard_after_forward = "default"``: not resharded after forward under pipeline
  parallelism), for a plan whose stages are sharded ``fsdp``;
* ``parallelism.data_parallel_replicate_degree`` alone is DDP, which torchtitan refuses
  next to pipeline or tensor parallelism ("DDP has not supported > 1D parallelism"): such
  a plan is refused (solve with ``--sharding fsdp``);
* ZeRO-1 has no field (torchtitan shards with FSDP only), and every setting is one for the
  whole model: stages that differ are refused.

Example::

    text = titan_toml(titan_fields(source, csv_path="plan-torchtitan/schedule_compute.csv"))
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from planner.errors import InputError
from planner.export.source import ExportSource
from planner.export.split import titan_module
from planner.export.torch_pipelining import csv_text
from planner.outputs import Outputs

__all__ = [
    "TITAN_BASE",
    "TITAN_RELEASE",
    "TORCHTITAN_COMMIT",
    "TORCHTITAN_PARALLEL_COMMIT",
    "TitanFields",
    "export_torchtitan",
    "titan_checkpointing",
    "titan_data_parallel",
    "titan_fields",
    "titan_from_hf",
    "titan_modules",
    "titan_python",
    "titan_toml",
]

TORCHTITAN_COMMIT = "02ef790c79614758f85880e173d2338d7de502a3"
"""The torchtitan commit whose pipeline_parallel.py the fields were checked against."""

TITAN_RELEASE = "0.3.0"
"""The torchtitan release (PyPI, the newest on 2026-11-28) whose Python configs
``torchtitan_config.py`` is written for, its fields read from that wheel's
``torchtitan/config/configs.py``."""

TITAN_BASE = ("llama3", "llama3_8b")
"""The base config ``torchtitan_config.py`` starts from: ``(module, config)`` of torchtitan's
own registry (``torchtitan.models.<module>.config_registry.<config>``)."""

TORCHTITAN_PARALLEL_COMMIT = "238fa9953e4aec2a62582121564273d7cbb1e9f1"
"""The torchtitan commit (the last with TOML job configs) whose job_config.py and llama3
parallelize.py the tensor-parallel and data-parallel fields were checked against."""


# Hugging Face Llama's top-level modules as torchtitan's Llama 3 names them (its
# Llama3StateDictAdapter.from_hf_map maps their weights the same way); None: no module there.
_FROM_HF: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"model\.embed_tokens(\..*)?"), "tok_embeddings"),
    (re.compile(r"model\.layers\.(\d+)(\..*)?"), "layers.{0}"),
    (re.compile(r"model\.norm(\..*)?"), "norm"),
    (re.compile(r"lm_head(\..*)?"), "output"),
    (re.compile(r"model\.rotary_emb(\..*)?"), None),
)


def titan_from_hf(modules: list[list[str]]) -> list[list[str]] | None:
    """Each stage's Hugging Face Llama modules under torchtitan's Llama 3 names; None
    where some module is not one of them (not a Llama-style model).

    Example::

        titan_from_hf([["model.embed_tokens", "model.rotary_emb", "model.layers.0"],
                       ["model.layers.1", "model.norm", "lm_head"]])
        # [['tok_embeddings', 'layers.0'], ['layers.1', 'norm', 'output']]
    """
    out: list[list[str]] = []
    for stage in modules:
        names: list[str] = []
        for module in stage:
            for pattern, titan in _FROM_HF:
                hit = pattern.fullmatch(module)
                if hit is not None:
                    if titan is not None:
                        names.append(titan.format(*hit.groups()))
                    break
            else:
                return None
        out.append(list(dict.fromkeys(names)))
    return out


def titan_modules(source: ExportSource) -> list[list[str]]:
    """``module_fqns_per_model_part``: each stage's modules at torchtitan's granularity.

    Example::

        titan_modules(source)    # [['tok_embeddings', 'layers.0'], ['layers.1', 'norm', 'output']]
    """
    owner: dict[str, int] = {}
    modules: list[list[str]] = []
    for split in source.splits:
        if split.modules is None:
            raise InputError(
                f"stage {split.stage}'s layer names {split.layer_names} abbreviate their "
                "modules ('a+...+z'), so its module list is unknown; profile with --split-at "
                "so that each layer calls at most three modules",
                file=source.profile_path,
                field="layers",
            )
        modules.append(split.modules)
    named = titan_from_hf(modules) or modules
    parts: list[list[str]] = []
    for split, stage_modules in zip(source.splits, named, strict=True):
        names = list(dict.fromkeys(titan_module(m) for m in stage_modules))
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


def titan_data_parallel(source: ExportSource) -> tuple[int, int]:
    """``(data_parallel_replicate_degree, data_parallel_shard_degree)`` of the plan; one
    InputError line for what torchtitan cannot express (module docstring).

    Example::

        titan_data_parallel(source)    # (1, 2) for two replicas sharded with fsdp
    """
    layout, stages, where = source.layout, source.plan.stages, source.plan_path
    for stage in stages:
        field = f"stages[{stage.id}]"
        if (stage.sequence_parallel, stage.sharding) != (
            stages[0].sequence_parallel,
            stages[0].sharding,
        ):
            raise InputError(
                f"stage {stage.id} has sequence_parallel {stage.sequence_parallel}, sharding "
                f"{stage.sharding!r}, stage 0 {stages[0].sequence_parallel}, "
                f"{stages[0].sharding!r}; torchtitan has one setting for the whole model",
                file=where,
                field=field,
            )
        if stage.sharding == "zero1":
            raise InputError(
                "torchtitan has no ZeRO-1 (it shards data parallelism with FSDP only); solve "
                "with --sharding fsdp or none",
                file=where,
                field=f"{field}.sharding",
            )
    dp = layout.dp_degree
    if stages[0].sharding == "fsdp":
        return 1, dp
    if dp > 1 and (layout.pp_degree > 1 or layout.tp_degree > 1):
        raise InputError(
            f"{dp} replicas without sharding are torchtitan's DDP, which it refuses next to "
            "pipeline or tensor parallelism ('DDP has not supported > 1D parallelism'); "
            "solve with --sharding fsdp",
            file=where,
            field="stages[0].sharding",
        )
    return dp, 1


def titan_checkpointing(source: ExportSource) -> str:
    """The ``[activation_checkpoint]`` mode line: ``"none"`` where no stage recomputes,
    ``"full"`` (torchtitan checkpoints every transformer block on its own) where every
    stage checkpoints each of its layers; anything between is refused with one line.

    Example::

        titan_checkpointing(source)   # 'mode = "none"  # the plan recomputes nothing'
    """
    stages = source.plan.stages
    if not any(st.recompute for st in stages):
        return 'mode = "none"  # the plan recomputes nothing'
    for st in stages:
        if not st.recompute_layers:
            what = "checkpoints as a whole" if st.recompute else "recomputes nothing"
            raise InputError(
                f"stage {st.id} {what}; torchtitan's activation checkpointing is one "
                'setting for every block (mode "full": each block on its own), not per '
                "stage; solve without recompute (or set [activation_checkpoint] yourself)",
                file=source.plan_path,
                field=f"stages[{st.id}].recompute",
            )
    return (
        'mode = "full"  # every stage checkpoints each layer; torchtitan checkpoints its '
        "transformer blocks (not the embedding or the output)"
    )


@dataclass(frozen=True)
class TitanFields:
    """What a plan sets in torchtitan, whichever way that release takes its config."""

    pp_degree: int
    """``pipeline_parallel_degree``: pipeline ranks."""
    replicate: int
    """``data_parallel_replicate_degree``."""
    shard: int
    """``data_parallel_shard_degree`` (FSDP)."""
    tp_degree: int
    """``tensor_parallel_degree``."""
    sequence_parallel: bool
    """``enable_sequence_parallel`` (0.3; 0.2.x has it on with every degree above 1)."""
    style: str
    """``pipeline_parallel_schedule``: ``1F1B`` or ``Interleaved1F1B`` (placement only)."""
    csv_path: str
    """``pipeline_parallel_schedule_csv``: the compute-only order."""
    microbatch_size: int
    """``pipeline_parallel_microbatch_size``."""
    modules: list[list[str]]
    """``module_fqns_per_model_part``."""
    local_batch_size: int
    """``training.local_batch_size``: microbatches per replica x their size."""
    microbatches: int
    """Microbatches per data-parallel replica (for the comments)."""
    checkpointing: str
    """The ``[activation_checkpoint]`` mode line (:func:`titan_checkpointing`)."""
    full_checkpointing: bool
    """Every stage checkpoints each layer (torchtitan's full AC); else none."""
    header: list[str]
    """Comment lines: the plan, the commits checked, the module names."""
    plan_path: str | None
    """The plan file, named in refusals."""

    @property
    def in_toml(self) -> bool:
        """Whether 0.2.x's TOML can say it: not tensor parallelism without sequence
        parallelism, which only 0.3 turns off."""
        return self.tp_degree == 1 or self.sequence_parallel


def titan_fields(source: ExportSource, *, csv_path: str) -> TitanFields:
    """The plan's torchtitan settings, or one InputError line for what torchtitan cannot
    run as planned (ranks out of its loop order, replicas with different orders, non-fp32
    precision, and :func:`titan_checkpointing`'s, :func:`titan_modules`' and
    :func:`titan_data_parallel`'s refusals).

    Example::

        titan_fields(source, csv_path="/abs/plan-torchtitan/schedule_compute.csv").pp_degree
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
    if source.profile.precision != "fp32":
        raise InputError(
            f"precision {source.profile.precision}: torchtitan's mixed precision is FSDP's "
            "parameter dtype (mixed_precision_param), not the autocast pipeplan plans and "
            "runs; export with --to torch, or a plan profiled at fp32",
            file=source.profile_path,
            field="precision",
        )
    checkpointing = titan_checkpointing(source)
    modules = titan_modules(source)
    replicate, shard = titan_data_parallel(source)
    if titan_from_hf([list(split.modules or []) for split in source.splits]) is not None:
        names_note = (
            "# Module names: the Hugging Face Llama's as torchtitan's llama3 names them "
            "(model.layers.N -> layers.N, ...): train torchtitan's llama3 of the same shape."
        )
    else:
        names_note = (
            "# The module names are the profiled model's: they must be your torchtitan model's."
        )
    header = [
        # The path as a JSON string: valid in a TOML comment and a Python docstring,
        # whatever characters it has (quotes, backslashes, newlines).
        f"# pipeplan export of {json.dumps(str(source.plan_path))} "
        f"(schedule {source.schedule.name}, "
        f"{len(source.splits)} stages on {p} pipeline ranks x {layout.dp_degree} "
        f"data-parallel replicas x {layout.tp_degree} tensor-parallel ranks).",
        names_note,
        "# Tensor parallelism follows torchtitan's own plan for its model (with sequence",
        "# parallelism), not the model file's tp_plan().",
    ]
    return TitanFields(
        pp_degree=p,
        replicate=replicate,
        shard=shard,
        tp_degree=layout.tp_degree,
        sequence_parallel=plan.stages[0].sequence_parallel,
        style="Interleaved1F1B" if layout.stages_per_rank > 1 else "1F1B",
        csv_path=csv_path,
        microbatch_size=plan.microbatch_size,
        modules=modules,
        local_batch_size=plan.microbatch_size * layout.microbatches_per_replica,
        microbatches=layout.microbatches_per_replica,
        checkpointing=checkpointing,
        # titan_checkpointing refused anything but none or every stage per layer.
        full_checkpointing=any(st.recompute for st in plan.stages),
        header=header,
        plan_path=source.plan_path,
    )


def titan_toml(f: TitanFields) -> str:
    """The TOML fragment to paste into a torchtitan 0.2.x job config.

    Example::

        print(titan_toml(titan_fields(source, csv_path="/abs/schedule_compute.csv")))
    """
    if not f.in_toml:
        raise InputError(
            "torchtitan 0.2.x applies sequence parallelism with every tensor-parallel degree "
            f"(commit {TORCHTITAN_PARALLEL_COMMIT[:12]}: no field turns it off); 0.3's "
            "enable_sequence_parallel does (torchtitan_config.py), or solve with "
            "--sequence-parallel",
            file=f.plan_path,
            field="stages[0].sequence_parallel",
        )
    lines = [
        f.header[0],
        "# torchtitan 0.2.x (TOML job configs); torchtitan 0.3 (Python configs): "
        "torchtitan_config.py beside this file.",
        f"# Fields as read by torchtitan commit {TORCHTITAN_COMMIT[:12]} "
        "(torchtitan/distributed/pipeline_parallel.py) and, for tensor and data "
        f"parallelism, {TORCHTITAN_PARALLEL_COMMIT[:12]}; see docs/export.md.",
        *f.header[1:],
        "[parallelism]",
        f"pipeline_parallel_degree = {f.pp_degree}",
        f"data_parallel_replicate_degree = {f.replicate}",
        f"data_parallel_shard_degree = {f.shard}",
        f"tensor_parallel_degree = {f.tp_degree}",
        f'pipeline_parallel_schedule = "{f.style}"  # stage placement only; the CSV is the order',
        f"pipeline_parallel_schedule_csv = {json.dumps(f.csv_path)}",
        f"pipeline_parallel_microbatch_size = {f.microbatch_size}",
        f"module_fqns_per_model_part = {json.dumps(f.modules)}",
        "",
        "[training]",
        f"local_batch_size = {f.local_batch_size}  # {f.microbatches} microbatches "
        "per data-parallel replica",
        'mixed_precision_param = "float32"  # as planned (fp32); torchtitan\'s default '
        "bfloat16 casts FSDP's parameters",
        "",
        "[activation_checkpoint]",
        f.checkpointing,
    ]
    return "\n".join(lines) + "\n"


def titan_python(f: TitanFields) -> str:
    """``torchtitan_config.py``: a torchtitan 0.3 config registry with one config,
    ``pipeplan``, that is :data:`TITAN_BASE` (a config of torchtitan's own registry) with
    the plan's parallelism, local batch and activation checkpointing.

    Example::

        print(titan_python(titan_fields(source, csv_path="/abs/schedule_compute.csv")))
    """
    world = f.pp_degree * f.replicate * f.shard * f.tp_degree
    ac = "FullAC.Config()" if f.full_checkpointing else "None"
    ac_import = (
        "from torchtitan.distributed.activation_checkpoint import FullAC\n"
        if f.full_checkpointing
        else ""
    )
    header = "\n".join(line.removeprefix("# ") for line in f.header)
    return f'''"""{header}
torchtitan {TITAN_RELEASE} (Python configs): a config registry whose one config, ``pipeplan``, is
BASE below with the plan's parallelism, local batch and activation checkpointing. Run it
with this folder on PYTHONPATH, from torchtitan's checkout (its assets):

    PYTHONPATH=<this folder> torchrun --nproc-per-node {world} -m torchtitan.train \\
        --module torchtitan_config --config pipeplan

(``pipeplan export`` printed the line with this folder's path.)

BASE: the torchtitan config of your model (module under torchtitan.models, function of
its config_registry); change it to yours. Fields as torchtitan {TITAN_RELEASE}'s
torchtitan/config/configs.py (ParallelismConfig, TrainingConfig) and
torchtitan/distributed/activation_checkpoint.py define them; see docs/export.md.
"""

import importlib

from torchtitan.config import ParallelismConfig
{ac_import}
BASE = {TITAN_BASE!r}


def pipeplan():
    registry = importlib.import_module(f"torchtitan.models.{{BASE[0]}}.config_registry")
    config = getattr(registry, BASE[1])()
    config.parallelism = ParallelismConfig(
        pipeline_parallel_degree={f.pp_degree},
        data_parallel_replicate_degree={f.replicate},
        data_parallel_shard_degree={f.shard},
        tensor_parallel_degree={f.tp_degree},
        enable_sequence_parallel={f.sequence_parallel},
        pipeline_parallel_schedule={f.style!r},  # stage placement only; the CSV is the order
        pipeline_parallel_schedule_csv={f.csv_path!r},
        pipeline_parallel_microbatch_size={f.microbatch_size},
        module_fqns_per_model_part={f.modules!r},
    )
    config.training.local_batch_size = {f.local_batch_size}  # {f.microbatches} microbatches each
    config.training.mixed_precision_param = "float32"  # as planned; default bf16 under FSDP
    config.training.disable_cuda_graphs = True  # {TITAN_RELEASE}: none with PP
    config.activation_checkpoint = {ac}
    return config
'''


def export_torchtitan(outs: Outputs, source: ExportSource, out_dir: Path) -> list[str]:
    """Hand ``outs`` ``torchtitan.toml`` (torchtitan 0.2.x), ``torchtitan_config.py``
    (torchtitan 0.3) and the compute-only ``schedule_compute.csv`` both name (``out_dir``
    declared there); ``outs.commit()`` writes them, all or none. Returns notes for the
    user: the TOML is left out for tensor parallelism without sequence parallelism, which
    0.2.x cannot turn off.

    Example::

        export_torchtitan(outs, source, Path("plan-torchtitan"))
    """
    csv_path = out_dir / "schedule_compute.csv"
    fields = titan_fields(source, csv_path=str(csv_path.resolve()))
    outs.write_text(csv_path, csv_text(source.layout.compute_rows[0]))
    notes = []
    if not fields.in_toml:
        stale = (out_dir / "torchtitan.toml").exists()
        notes.append(
            "no torchtitan.toml: torchtitan 0.2.x applies sequence parallelism with every "
            "tensor-parallel degree; torchtitan_config.py (0.3) turns it off"
            + ("; the torchtitan.toml already in the folder is not this plan's" if stale else "")
        )
    else:
        outs.write_text(out_dir / "torchtitan.toml", titan_toml(fields))
    outs.write_text(out_dir / "torchtitan_config.py", titan_python(fields))
    return notes
