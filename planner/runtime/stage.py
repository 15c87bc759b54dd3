"""One pipeline stage at run time: forward, backward (whole or in zero-bubble halves).

The module is :meth:`planner.profile.split.SplitModel.stage` - the very code the profiler
timed. Per microbatch the stage keeps what its backward needs: the input leaves, the
outputs, and between ``I`` and ``W`` the zero-bubble parameter groups. Recompute stages
run their forward under non-reentrant activation checkpointing, so only the stage inputs
stay alive until the backward recomputes the rest; with ``recompute_layers`` each layer
has its own checkpoint (only the layers' inputs stay alive, one layer is rebuilt at a
time), as :func:`planner.cost.stage_memory_bytes` counts it.

The last stage's forward also computes the loss, scaled by ``1 / num_microbatches`` so
that the gradients summed over microbatches (and replicas) equal full-batch training; in
fp16 its backward starts from that times the loss scale
(:class:`~planner.runtime.loss_scale.AgreedLossScaler`).

Example::

    stage = StageRuntime(split.stage(0, 3), stage_id=0, is_last=False, recompute=False,
                         num_microbatches=8, loss=None)
    out = stage.forward(0, inputs)            # detached outputs to hand on
    grads_in = stage.backward(0, grads_out)   # gradients of the stage inputs
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.runtime.split_backward import WeightHalf, input_half, weight_half
from planner.tensors import leaf

__all__ = ["StageRuntime"]


@dataclass
class _Saved:
    leaves: list[Any]  # the stage inputs as given to the module
    roots: list[torch.Tensor]  # outputs (or the loss) the backward starts from
    root_index: list[int]  # position of each root among the outputs (-1: the loss)
    groups: WeightHalf | None = None  # zero-bubble: what W needs from I
    params: list[torch.Tensor] = field(default_factory=list)  # the weights it computed with
    extra: dict[str, Any] = field(default_factory=dict)


class StageRuntime:
    """A stage module plus the per-microbatch state its backward needs."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        stage_id: int,
        is_last: bool,
        recompute: bool,
        num_microbatches: int,
        loss: Callable[[Any, Any], torch.Tensor] | None,
        weights: Callable[[int], list[torch.Tensor]] | None = None,
        autocast: Callable[[], AbstractContextManager[Any]] | None = None,
        scale_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
        before_backward: Callable[[int], None] | None = None,
        recompute_layers: bool = False,
    ):
        self.module = module
        self.stage_id = stage_id
        self.is_last = is_last
        self.recompute = recompute
        self.num_microbatches = num_microbatches
        self.loss = loss
        self.params: list[torch.Tensor] = [p for p in module.parameters() if p.requires_grad]
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        # Versioned weights (2bw without a flush): iteration -> the tensors it computes with.
        self.weights = weights
        # Mixed precision: the forward and the loss under torch.autocast (planner.precision).
        self.autocast = autocast or contextlib.nullcontext
        # fp16: the backward of the last stage starts from the loss times the loss scale.
        self.scale_loss = scale_loss
        # FSDP: told which microbatch's backward runs next (it syncs on the last one).
        self.before_backward = before_backward
        self.saved: dict[int, _Saved] = {}
        # Each layer checkpointed on its own: inside the module's own call (so FSDP's and
        # TP's hooks run around it), or per layer with the iteration's weights (2bw).
        self.each_layer = recompute and recompute_layers
        if self.each_layer and not hasattr(module, "checkpoint_layers"):
            raise ValueError("recompute_layers needs a split Stage (its .layers)")
        if self.each_layer and weights is None:
            module.checkpoint_layers = True  # type: ignore[assignment]

    def params_for(self, iteration: int) -> list[torch.Tensor]:
        """The weights iteration ``iteration`` computes with (and accumulates gradients in).

        Example::

            grads = [p.grad for p in stage.params_for(0)]
        """
        return self.params if self.weights is None else self.weights(iteration)

    def _call(self, params: list[torch.Tensor], leaves: list[Any]) -> Any:
        if self.weights is None:
            return self.module(*leaves)
        from torch.func import functional_call

        return functional_call(
            self.module, dict(zip(self.names, params, strict=True)), tuple(leaves)
        )

    def _each_layer_checkpointed(self, params: list[torch.Tensor], leaves: list[Any]) -> Any:
        """Versioned weights (2bw) with each layer checkpointed: every layer under its
        own checkpoint, called with the iteration's weights so its rebuild uses them too."""
        from torch.func import functional_call

        from planner.profile.split import checkpoint_once

        index = {id(p): i for i, p in enumerate(self.params)}
        values: Any = tuple(leaves)
        stage: Any = self.module  # a split Stage (checked in __init__)
        for layer in stage.layers:
            own = {
                name: params[index[id(p)]]
                for name, p in layer.named_parameters(remove_duplicate=False)
                if id(p) in index
            }

            def run(*xs: Any, layer: Any = layer, own: dict[str, Any] = own) -> Any:
                return functional_call(layer, own, xs)

            values = checkpoint_once(run, layer, *values)
        return values

    def forward(self, k: int, inputs: Sequence[Any], targets: Any = None) -> Any:
        """Run microbatch ``k``; returns detached outputs, or the unscaled loss (last stage).

        ``inputs`` of a stage after the first are leaves made here, so the backward can
        return their gradients.
        """
        leaves = [leaf(v) for v in inputs] if self.stage_id > 0 else list(inputs)
        params = self.params_for(k // self.num_microbatches)
        with self.autocast():  # checkpoint's recompute restores this autocast state
            if self.each_layer and self.weights is not None:
                out = self._each_layer_checkpointed(params, leaves)
            elif self.recompute and not self.each_layer:
                from planner.profile.split import checkpoint_once

                def run(*xs: Any) -> Any:
                    return self._call(params, list(xs))

                out = checkpoint_once(run, self.module, *leaves)
            else:  # no recompute, or each layer checkpointed by the module (see __init__)
                out = self._call(params, leaves)
            if self.is_last and self.loss is not None:
                loss = self.loss(out, targets)
        if self.is_last:
            if self.loss is None:  # pragma: no cover - the worker always passes one
                raise RuntimeError("the last stage needs a loss function")
            seed = loss / self.num_microbatches
            if self.scale_loss is not None:
                seed = self.scale_loss(seed)
            self.saved[k] = _Saved(leaves, [seed], [-1], params=params)
            return loss.detach()
        values = tuple(out)
        roots, index = [], []
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor) and v.requires_grad:
                roots.append(v)
                index.append(i)
        self.saved[k] = _Saved(leaves, roots, index, params=params)
        return tuple(v.detach() if isinstance(v, torch.Tensor) else v for v in values)

    def backward(self, k: int, grads: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
        """The whole backward of microbatch ``k``; gradients of its floating-point inputs.

        ``grads`` holds one gradient per output position (None for the last stage).
        """
        saved = self.saved.pop(k)
        if self.before_backward is not None:
            self.before_backward(k)
        if saved.roots:
            torch.autograd.backward(saved.roots, self._root_grads(saved, grads))
        return self._input_grads(saved)

    def backward_input(self, k: int, grads: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
        """Zero-bubble ``I``: gradients of the inputs only; ``W`` finishes the weights.

        Uses torch.distributed.pipelining's split backward (as the profiler did), as
        :mod:`planner.runtime.split_backward` makes it exact for shared weights. A stage
        without input gradients (the first) or a recompute stage does its whole backward
        here, and its ``W`` has nothing left to do.
        """
        saved = self.saved[k]
        wants = [v for v in saved.leaves if isinstance(v, torch.Tensor) and v.requires_grad]
        if not saved.roots:
            del self.saved[k]
            return self._input_grads(saved)
        root_grads = self._root_grads(saved, grads)
        if not wants or not saved.params or self.recompute:
            torch.autograd.backward(saved.roots, root_grads)
            del self.saved[k]
            return self._input_grads(saved)
        saved.groups = input_half(
            saved.roots, None if self.is_last else root_grads, wants, saved.params
        )
        return self._input_grads(saved)

    def backward_weight(self, k: int) -> None:
        """Zero-bubble ``W``: the parameter gradients of microbatch ``k`` (after its I)."""
        saved = self.saved.pop(k, None)
        if saved is None or saved.groups is None:
            return
        weight_half(saved.params, saved.groups)

    def _root_grads(self, saved: _Saved, grads: Sequence[torch.Tensor] | None) -> Any:
        if self.is_last:
            return None
        assert grads is not None
        return [grads[i] for i in saved.root_index]

    def _input_grads(self, saved: _Saved) -> list[torch.Tensor]:
        """Gradients of the floating-point inputs (zeros where none flowed)."""
        out: list[torch.Tensor] = []
        if self.stage_id == 0:  # the model's inputs: nothing to send back
            return out
        for v in saved.leaves:
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                out.append(v.grad if v.grad is not None else torch.zeros_like(v))
        return out
