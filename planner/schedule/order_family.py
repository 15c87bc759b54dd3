"""The order family the optimized schedule searches: per-stage warm-up depth and W deferral.

Stage ``s`` runs ``warm[s]`` forwards, then for each microbatch ``j`` its backward (``B``,
or ``I`` and the deferred ``W(j - defer[s])``) followed by the next forward. ``warm = p - s``
with an unsplit backward is 1F1B; ``warm = p - s, defer = s`` is ZB-H1. The search over
this family, which simulates candidates, is
:func:`planner.simulate.order_search.optimized_schedule`.

Example::

    order = family_order(8, [4, 3, 2, 1], [0, 1, 2, 3])     # ZB-H1 on 4 stages
    schedule_from_order("optimized", stages, order, 8)
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedule.expand import ComputeOp

__all__ = ["family_order"]


def family_order(
    num_microbatches: int, warm: Sequence[int], defer: Sequence[int] | None
) -> dict[int, list[ComputeOp]]:
    """Per-stage order with the given warm-up depths; ``defer=None`` keeps B whole.

    Example::

        family_order(8, [4, 3, 2, 1], None)      # 1F1B on 4 stages
        family_order(8, [4, 3, 2, 1], [0, 1, 2, 3])   # ZB-H1
    """
    m = num_microbatches
    order: dict[int, list[ComputeOp]] = {}
    for s, w in enumerate(warm):
        w = max(1, min(w, m))
        ops: list[ComputeOp] = [("F", s, k) for k in range(w)]
        next_f, next_w = w, 0
        d = None if defer is None else defer[s]
        for j in range(m):
            if d is None:
                ops.append(("B", s, j))
            else:
                ops.append(("I", s, j))
                if j - d >= 0:
                    ops.append(("W", s, j - d))
                    next_w += 1
            if next_f < m:
                ops.append(("F", s, next_f))
                next_f += 1
        if d is not None:
            ops.extend(("W", s, k) for k in range(next_w, m))
        order[s] = ops
    return order
