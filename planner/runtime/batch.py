"""A global batch cut into microbatches: :mod:`planner.tensors`'s walks, named here for the
runtime.

Example::

    x, y = user.batch(mbs * m)
    first = to_device(slice_batch(x, 0, mbs), torch.device("cpu"))   # microbatch 0
"""

from __future__ import annotations

from planner.tensors import slice_batch, to_device

__all__ = ["slice_batch", "to_device"]
