"""fp16 loss scaling that every stage agrees on: ``torch.amp.GradScaler``'s rule, collective.

fp16 gradients underflow, so the last stage seeds its backward with ``loss * scale`` and
every gradient upstream is scaled by the same factor. Before the optimizer steps, each
gradient is multiplied by ``1 / scale`` and checked for inf/NaN; if any gradient anywhere
overflowed, *every* stage skips the step and the scale backs off, otherwise it grows after
``growth_interval`` clean steps. This is exactly what ``torch.amp.GradScaler`` does in one
process (the same two kernels, ``torch._amp_foreach_non_finite_check_and_unscale_`` and
``torch._amp_update_scale_``, with GradScaler's defaults); the only addition is that the
overflow flag is all-reduced (MAX) over every rank before anyone uses it, as FSDP's
``ShardedGradScaler`` and Megatron-LM do, so no stage steps while another skips.

The runtime unscales (:meth:`AgreedLossScaler.unscale`), all-reduces the flag and settles
(:meth:`AgreedLossScaler.settle`) once per iteration and process, when every local
stage's gradient is complete (the worker moves each device's
STEPs after its backward work: :func:`planner.schedule.tied.defer_tied_steps`), then
steps or skips every local stage as it says. A single-process ``GradScaler`` loop with
gradient accumulation over the same microbatches gives the same scale, the same skipped
steps and the same parameters (tests/test_precision.py).

Example::

    scaler = AgreedLossScaler(torch.device("cpu"), group=None)
    (scaler.scale(loss) / num_microbatches).backward()     # last stage, per microbatch
    if not scaler.unscale_and_agree(grads):                # every rank, once per iteration
        optimizer.step()                                   # (the scale is updated too)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["AgreedLossScaler"]


class AgreedLossScaler:
    """Dynamic loss scaling whose overflow decision is the same on every rank.

    The defaults are ``torch.amp.GradScaler``'s: initial scale ``2**16``, growth factor 2
    every 2000 steps without an overflow, backoff 0.5 on an overflow. ``group`` is the
    process group that must agree (``None``: the default group; a group of one process,
    or no initialised group, needs no collective).
    """

    def __init__(
        self,
        device: torch.device,
        group: Any = None,
        *,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ):
        self.device = device
        self.group = group
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self._scale = torch.full((), init_scale, dtype=torch.float32, device=device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.skipped: list[bool] = []  # per update: whether that iteration's step was skipped

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current scale (the seed of the last stage's backward).

        Example::

            seed = scaler.scale(loss) / num_microbatches
        """
        return loss * self._scale  # as GradScaler.scale: no cast

    def get_scale(self) -> float:
        """The current scale as a number (synchronises with the device)."""
        return float(self._scale)

    def unscale(self, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """Unscale ``grads`` in place; return this rank's overflow flag (0 or 1, a tensor
        on the scaler's device) for the caller to all-reduce with MAX over every rank.

        Example::

            found = scaler.unscale([p.grad for p in params if p.grad is not None])
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        """
        found = torch.zeros((), dtype=torch.float32, device=self.device)
        inv_scale = self._scale.double().reciprocal().float()  # as GradScaler.unscale_
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        with torch.no_grad():
            for tensors in by_dtype.values():
                torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, inv_scale)
        return found

    def settle(self, agreed: torch.Tensor) -> bool:
        """Take the all-reduced overflow flag: update the scale as ``GradScaler.update``
        does (back off after an overflow, grow after ``growth_interval`` clean steps) and
        return whether this iteration's step is skipped (the same answer on every rank).

        Example::

            if not scaler.settle(found):
                optimizer.step()
        """
        skip = bool(agreed.item() > 0)
        torch._amp_update_scale_(
            self._scale,
            self._growth_tracker,
            agreed,
            self.growth_factor,
            self.backoff_factor,
            self.growth_interval,
        )
        self.skipped.append(skip)
        return skip

    def unscale_and_agree(self, grads: Sequence[torch.Tensor]) -> bool:
        """:meth:`unscale`, a blocking all-reduce (MAX) over ``group``, then :meth:`settle`.

        Example::

            if not scaler.unscale_and_agree(grads):
                optimizer.step()
        """
        found = self.unscale(grads)
        if _needs_collective(self.group):
            import torch.distributed as dist

            dist.all_reduce(found, op=dist.ReduceOp.MAX, group=self.group)
        return self.settle(found)


def _needs_collective(group: Any) -> bool:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return False
    return bool(dist.get_world_size(group) > 1)
