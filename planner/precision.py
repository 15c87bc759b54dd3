"""Training precision: fp32, or mixed precision with ``torch.autocast`` (bf16, fp16).

Mixed precision as PyTorch's AMP recipe runs it: parameters, gradients and optimizer state
stay fp32 (the master weights), each forward (and the loss) runs under
``torch.autocast(device_type, dtype)``, so matrix products and the activations they make
are bf16 or fp16, and the backward runs outside autocast. A profile records the precision
it was measured at (top-level ``precision``); ``solve`` and ``simulate`` read the profile's
numbers, which already hold the smaller activations and cuts, and ``run`` trains at the
profile's precision.

Example::

    with autocast("cpu", "bf16"):
        logits = model(tokens)          # bf16 matmuls, fp32 weights
"""

from __future__ import annotations

import contextlib
from typing import Any

from planner.errors import InputError

__all__ = ["PRECISIONS", "autocast", "autocast_dtype", "check_precision", "check_fp16_schedule"]

PRECISIONS = ("fp32", "bf16", "fp16")
"""Precisions a profile and a run may name; fp32 is plain training without autocast."""


def check_precision(name: Any, *, field: str = "--precision", file: str | None = None) -> str:
    """``name`` if it is one of :data:`PRECISIONS`, else one clear InputError.

    Example::

        check_precision("bf16")      # 'bf16'
    """
    if name not in PRECISIONS:
        raise InputError(
            f"expected one of {', '.join(PRECISIONS)}, got {name!r}", file=file, field=field
        )
    return str(name)


def check_fp16_schedule(
    precision: str, schedule: str, flush: bool, *, file: str | None = None, field: str = "schedule"
) -> None:
    """Refuse fp16 under a schedule without a flush (2bw): loss scaling skips a step on
    every stage at once, which overlapping iterations with stale weights cannot do.

    Example::

        check_fp16_schedule("fp16", "2bw", flush=False)   # InputError
    """
    if precision == "fp16" and not flush:
        raise InputError(
            f"fp16 loss scaling skips a step on every stage at once, which the {schedule} "
            "schedule (no flush, stale weights) cannot do; use bf16, or a schedule with a flush",
            file=file,
            field=field,
        )


def autocast_dtype(precision: str) -> Any:
    """The autocast dtype of a precision (None for fp32).

    Example::

        autocast_dtype("bf16")       # torch.bfloat16
    """
    import torch

    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[check_precision(precision)]


def autocast(device_type: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for a precision on a device type (``cpu``/``cuda``); a context
    that does nothing for fp32.

    Example::

        with autocast("cuda", "fp16"):
            out = stage(*inputs)
    """
    import torch

    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)
