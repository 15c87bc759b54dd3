"""GPipe: all forwards, then all backwards (Huang et al., 2019; torchgpipe).

Every stage keeps all ``m`` microbatches' activations until the backward; with ``p``
equal stages the iteration takes ``(m + p - 1)(f + b)``.

Example::

    order = gpipe_order(num_stages=4, num_microbatches=8)
"""

from __future__ import annotations

from planner.schedule.expand import ComputeOp

__all__ = ["gpipe_order"]


def gpipe_order(num_stages: int, num_microbatches: int) -> dict[int, list[ComputeOp]]:
    """Per-stage compute order: ``F0..F(m-1)`` then ``B0..B(m-1)``.

    Example::

        gpipe_order(2, 2)[1]    # [('F', 1, 0), ('F', 1, 1), ('B', 1, 0), ('B', 1, 1)]
    """
    m = num_microbatches
    return {
        s: [("F", s, k) for k in range(m)] + [("B", s, k) for k in range(m)]
        for s in range(num_stages)
    }
