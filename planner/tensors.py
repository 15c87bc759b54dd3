"""Nested values of tensors (a tensor, tuples, lists and dicts of them, other values passed
through): what a model's inputs, outputs and cut values are. Rows sliced, moved, listed.

One copy of these walks for the profiler, the runtime and its reference trainer.

Example::

    x, y = user.batch(mbs * m)
    first = to_device(slice_batch(x, 0, mbs), "cpu")    # microbatch 0, structure kept
    total = sum(t.numel() for t in tensors(first))
"""

from __future__ import annotations

from typing import Any

__all__ = ["detach", "leaf", "slice_batch", "tensors", "to_device"]


def slice_batch(value: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of every tensor in ``value`` (tuples, lists and dicts kept).

    Example::

        slice_batch({"input_ids": ids, "labels": labels}, 0, 2)   # the first two rows
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value[lo:hi]
    if isinstance(value, tuple | list):
        return type(value)(slice_batch(v, lo, hi) for v in value)
    if isinstance(value, dict):
        return {k: slice_batch(v, lo, hi) for k, v in value.items()}
    return value


def to_device(value: Any, device: Any) -> Any:
    """``value`` with every tensor moved to ``device`` (tuples, lists and dicts kept).

    Example::

        to_device((x, mask), "cuda:0")
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple | list):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def tensors(value: Any) -> list[Any]:
    """Every tensor in ``value``, depth first.

    Example::

        tensors((x, [y, 3], {"m": mask}))   # [x, y, mask]
    """
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    return []


def detach(value: Any) -> Any:
    """``value`` with every tensor in its tuples and lists detached.

    Example::

        detach((hidden, 4))   # (hidden.detach(), 4)
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple | list):
        return type(value)(detach(v) for v in value)
    return value


def leaf(value: Any) -> Any:
    """A detached copy of a tensor that requires grad if it is floating point (a stage's or
    a layer's input, whose gradient the backward returns); other values as they are.

    Example::

        x = leaf(received)   # x.grad holds the input gradient after the backward
    """
    import torch

    if isinstance(value, torch.Tensor):
        out = value.detach()
        if out.is_floating_point():
            out.requires_grad_(True)
        return out
    return value
