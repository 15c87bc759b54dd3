"""Interleaved 1F1B (Narayanan et al., 2021; Megatron-LM): ``v`` virtual stages per device.

The model is cut into ``p * v`` stages; device rank ``r`` holds stages ``r, r + p, ...``.
Forwards run in groups of ``p`` microbatches per chunk, chunk by chunk; rank ``r`` warms
up with ``2 (p - r - 1) + (v - 1) p`` chunk forwards, then alternates. With equal stages
and free communication the bubble is ``(p - 1)(f + b) / v`` (f, b per device).

Example::

    order = interleaved_order(num_ranks=4, virtual_stages=2, num_microbatches=8)
"""

from __future__ import annotations

from planner.errors import InputError
from planner.schedule.expand import ComputeOp

__all__ = ["interleaved_order"]


def interleaved_order(
    num_ranks: int, virtual_stages: int, num_microbatches: int
) -> dict[int, list[ComputeOp]]:
    """Per-rank compute order; stage ids are ``chunk * num_ranks + rank``.

    Example::

        interleaved_order(2, 2, 2)[0][:4]   # F0.0 F0.1 F2.0 F2.1
    """
    p, v, m = num_ranks, virtual_stages, num_microbatches
    if m % p:
        raise InputError(
            f"the interleaved schedule needs the number of microbatches ({m}) to be a "
            f"multiple of the number of devices in the pipeline ({p})",
            field="num_microbatches",
        )
    total = m * v
    order: dict[int, list[ComputeOp]] = {}
    for r in range(p):

        def op(kind: str, i: int, r: int = r) -> ComputeOp:
            group = i // p
            chunk = group % v
            if kind == "B":
                chunk = v - 1 - chunk
            mb = (i // (p * v)) * p + i % p
            return (kind, chunk * p + r, mb)

        warm = min(2 * (p - r - 1) + (v - 1) * p, total)
        ops = [op("F", i) for i in range(warm)]
        back = 0
        for i in range(warm, total):
            ops.append(op("F", i))
            ops.append(op("B", back))
            back += 1
        ops.extend(op("B", i) for i in range(back, total))
        order[r] = ops
    return order
