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
from dataclasses import dataclass

import torch

from planner.precision import autocast
from planner.profile.export_graph import call_for_training
from planner.profile.loader import load_model_file
from planner.runtime.optimizer import make_optimizer

__all__ = ["ReferenceRun", "train_single_process"]


@dataclass
class ReferenceRun:
    """Losses per step and the parameters after the last step (by ``named_parameters``)."""

    losses: list[float]
    parameters: dict[str, torch.Tensor]


def train_single_process(
    model_path: str | os.PathLike[str],
    *,
    steps: int,
    batch_size: int,
    optimizer: str = "sgd",
    lr: float | None = None,
    precision: str = "fp32",
) -> ReferenceRun:
    """Train ``steps`` steps of ``batch_size`` samples in this process (see the module);
    ``precision`` bf16 or fp16 runs the forward and loss under CPU autocast.

    Example::

        ref = train_single_process("examples/gpt.py", steps=2, batch_size=8, optimizer="adam")
    """
    user = load_model_file(model_path)
    torch.manual_seed(0)  # the profiler's and the runtime's seed
    model = user.build()
    model.train()
    opt = make_optimizer(optimizer, model.parameters(), lr)
    losses: list[float] = []
    for step in range(steps):
        torch.manual_seed(step)
        inputs, targets = user.batch(batch_size)
        opt.zero_grad(set_to_none=False)
        with autocast("cpu", precision):  # as the stages do (planner.precision)
            loss = user.loss(call_for_training(model, inputs), targets)
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
    final = {name: p.detach().clone() for name, p in model.named_parameters()}
    return ReferenceRun(losses, final)
