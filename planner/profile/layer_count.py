"""Counting one layer on fake tensors: the forward, the whole backward and its input half.

The same passes as the measured profiler runs (planner/profile/measure.py), each under an
:class:`~planner.profile.roofline.OpCounter` instead of a clock:

- **forward**: the layer (and the loss, for the last layer) on detached copies of the
  values entering it, floating ones requiring grad, under the profile's autocast; the
  tensors autograd saves for the backward are seen by saved-tensor hooks (distinct
  storages, parameters and buffers excluded), as the measured profile counts them;
- **input half**: ``torch.autograd.grad`` with respect to the layer's floating inputs
  only: autograd runs just what the input gradients need;
- **whole backward**: gradients of the inputs and of the parameters, the latter added into
  existing ``.grad`` tensors as during training (gradient accumulation);
- **weight half** = whole - input half, so the halves add up to the whole backward exactly
  (zero-bubble's split keeps the input half's intermediate gradients, so neither half
  repeats the other's work). A Linear's two halves each cost its forward's FLOPs.

Example::

    count, outputs = count_layer(split.layers[1], values, roofline, autocast=no_autocast)
    count.forward.flops, count.backward_weight.flops, count.saved_bytes
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.profile.roofline import OpCounter, PassCost, Roofline
from planner.profile.split import tensor_bytes
from planner.tensors import leaf, tensors

__all__ = ["LayerCount", "count_layer"]


@dataclass(frozen=True)
class LayerCount:
    """One layer at one microbatch size: the three passes and the bytes it keeps and sends."""

    forward: PassCost
    backward: PassCost  # the whole backward
    backward_input: PassCost
    output_bytes: int
    saved_bytes: int

    @property
    def backward_weight(self) -> PassCost:
        """The weight half: what the whole backward does beyond the input half."""
        return self.backward - self.backward_input


def count_layer(
    layer: nn.Module,
    values: Sequence[Any],
    roofline: Roofline,
    *,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    loss: Callable[[Any], Any] | None = None,
    counter: Callable[[str], OpCounter] | None = None,
) -> tuple[LayerCount, Any]:
    """Count ``layer``'s passes on ``values`` (module docstring); returns the counts and the
    layer's outputs (the values entering the next layer). ``counter(pass)`` makes the
    counter of each pass (``"forward"``, ``"backward_input"``, ``"backward"``; default: an
    :class:`OpCounter`): a tensor-parallel shard's counts its local operations.

    Example::

        count, out = count_layer(layer, values, roofline, loss=lambda o: user.loss(o, y))
    """
    leaves = [leaf(v) for v in values]
    grad_inputs = [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]
    params = [p for p in layer.parameters() if p.requires_grad]
    state = {_storage_key(t) for t in [*layer.parameters(), *layer.buffers()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in state:
            saved[key] = _local(t).untyped_storage().nbytes()
        return t

    make = counter or (lambda _: OpCounter(roofline))
    forward = make("forward")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), forward, autocast():
        outputs = layer(*leaves)
        value = loss(outputs) if loss is not None else None
    if value is not None:
        roots, grads = [value], None
    else:  # a value passed through unchanged is a leaf: its gradient costs nothing
        roots = [t for t in tensors(outputs) if t.grad_fn is not None]
        grads = [torch.ones_like(t) for t in roots]
    input_half = make("backward_input")
    if roots and grad_inputs:
        with input_half:
            torch.autograd.grad(roots, grad_inputs, grads, retain_graph=True, allow_unused=True)
    whole = make("backward")
    wrt = grad_inputs + params
    if roots and wrt:
        _zero_grads(params, roots, grads)  # as in training: each microbatch adds into them
        with whole:
            torch.autograd.backward(roots, grads, inputs=wrt)
    for t in wrt:
        t.grad = None
    count = LayerCount(
        forward.cost,
        whole.cost,
        input_half.cost,
        tensor_bytes(outputs),
        sum(saved.values()),
    )
    return count, _detached(outputs)


def _zero_grads(params: list[Any], roots: list[Any], grads: Any) -> None:
    """Zero gradients to accumulate into. A tensor-parallel shard's are made by one
    uncounted backward and zeroed, so each has the layout its gradients arrive in (a
    sequence-parallel norm's stays partial until the optimizer step reads it, as in a run:
    no collective per microbatch)."""
    if any(hasattr(p, "_local_tensor") for p in params) and params:
        torch.autograd.backward(roots, grads, inputs=params, retain_graph=True)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()
        return
    for p in params:
        p.grad = torch.zeros_like(p)


def _storage_key(t: torch.Tensor) -> int:
    # Views and tensors saved twice share one storage; meta and fake storages have no data
    # pointer, so the storage object itself is the key (alive while the graph holds it).
    return int(_local(t).untyped_storage()._cdata)


def _local(t: torch.Tensor) -> torch.Tensor:
    # A tensor-parallel shard's DTensor holds this rank's part in its local tensor.
    return getattr(t, "_local_tensor", t)


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple | list):
        return type(value)(_detached(v) for v in value)
    return value
