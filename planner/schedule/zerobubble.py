"""Zero-bubble ZB-H1 (Qi et al., 2024): backward split into ``I`` (input gradient) and
``W`` (weight gradient), with the ``W`` passes deferred to fill the drain.

Stage ``s`` of ``p`` runs ``p - s`` forwards, then per microbatch ``j``: ``I(j)``, the
deferred ``W(j - s)``, and the next forward; the last ``s`` weight passes close the
iteration. With ``f = I = W`` and ``m >= p`` the bubble is ``(p - 1) f``, a third of
1F1B's ``(p - 1)(f + b)``. Activations are counted until ``W`` frees them, so every stage
holds at most ``p`` microbatches: the peak (stage 0) is the same as 1F1B's.

Example::

    order = zb_order(num_stages=4, num_microbatches=8)
"""

from __future__ import annotations

from planner.schedule.expand import ComputeOp
from planner.schedule.order_family import family_order

__all__ = ["zb_order"]


def zb_order(num_stages: int, num_microbatches: int) -> dict[int, list[ComputeOp]]:
    """Per-stage ZB-H1 compute order.

    Example::

        zb_order(2, 2)[1]   # F1.0 I1.0 F1.1 I1.1 W1.0 W1.1
    """
    p = num_stages
    # ZB-H1 is the member of the optimized schedule's family with 1F1B's warm-up depths and
    # stage s deferring s weight passes.
    return family_order(num_microbatches, [p - s for s in range(p)], list(range(p)))
