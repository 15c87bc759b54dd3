"""Train with a pipeplan plan under torch.distributed.pipelining (written by `pipeplan export`).

The files beside this one say what to run: ``pipeline.json`` (stages, ranks, microbatches,
optimizer, model file) and ``schedule.csv`` (one row of ``_Action`` cells per pipeline
rank: pipeplan's order of F, B, I, W and sends and receives, loaded by torch's
``_PipelineScheduleRuntime``). One process per rank, as torchrun starts them:

    torchrun --nproc-per-node 2 train_pipeline.py --steps 1
    torchrun --nproc-per-node 2 train_pipeline.py --split torch   # torch's pipeline() split

Each step seeds torch with the step number and draws ``sample_batch(microbatch_size *
num_microbatches)`` from the model file, as ``pipeplan run`` does, so both train alike;
put your data loader there. ``--split pipeplan`` (default) cuts the model with pipeplan's
splitter, exactly the layers it profiled; ``--split torch`` needs no pipeplan but only
models whose stages talk to their neighbours only, and no tensor parallelism or FSDP.

The ranks form a device mesh ``(pp, dp, tp)`` (``pipeline.json``'s ``mesh``, torchtitan's
order). With tensor parallelism each rank's stages are its shard of the model, built by
pipeplan's profiler (``build_shard``: the model's ``tp_plan()`` or Hugging Face plan under
torch's ``parallelize_module`` on ``mesh["tp"]``); member ``i`` of a stage's group talks to
member ``i`` of the next. Over ``mesh["dp"]`` each stage's gradients are summed
(``sharding: none``), summed and stepped by one owner per parameter that broadcasts it
(``zero1``: ZeRO-1, each replica holds the optimizer state of its parameters only), or
reduce-scattered by torch's FSDP2 ``fully_shard`` (``fsdp``).

``precision`` bf16 (the profile's): every stage's forward and the loss run under
``torch.autocast(dtype=torch.bfloat16)`` as in ``pipeplan run``; weights, gradients and
the optimizer stay fp32 (no loss scaling is needed; fp16 plans are not exported).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, SplitPoint, pipeline
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

HERE = Path(__file__).resolve().parent


def load_module(path: str) -> ModuleType:
    """Import the model file (``build_model``, ``sample_batch``, optional ``loss_fn``)."""
    spec = importlib.util.spec_from_file_location("pipeplan_user_model", path)
    assert spec is not None and spec.loader is not None, f"cannot import {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_loss(outputs: Any, targets: Any) -> torch.Tensor:
    """pipeplan's default: cross-entropy for integer targets, else mean squared error."""
    if hasattr(outputs, "logits"):  # a Hugging Face ModelOutput
        outputs = outputs.logits
    if targets.is_floating_point():
        return nn.functional.mse_loss(outputs, targets)
    return nn.functional.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))


def wants_whole_output(fn: Any) -> bool:
    """pipeplan's rule: a ``loss_fn`` whose first parameter is annotated ``...Output`` gets
    a Hugging Face ``ModelOutput`` whole; any other gets its ``.logits``."""
    import inspect

    params = list(inspect.signature(fn).parameters.values())
    hint = params[0].annotation if params else None
    return str(getattr(hint, "__name__", hint)).endswith("Output")


def make_optimizer(name: str, params: list[nn.Parameter], lr: float | None) -> Any:
    """The profile's optimizer with pipeplan's default rates (adam 1e-3, sgd 0.01)."""
    rate = lr if lr is not None else (1e-3 if name in ("adam", "adamw") else 0.01)
    if name == "sgd":
        return torch.optim.SGD(params, lr=rate)
    if name == "momentum":
        return torch.optim.SGD(params, lr=rate, momentum=0.9)
    return (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)(params, lr=rate)


def as_inputs(value: Any) -> Any:
    """``sample_batch``'s inputs as a tuple of tensors, or a dict of keyword tensors."""
    if isinstance(value, dict):
        return dict(value)
    return tuple(value) if isinstance(value, tuple | list) else (value,)


