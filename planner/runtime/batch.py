"""A global batch cut into microbatches: the same slicing for the runtime and its reference.

A batch is whatever ``sample_batch`` returns: a tensor, a tuple or list of them, or a dict
of keyword inputs; anything else (a Python number, None) is passed through unchanged.

Example::

    x, y = user.batch(mbs * m)
    first = to_device(slice_batch(x, 0, mbs), torch.device("cpu"))   # microbatch 0
"""

from __future__ import annotations

from typing import Any

__all__ = ["slice_batch", "to_device"]


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
