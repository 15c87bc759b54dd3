"""A stage's data-parallel gradient sync and its step: plain, ZeRO-1 or FSDP.

At ``ALLREDUCE s`` the replicas of stage ``s`` combine their gradients, at ``STEP s`` each
steps its optimizer; member ``i`` of a tensor-parallel group does both on ring ``i`` (member
``i`` of every replica, :mod:`planner.runtime.mesh`) with its own shard's tensors. The
gradients are summed (each loss is divided by the iteration's microbatches), so a run
equals one process:

* **none** (:class:`ReplicaSync`): one flattened all-reduce of the local gradients (a
  ``DTensor``'s local part; a sequence-parallel norm's gradient stays ``Partial`` over the
  tensor-parallel group, which the optimizer reduces when it reads it, as torch does);
* **zero1** (:class:`ZeroOne`, ZeRO stage 1 on torch's collectives): the flattened local
  gradients are reduce-scattered (``reduce_scatter_single``), each replica steps its
  optimizer on its ``1 / r`` of the flattened weights (so it holds ``1 / r`` of the state),
  and the updated weights are all-gathered (``all_gather_single``) into every replica's
  tensors. Exact for the element-wise optimizers pipeplan runs (Adam, AdamW, SGD,
  momentum): each element's update reads only that element. ``Partial`` gradients are
  reduced over the tensor-parallel group first (the step reads plain tensors);
* **fsdp** (:class:`FsdpSync`, torch's FSDP2 ``fully_shard`` over the stage's ``dp`` mesh,
  one unit per stage): as ``torch.distributed.pipelining`` runs it, gradient sync and
  resharding only on each replica's last backward of the iteration, weights kept whole
  after the forward (``reshard_after_forward=False``, torchtitan's choice under PP), summed
  rather than averaged (``set_gradient_divide_factor(1.0)``, sum-only collectives), so
  ``ALLREDUCE`` has nothing left to do and ``STEP`` steps the sharded weights.

Example::

    sync, stepper = stage_sync(spec, module, held, optimizer="adam", lr=None,
                               last_backward=7, step=PlainStep)
    pending = sync.launch(params, threaded=False)   # at ALLREDUCE
    sync.finish(pending, params)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from planner.optimizers import make_optimizer
from planner.runtime.comm import Pending

if TYPE_CHECKING:
    from planner.runtime.mesh import StageMesh
    from planner.stages import StageSpec

__all__ = [
    "FsdpSync",
    "ReplicaSync",
    "ZeroOne",
    "full_tensor",
    "fully_shard_stage",
    "local_tensor",
    "stage_sync",
]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a ``DTensor``'s local part (sharing its storage), any
    other tensor itself.

    Example::

        local_tensor(p.grad).zero_()
    """
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s whole value (a collective over its mesh: every rank holding it calls
    this, in one order); any other tensor itself. torch's note that an FSDP-and-TP
    parameter gathers in two steps (a performance remark, once per parameter) is kept off
    the run's output.

    Example::

        full_tensor(p).to("cpu")
    """
    import logging

    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    log = logging.getLogger("torch.distributed.tensor._redistribute")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return t.full_tensor()
    finally:
        log.setLevel(level)


def _grads(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's gradient (zeros in its layout where none flowed)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for p in params]  # type: ignore[misc]


class ReplicaSync:
    """Plain data parallelism: one flattened all-reduce (sum) of the local gradients."""

    def __init__(self, group: Any):
        self.group = group

    def launch(self, params: Sequence[torch.Tensor], *, threaded: bool) -> Pending:
        """Start the all-reduce of ``params``' gradients.

        Example::

            pending = ReplicaSync(group).launch(params, threaded=False)
        """
        import torch.distributed as dist

        flat = torch.cat([local_tensor(g).reshape(-1) for g in _grads(params)])
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        return Pending([work], [flat], threaded=threaded)

    def finish(self, pending: Pending, params: Sequence[torch.Tensor]) -> None:
        """Wait, then write the sums back into the gradients.

        Example::

            sync.finish(pending, params)   # each p.grad now the replicas' sum
        """
        pending.wait()
        _unflatten(pending.buffers[0], [p.grad for p in params])  # type: ignore[misc]


def _unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    with torch.no_grad():
        for t in tensors:
            part = local_tensor(t)
            n = part.numel()
            part.copy_(flat[offset : offset + n].view_as(part))
            offset += n


def _replicated_local(g: torch.Tensor) -> torch.Tensor:
    """A gradient's local part with any ``Partial`` placement reduced (an all-reduce over
    its tensor-parallel group); other gradients' local parts as they are."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(g, DTensor) or not any(p.is_partial() for p in g.placements):
        return local_tensor(g)
    placements = [Replicate() if p.is_partial() else p for p in g.placements]
    return g.redistribute(g.device_mesh, placements).to_local()