def on_device(value: Any, device: torch.device) -> Any:
    """``value``'s tensors on ``device`` (a sample the model, already there, can run)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: on_device(v, device) for key, v in value.items()}
    return type(value)(on_device(v, device) for v in value)


def mixed_precision(cfg: dict[str, Any], device_type: str) -> Any:
    """``torch.autocast`` at the plan's precision (bf16), as ``pipeplan run`` trains; a
    context that does nothing at fp32."""
    if cfg["precision"] == "fp32":
        return contextlib.nullcontext()
    assert cfg["precision"] == "bf16", f"precision {cfg['precision']} is not exported"
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)


class Autocast(nn.Module):
    """A stage's forward under the plan's autocast (outside its activation checkpoint,
    whose recompute restores the autocast state, as in ``pipeplan run``)."""

    def __init__(self, inner: nn.Module, cfg: dict[str, Any], device_type: str):
        super().__init__()
        self.inner = inner
        self.cfg = cfg
        self.device_type = device_type

    def forward(self, *args: Any) -> Any:
        with mixed_precision(self.cfg, self.device_type):
            return self.inner(*args)


class Recompute(nn.Module):
    """A stage the plan recomputes: its forward under non-reentrant activation
    checkpointing, so only its inputs stay alive until its backward recomputes the rest.
    The recomputation leaves BatchNorm's running statistics as the forward left them
    (updated once per microbatch, as ``pipeplan run`` does)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self._statistics_kept)

    def _statistics_kept(self) -> tuple[Any, Any]:
        norms = [
            m
            for m in self.inner.modules()
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats
        ]

        @contextlib.contextmanager
        def kept() -> Any:
            saved = [
                (b, b.clone())
                for m in norms
                for b in (m.running_mean, m.running_var, m.num_batches_tracked)
                if b is not None
            ]
            try:
                yield
            finally:
                with torch.no_grad():
                    for buffer, value in saved:
                        buffer.copy_(value)

        return contextlib.nullcontext(), kept()


def recomputed(module: nn.Module, stage: dict[str, Any]) -> nn.Module:
    """``module``, under activation checkpointing where the plan recomputes the stage: one
    checkpoint for the stage, or (``recompute_layers``) one per layer of pipeplan's split,
    as ``pipeplan run`` checkpoints it."""
    if not stage["recompute"]:
        return module
    if stage.get("recompute_layers"):
        if not hasattr(module, "checkpoint_layers"):
            raise SystemExit(
                "train_pipeline.py: this plan checkpoints each layer; use --split pipeplan"
            )
        module.checkpoint_layers = True  # type: ignore[assignment]
        return module
    return Recompute(module)


class Logits(nn.Module):
    """The last stage of a model that returns a Hugging Face ``ModelOutput``: torch's
    PipelineStage passes on tensors only, so it gets the ``.logits`` (what pipeplan's loss
    reads unless ``loss_fn`` takes the whole output, which an export refuses)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        out = self.inner(*args)
        return out.logits if hasattr(out, "logits") else out


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose backward makes the gradient contiguous."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def contiguous_grad(value: Any) -> Any:
    """``value``, with a contiguous gradient if it takes one."""
    if isinstance(value, torch.Tensor) and value.requires_grad:
        return _ContiguousGrad.apply(value)
    return value


class ContiguousInputGrads(nn.Module):
    """A stage after the first: torch's PipelineStage sends each input's gradient as
    autograd made it, and the previous stage allocates its receive buffer with that
    gradient's strides. An input used only through ``torch.cat`` or a view (a skip
    connection that crosses the cut) gets a strided slice of a larger gradient, which
    gloo refuses to send or receive ("input tensor has to be contiguous"). Each input
    that takes a gradient passes an identity whose backward makes it contiguous."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return self.inner(*(contiguous_grad(a) for a in args))


def as_planned(module: nn.Module, stage: int, cfg: dict[str, Any], device_type: str) -> nn.Module:
    """``module`` recomputed where the plan says, under the plan's autocast (outside the
    checkpoint), whichever split made it."""
    module = recomputed(module, cfg["stages"][stage])
    return Autocast(module, cfg, device_type) if cfg["precision"] != "fp32" else module


def stage_module(module: nn.Module, stage: int, cfg: dict[str, Any], device_type: str) -> nn.Module:
    """What a PipelineStage runs for ``stage``: :func:`as_planned`, its input gradients
    contiguous, and the last stage's Hugging Face output reduced to its logits."""
    module = as_planned(module, stage, cfg, device_type)
    if stage > 0:
        module = ContiguousInputGrads(module)
    return Logits(module) if stage == len(cfg["stages"]) - 1 else module


