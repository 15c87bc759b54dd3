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
models whose stages talk to their neighbours only.
"""

from __future__ import annotations

import argparse
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


class Recompute(nn.Module):
    """A stage the plan recomputes: its forward under non-reentrant activation
    checkpointing, so only its inputs stay alive until its backward recomputes the rest."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *args, use_reentrant=False)


def recomputed(module: nn.Module, recompute: bool) -> nn.Module:
    """``module``, under activation checkpointing where the plan recomputes the stage."""
    return Recompute(module) if recompute else module


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


def stage_module(module: nn.Module, stage: int, cfg: dict[str, Any]) -> nn.Module:
    """What a PipelineStage runs for ``stage``: recomputed where the plan says, its input
    gradients contiguous, and the last stage's Hugging Face output reduced to its logits."""
    module = recomputed(module, cfg["stages"][stage]["recompute"])
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


def build_stages(
    args: argparse.Namespace,
    cfg: dict[str, Any],
    model: nn.Module,
    sample: Any,
    local: list[int],
    device: torch.device,
    group: Any,
) -> tuple[list[Any], list[nn.Module], Any]:
    """This rank's PipelineStages, their modules, and how to pass a batch to stage 0."""
    num_stages = len(cfg["stages"])
    if args.split == "torch":  # torch's tracer cuts before each stage's first module
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
            stage.submod = recomputed(stage.submod, cfg["stages"][s]["recompute"])
        return built, [pipe.get_stage_module(s) for s in local], None
    from planner.export.stages import PipeplanStages  # lazy: --split torch needs no pipeplan

    cut = PipeplanStages.build(
        model, sample, cfg["stage_layers"], split_at=cfg["split_at"], capture=cfg["capture"]
    )
    stages = [
        PipelineStage(
            stage_module(cut.modules[s].to(device), s, cfg),
            s,
            num_stages,
            device,
            input_args=tuple(v.to(device) for v in cut.example_inputs(s)),
            group=group,
        )
        for s in local
    ]
    return stages, [cut.modules[s] for s in local], cut


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
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    pp, dp = cfg["pp_degree"], cfg["dp_degree"]
    assert world == pp * dp, f"start {pp * dp} processes (pipeline {pp} x data-parallel {dp})"
    replica, pp_rank = divmod(rank, pp)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    pp_groups = [dist.new_group(list(range(j * pp, (j + 1) * pp))) for j in range(dp)]
    dp_groups = [dist.new_group([j * pp + r for j in range(dp)]) for r in range(pp)]

    user = load_module(args.model or cfg["model"])
    torch.manual_seed(0)  # pipeplan's seed: the same initial weights on every rank
    model = user.build_model().to(device)
    model.train()
    mbs, m, m_local = cfg["microbatch_size"], cfg["num_microbatches"], cfg["microbatches_local"]
    sample = as_inputs(user.sample_batch(mbs)[0])
    local = [s for s, r in enumerate(cfg["stage_to_rank"]) if r == pp_rank]
    stages, modules, cut = build_stages(args, cfg, model, sample, local, device, pp_groups[replica])
    user_loss = getattr(user, "loss_fn", None) or default_loss
    if wants_whole_output(user_loss):  # the last stage gives torch its .logits (Logits)
        raise SystemExit("train_pipeline.py: loss_fn takes the whole ModelOutput; give it logits")

    def loss_fn(outputs: Any, targets: Any) -> torch.Tensor:
        # Mean over all microbatches of all replicas: scale here, not in torch (scale_grads).
        return user_loss(outputs, targets) / m

    schedule = _PipelineScheduleRuntime(stages, m_local, loss_fn=loss_fn, scale_grads=False)
    if args.csv == "comms":
        schedule._load_csv(str(HERE / cfg["schedule_csv"][replica]), format="compute_comms")
    else:
        schedule._load_csv(str(HERE / cfg["schedule_compute_csv"][replica]))
    params = [p for mod in modules for p in mod.parameters() if p.requires_grad]
    optimizer = make_optimizer(args.optimizer or cfg["optimizer"], params, args.lr or cfg["lr"])
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
        if dp > 1:  # the plan's ALLREDUCE: sum, since the loss is already divided by m
            for p in params:
                dist.all_reduce(p.grad, group=dp_groups[pp_rank])
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        if last:
            loss = torch.stack(losses).sum().detach()
            if dp > 1:
                dist.all_reduce(loss, group=dp_groups[pp_rank])
            if replica == 0:
                print(f"step {step}: loss {loss.item():.9g}", flush=True)
    if args.save_params and replica == 0:
        names = {id(p): n for n, p in model.named_parameters()}
        if cut is None:  # torch's split keeps the model's parameter names
            names = {id(p): n for mod in modules for n, p in mod.named_parameters()}
        torch.save(
            {names[id(p)]: p.detach().cpu() for p in params}, f"{args.save_params}.rank{rank}.pt"
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
