"""Single-process training: what every ``pipeplan run`` must reproduce.

The runtime's promise is that a plan trains exactly like one process taking the same
global batches: step ``s`` seeds torch with ``s``, draws ``sample_batch(microbatch_size *
num_microbatches)`` and takes one optimizer step on the loss of the whole batch. This
module is that one process, so tests, ``python -m bench --only models`` and users can put
a run's losses and parameters beside it.

Example::

    ref = train_single_process("examples/hf_llama.py", steps=3, batch_size=8, lr=0.05)
    ref.losses, ref.parameters["lm_head.weight"]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from planner.optimizers import make_optimizer
from planner.precision import autocast
from planner.profile.export_graph import call_for_training
from planner.profile.loader import load_model_file
from planner.tensors import slice_batch, to_device

__all__ = ["ReferenceRun", "train_single_process"]


@dataclass
class ReferenceRun:
    """Losses per step and the parameters after the last step (by ``named_parameters``);
    with fp16, which steps the loss scaler skipped."""

    losses: list[float]
    parameters: dict[str, torch.Tensor]
    skipped: list[bool] = field(default_factory=list)


def train_single_process(
    model_path: str | os.PathLike[str],
    *,
    steps: int,
    batch_size: int,
    optimizer: str = "sgd",
    lr: float | None = None,
    precision: str = "fp32",
    microbatch_size: int | None = None,
    device: str = "cpu",
) -> ReferenceRun:
    """Train ``steps`` steps of ``batch_size`` samples in this process (see the module).

    ``precision`` bf16 or fp16 runs the forward and the loss under autocast; fp16 scales
    the loss with ``torch.amp.GradScaler`` (its defaults). ``microbatch_size`` accumulates
    the gradient over microbatches of that size (each loss divided by their number), as a
    plain loop with gradient accumulation does; a pipeline computes exactly that, which in
    bf16 and fp16 rounds differently from one pass over the whole batch.

    Example::

        ref = train_single_process("examples/gpt.py", steps=2, batch_size=8, optimizer="adam")
    """
    user = load_model_file(model_path)
    torch.manual_seed(0)  # the profiler's and the runtime's seed
    model = user.build().to(device)
    model.train()
    opt = make_optimizer(optimizer, model.parameters(), lr)
    scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
    mbs = microbatch_size or batch_size
    if batch_size % mbs:
        raise ValueError(f"batch_size {batch_size} is not a multiple of {mbs}")
    run = ReferenceRun([], {})
    for step in range(steps):
        torch.manual_seed(step)
        inputs, targets = user.batch(batch_size)
        opt.zero_grad(set_to_none=False)
        parts = [
            (slice_batch(inputs, lo, lo + mbs), slice_batch(targets, lo, lo + mbs))
            for lo in range(0, batch_size, mbs)
        ]
        total = 0.0
        for x, y in parts:
            with autocast(device, precision):  # as the stages do (planner.precision)
                loss = user.loss(
                    call_for_training(model, to_device(x, device)), to_device(y, device)
                )
            seed = loss / len(parts)
            (scaler.scale(seed) if scaler is not None else seed).backward()
            total += float(loss.detach())
        run.losses.append(total / len(parts))
        if scaler is None:
            opt.step()
            continue
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        run.skipped.append(scaler.get_scale() < before)
    run.parameters = {name: p.detach().to("cpu").clone() for name, p in model.named_parameters()}
    return run