def take(value: Any, rows: list[int], mbs: int) -> Any:
    """The microbatches ``rows`` (each ``mbs`` samples) of a batch, concatenated."""
    if isinstance(value, torch.Tensor):
        return torch.cat([value[k * mbs : (k + 1) * mbs] for k in rows])
    if isinstance(value, dict):
        return {key: take(v, rows, mbs) for key, v in value.items()}
    return type(value)(take(v, rows, mbs) for v in value)


def split_model(
    args: argparse.Namespace, cfg: dict[str, Any], model: nn.Module, sample: Any, mesh: Any
) -> Any:
    """pipeplan's cut of the model into the plan's stages; with tensor parallelism, this
    rank's shard of it on ``mesh["tp"]``, captured and sharded as the profiler did."""
    from planner.export.stages import PipeplanStages  # lazy: --split torch needs no pipeplan

    if cfg["tp_degree"] == 1:
        return PipeplanStages.build(
            model, sample, cfg["stage_layers"], split_at=cfg["split_at"], capture=cfg["capture"]
        )
    from planner.profile.loader import load_model_file
    from planner.profile.tensor_parallel import build_shard

    shard = build_shard(
        load_model_file(args.model or cfg["model"]),
        model,
        [sample],
        mesh["tp"],
        degree=cfg["tp_degree"],
        sequence_parallel=cfg["stages"][0]["sequence_parallel"],
        split_at=cfg["split_at"],
        capture=cfg["capture"],
        names=[name for stage in cfg["stages"] for name in stage["layer_names"]],
    )
    return PipeplanStages.from_split(shard.splits[0], sample, cfg["stage_layers"])


def data_parallel(module: nn.Module, stage: int, cfg: dict[str, Any], mesh: Any) -> nn.Module:
    """``module`` under torch's FSDP2 ``fully_shard`` on ``mesh["dp"]`` where the plan
    shards the stage with fsdp: gradients summed (divide factor 1, the loss is already a
    mean), parameters kept gathered between forward and backward under pipelining
    (torchtitan's default with pp)."""
    if cfg["stages"][stage]["sharding"] != "fsdp":
        return module
    from torch.distributed.fsdp import fully_shard

    sharded = fully_shard(module, mesh=mesh["dp"], reshard_after_forward=cfg["pp_degree"] == 1)
    sharded.set_gradient_divide_factor(1.0)
    if hasattr(sharded, "set_force_sum_reduction_for_comms"):  # where torch has it: a SUM,
        sharded.set_force_sum_reduction_for_comms(True)  # as gloo has no PREMUL_SUM
    return module  # fully_shard changed its class in place


def build_stages(
    args: argparse.Namespace,
    cfg: dict[str, Any],
    model: nn.Module,
    sample: Any,
    local: list[int],
    device: torch.device,
    mesh: Any,
) -> tuple[list[Any], list[nn.Module], Any]:
    """This rank's PipelineStages, their modules, and how to pass a batch to stage 0."""
    num_stages = len(cfg["stages"])
    group = mesh["pp"].get_group()
    if args.split == "torch":  # torch's tracer cuts before each stage's first module
        if cfg["tp_degree"] > 1 or any(s["sharding"] == "fsdp" for s in cfg["stages"]):
            raise SystemExit("train_pipeline.py: --split torch takes no tensor parallelism or fsdp")
        kw = isinstance(sample, dict)
        pipe = pipeline(
            model,
            mb_args=() if kw else tuple(sample),
            mb_kwargs=sample if kw else None,
            split_spec={name: SplitPoint.BEGINNING for name in cfg["split_points"]},
        )
        assert pipe.num_stages == num_stages, f"torch split into {pipe.num_stages} stages"
        built = [pipe.build_stage(s, device, group) for s in local]
        for stage, s in zip(built, local, strict=True):  # torch's split returns tensors
            stage.submod = as_planned(stage.submod, s, cfg, device.type)
        return built, [pipe.get_stage_module(s) for s in local], None
    cut = split_model(args, cfg, model, sample, mesh)
    # Before fully_shard: the earlier stages run whole here (an interleaved rank's own too).
    with mixed_precision(cfg, device.type):  # what the stages will receive, dtypes and all
        example = {s: tuple(v.to(device) for v in cut.example_inputs(s)) for s in local}
    stages = [
        PipelineStage(
            data_parallel(
                stage_module(cut.modules[s].to(device), s, cfg, device.type), s, cfg, mesh
            ),
            s,
            num_stages,
            device,
            input_args=example[s],
            group=group,
        )
        for s in local
    ]
    return stages, [cut.modules[s] for s in local], cut


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the same storage), any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class ZeroOne:
    """ZeRO-1 over a data-parallel group: each parameter belongs to one replica (largest
    first, to the replica with the fewest elements so far, as torch's
    ZeroRedundancyOptimizer partitions), which alone keeps its optimizer state and
    updates it after the gradients are summed, then broadcasts it to the others."""

    def __init__(self, name: str, params: list[nn.Parameter], lr: float | None, group: Any):
        self.params, self.group = params, group
        ranks = dist.get_process_group_ranks(group)
        load = [0] * len(ranks)
        self.owners = [0] * len(params)
        for k in sorted(range(len(params)), key=lambda k: -local_tensor(params[k]).numel()):
            owner = min(range(len(ranks)), key=load.__getitem__)
            self.owners[k], load[owner] = ranks[owner], load[owner] + params[k].numel()
        self.mine = [p for p, o in zip(params, self.owners, strict=True) if o == dist.get_rank()]
        self.inner = make_optimizer(name, self.mine, lr) if self.mine else None

    def step(self) -> None:
        if self.inner is not None:
            self.inner.step()
        with torch.no_grad():
            for p, owner in zip(self.params, self.owners, strict=True):
                dist.broadcast(local_tensor(p), src=owner, group=self.group)

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()