class ZeroOne:
    """ZeRO-1 on a stage's ring (module docstring): the sync at ``ALLREDUCE`` and the
    stepper at ``STEP`` in one object."""

    def __init__(self, params: Sequence[torch.Tensor], group: Any, optimizer: str, lr: Any):
        import torch.distributed as dist

        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.replicas = dist.get_world_size(group)
        index = dist.get_rank(group)
        with torch.no_grad():
            flat = self._padded([local_tensor(p).reshape(-1) for p in self.params])
            self.size = flat.numel() // self.replicas
            part = flat[index * self.size : (index + 1) * self.size]
        self.shard = part.detach().clone().requires_grad_(True)
        self.optimizer = make_optimizer(optimizer, [self.shard], lr)

    def _padded(self, parts: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat(parts)
        pad = -flat.numel() % self.replicas
        return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat

    def launch(self, params: Sequence[torch.Tensor], *, threaded: bool) -> Pending:
        """Start the reduce-scatter of the gradients (this replica keeps its part).

        Example::

            pending = zero.launch(params, threaded=False)
        """
        import torch.distributed as dist

        with torch.no_grad():
            flat = self._padded([_replicated_local(g).reshape(-1) for g in _grads(params)])
        out = flat.new_empty(self.size)
        scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)  # older torch
        work = scatter(out, flat, group=self.group, async_op=True)
        return Pending([work], [out, flat], threaded=threaded)

    def finish(self, pending: Pending, params: Sequence[torch.Tensor]) -> None:
        """Wait; the summed part is what this replica's step reads.

        Example::

            zero.finish(pending, params); zero.step()
        """
        pending.wait()
        self.shard.grad = pending.buffers[0]

    def step(self, iteration: int = 0) -> None:
        """Step this replica's part, all-gather the weights, clear the gradients.

        Example::

            zero.step()   # every replica's tensors hold the updated weights
        """
        import torch.distributed as dist

        self.optimizer.step()
        with torch.no_grad():
            whole = self.shard.new_empty(self.size * self.replicas)
            gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
            gather(whole, self.shard.detach(), group=self.group)
            _unflatten(whole, self.params)
        self.skip(iteration)

    def skip(self, iteration: int = 0) -> None:
        """Clear the gradients (the buffers kept, in their layouts).

        Example::

            zero.skip()   # fp16 overflow: no step, gradients zeroed
        """
        self.shard.grad = None
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    local_tensor(p.grad).zero_()


class FsdpSync:
    """FSDP2 over the stage's ``dp`` mesh (module docstring): gradients are reduce-scattered
    inside the replica's last backward of an iteration, so ``ALLREDUCE`` waits for nothing.
    :meth:`before_backward` tells FSDP which backward that is."""

    def __init__(self, module: Any, last_backward: int):
        self.module = module
        self.last_backward = last_backward

    def before_backward(self, microbatch: int) -> None:
        """Sync and reshard only on the last backward (the others accumulate whole
        gradients), as torch.distributed.pipelining's stages do.

        Example::

            FsdpSync(module, last_backward=3).before_backward(3)   # this one syncs
        """
        last = microbatch == self.last_backward
        self.module.set_requires_gradient_sync(last)
        self.module.set_reshard_after_backward(last)

    def launch(self, params: Sequence[torch.Tensor], *, threaded: bool) -> None:
        """Nothing to start: the last backward reduce-scattered the gradients."""
        return None

    def finish(self, pending: Any, params: Sequence[torch.Tensor]) -> None:
        """Nothing to wait for."""
        return None


def fully_shard_stage(module: torch.nn.Module, held: StageMesh) -> Any:
    """``module`` sharded by FSDP2 over ``held``'s ``dp`` mesh, one unit, summing gradients.

    Example::

        module = fully_shard_stage(split.stage(0, 3), meshes[0])
    """
    from torch.distributed.fsdp import fully_shard

    sharded = fully_shard(module, mesh=held.dp_mesh, reshard_after_forward=False)
    sharded.set_gradient_divide_factor(1.0)  # sum, as the replicas' all-reduce does
    sharded.set_force_sum_reduction_for_comms(True)  # gloo has no AVG or PREMUL_SUM
    return sharded


def stage_sync(
    spec: StageSpec,
    module: torch.nn.Module,
    held: StageMesh,
    *,
    optimizer: str,
    lr: float | None,
    last_backward: int,
    step: Callable[..., Any],
) -> tuple[Any, Any]:
    """``(sync, stepper)`` of a stage this rank holds: what ``ALLREDUCE`` runs (None
    without replicas) and what ``STEP`` runs (``step(params, optimizer, lr)``, or ZeRO-1's
    own). ``module`` is already FSDP-sharded for ``fsdp``.

    Example::

        sync, stepper = stage_sync(spec, module, held, optimizer="sgd", lr=0.1,
                                   last_backward=7, step=PlainStep)
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if spec.sharding == "zero1":
        zero = ZeroOne(params, held.dp_group, optimizer, lr)
        return zero, zero
    stepper = step(params, optimizer, lr)
    if spec.sharding == "fsdp":
        return FsdpSync(module, last_backward), stepper
    return (ReplicaSync(held.dp_group) if held.dp_group is not None else None), stepper
