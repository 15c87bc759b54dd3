"""PipeDream-Flush (1F1B) and PipeDream-2BW (Narayanan et al., 2019 and 2021).

1F1B: stage ``s`` of ``p`` runs ``p - s - 1`` warm-up forwards, then alternates one
forward and one backward, then drains; it keeps at most ``p - s`` microbatches of
activations. With a ``warmup`` list the depth of each stage is chosen by the caller
(the optimised schedule searches over it).

2BW runs the same order without a flush: the next iteration's forwards start while the
previous one drains, each stage keeps two weight versions and its gradients are one
step stale. :func:`onef1b_order` with ``iterations > 1`` produces that continuous stream
(the simulator uses it to measure the steady-state iteration time).

Example::

    order = onef1b_order(num_stages=4, num_microbatches=8)
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedule.expand import ComputeOp

__all__ = ["default_warmup", "onef1b_order"]


def default_warmup(num_stages: int, stage: int) -> int:
    """1F1B's warm-up depth of ``stage``: ``p - s - 1`` forwards before the first backward.

    Example::

        [default_warmup(4, s) for s in range(4)]   # [3, 2, 1, 0]
    """
    return num_stages - stage - 1


def onef1b_order(
    num_stages: int,
    num_microbatches: int,
    *,
    warmup: Sequence[int] | None = None,
    iterations: int = 1,
    split_backward: bool = False,
) -> dict[int, list[ComputeOp]]:
    """Per-stage 1F1B compute order over ``iterations * num_microbatches`` microbatches.

    ``split_backward`` writes each backward as ``I`` immediately followed by ``W``.

    Example::

        onef1b_order(2, 3)[0]   # F0 F1 B0 F2 B1 B2 on stage 0
    """
    total = num_microbatches * iterations
    order: dict[int, list[ComputeOp]] = {}
    for s in range(num_stages):
        w = default_warmup(num_stages, s) if warmup is None else warmup[s]
        w = max(0, min(w, total))
        ops: list[ComputeOp] = [("F", s, k) for k in range(w)]
        back = 0
        for k in range(w, total):
            ops.append(("F", s, k))
            ops.extend(_backward(s, back, split_backward))
            back += 1
        while back < total:
            ops.extend(_backward(s, back, split_backward))
            back += 1
        order[s] = ops
    return order


def _backward(stage: int, mb: int, split: bool) -> list[ComputeOp]:
    return [("I", stage, mb), ("W", stage, mb)] if split else [("B", stage, mb)]