class Optimizers:
    """This rank's optimizers: one over the stages the plan leaves whole or shards with
    fsdp, ZeRO-1 over those it shards with zero1; and the gradient sum over ``mesh["dp"]``
    (the plan's ALLREDUCE: fsdp stages reduce-scatter inside torch's backward instead)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        args: argparse.Namespace,
        local: list[int],
        modules: list[nn.Module],
        mesh: Any,
    ):
        name, lr = args.optimizer or cfg["optimizer"], args.lr or cfg["lr"]
        by_kind: dict[str, list[nn.Parameter]] = {"none": [], "zero1": [], "fsdp": []}
        for s, mod in zip(local, modules, strict=True):
            by_kind[cfg["stages"][s]["sharding"]] += [
                p for p in mod.parameters() if p.requires_grad
            ]
        self.group = mesh["dp"].get_group()
        self.summed = by_kind["none"] + by_kind["zero1"] if cfg["dp_degree"] > 1 else []
        self.params = by_kind["none"] + by_kind["fsdp"] + by_kind["zero1"]
        whole = by_kind["none"] + by_kind["fsdp"]
        self.parts: list[Any] = [make_optimizer(name, whole, lr)] if whole else []
        self.stateful = list(whole)  # the parameters whose optimizer state this rank keeps
        if by_kind["zero1"]:
            zero = ZeroOne(name, by_kind["zero1"], lr, self.group)
            self.parts.append(zero)
            self.stateful += zero.mine

    def held(self) -> str:
        """What this rank holds: its parameters' local elements of their whole, and the
        elements whose optimizer state it keeps."""
        local = sum(local_tensor(p).numel() for p in self.params)
        whole = sum(p.numel() for p in self.params)
        state = sum(local_tensor(p).numel() for p in self.stateful)
        return f"holds {local} of {whole} parameter elements, optimizer state for {state}"

    def step(self) -> None:
        for p in self.summed:  # sum, since the loss is already divided by m
            if p.grad is not None:
                dist.all_reduce(local_tensor(p.grad), group=self.group)
        for part in self.parts:
            part.step()
        for part in self.parts:
            part.zero_grad(set_to_none=False)


def full_parameters(
    model: nn.Module, modules: list[nn.Module], cut: Any
) -> dict[str, torch.Tensor]:
    """Every parameter of this rank's stages, whole (a DTensor's ``full_tensor()``: every
    rank of its mesh takes part), by its name in the model."""
    from torch.distributed.tensor import DTensor

    named = (
        model.named_parameters()
        if cut is not None
        else ((n, p) for mod in modules for n, p in mod.named_parameters())
    )  # torch's split keeps the model's parameter names
    names = {id(p): n for n, p in named}
    out = {}
    for mod in modules:
        for p in mod.parameters():
            whole = p.full_tensor() if isinstance(p, DTensor) else p
            out[names[id(p)]] = whole.detach().cpu()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--model", default=None, help="model file (default: pipeline.json's)")
    ap.add_argument("--split", choices=("pipeplan", "torch"), default="pipeplan")
    ap.add_argument(
        "--csv",
        choices=("comms", "compute"),
        default="comms",
        help="comms: the plan's compute and communication order (schedule.csv); compute: "
        "F/B/I/W only, torch adds the communication (schedule_compute.csv, as torchtitan)",
    )
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--optimizer", default=None, help="adam, adamw, sgd, momentum")
    ap.add_argument("--save-params", default=None, help="write PATH.rankN.pt at the end")
    args = ap.parse_args()
    cfg = json.loads((HERE / "pipeline.json").read_text())
    if args.split == "torch" and any(s.get("recompute_layers") for s in cfg["stages"]):
        # Every rank refuses, before any of them waits for the others.
        raise SystemExit(
            "train_pipeline.py: this plan checkpoints each layer; use --split pipeplan"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    pp, dp, tp = cfg["mesh"]["shape"]
    assert world == pp * dp * tp, f"start {pp * dp * tp} processes (pp {pp} x dp {dp} x tp {tp})"
    coords = cfg["mesh"]["ranks"][rank]
    replica, pp_rank, member = coords["dp"], coords["pp"], coords["tp"]
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    mesh = init_device_mesh(
        device.type, (pp, dp, tp), mesh_dim_names=tuple(cfg["mesh"]["dim_names"])
    )
    assert list(mesh.get_coordinate() or ()) == [pp_rank, replica, member], "pipeline.json's mesh"

    user = load_module(args.model or cfg["model"])
    torch.manual_seed(0)  # pipeplan's seed: the same initial weights on every rank
    model = user.build_model().to(device)
    model.train()
    mbs, m, m_local = cfg["microbatch_size"], cfg["num_microbatches"], cfg["microbatches_local"]
    sample = on_device(as_inputs(user.sample_batch(mbs)[0]), device)
    local = [s for s, r in enumerate(cfg["stage_to_rank"]) if r == pp_rank]
    stages, modules, cut = build_stages(args, cfg, model, sample, local, device, mesh)
    user_loss = getattr(user, "loss_fn", None) or default_loss
    if wants_whole_output(user_loss):  # the last stage gives torch its .logits (Logits)
        raise SystemExit("train_pipeline.py: loss_fn takes the whole ModelOutput; give it logits")

    def loss_fn(outputs: Any, targets: Any) -> torch.Tensor:
        # Mean over all microbatches of all replicas: scale here, not in torch (scale_grads).
        with mixed_precision(cfg, device.type):
            loss = user_loss(outputs, targets)
        return loss / m

    schedule = _PipelineScheduleRuntime(stages, m_local, loss_fn=loss_fn, scale_grads=False)
    if args.csv == "comms":
        schedule._load_csv(str(HERE / cfg["schedule_csv"][replica]), format="compute_comms")
    else:
        schedule._load_csv(str(HERE / cfg["schedule_compute_csv"][replica]))
    optimizer = Optimizers(cfg, args, local, modules, mesh)
    print(f"rank {rank} (pp {pp_rank}, dp {replica}, tp {member}): {optimizer.held()}", flush=True)
    first, last = 0 in local, len(cfg["stages"]) - 1 in local
    mine = [k for k in range(m) if k % dp == replica]  # this replica's microbatches
    for step in range(args.steps):
        torch.manual_seed(step)
        inputs, targets = user.sample_batch(mbs * m)
        x: Any = take(as_inputs(inputs), mine, mbs)
        kwargs: dict[str, Any] = {}
        if first and cut is not None:
            x = cut.flat_inputs(x)
        elif first and isinstance(x, dict):
            kwargs, x = x, ()
        losses: list[torch.Tensor] = []
        extra: dict[str, Any] = {"target": take(targets, mine, mbs).to(device)} if last else {}
        pos = [v.to(device) for v in x] if first else []
        schedule.step(*pos, **{k: v.to(device) for k, v in kwargs.items()}, **extra, losses=losses)
        optimizer.step()
        if last:
            loss = torch.stack(losses).sum().detach()
            if dp > 1:
                dist.all_reduce(loss, group=mesh["dp"].get_group())
            if replica == 0 and member == 0:
                print(f"step {step}: loss {loss.item():.9g}", flush=True)
    if args.save_params:
        params = full_parameters(model, modules, cut)  # collectives: every rank takes part
        if replica == 0 and member == 0:
            torch.save(params, f"{args.save_params}.rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
