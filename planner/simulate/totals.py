"""Peaks and busy times, which follow from each device's program order alone.

Allocations happen in program order, and a device's work is summed action by action in
it: the same additions in the same order as the event engine makes, so the same floats,
without timing anything.

Example::

    peaks, busy = program_totals(shape.work, tables.durations, tables.grows,
                                 tables.shrinks, [tables.static[d] for d in tables.devices])
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from itertools import accumulate, chain
from operator import add
from typing import Any

__all__ = ["program_totals", "program_totals_exact"]


def program_totals(
    work: Sequence[Any],
    durations: list[list[float]],
    grows: list[int],
    shrinks: list[int],
    static: list[int],
) -> tuple[list[int], list[float]]:
    """Per device the peak memory and the busy time, which follow from the program order
    alone: allocations happen in program order, and work is summed action by action in it
    (the same additions in the same order as the event engine makes, so the same floats).
    ``work`` holds per device the slots of its compute and steps, in program order.

    Example::

        program_totals([[0, 1]], [[1.0, 2.0]], [5, 0], [0, -5], [100])   # ([105], [3.0])
    """
    import numpy as np  # here: commands that never simulate do not pay for the import

    longest = max(map(len, work), default=0)
    if max(map(abs, [*grows, *shrinks]), default=0) * 2 * longest >= 2**62:
        return program_totals_exact(work, durations, grows, shrinks, static)
    up, down = np.array(grows, dtype=np.int64), np.array(shrinks, dtype=np.int64)
    moves = np.empty(2 * longest, dtype=np.int64)
    peaks, busy = [], []
    for slots, dtab, base in zip(work, durations, static, strict=True):
        if not len(slots):
            peaks.append(base)
            busy.append(0.0)
            continue
        at = np.asarray(slots, dtype=np.intp)
        size = 2 * len(slots)
        moves[:size:2], moves[1:size:2] = up[at], down[at]
        # Frees never exceed the level just before them: the peak follows an allocation.
        peaks.append(base + max(0, int(np.cumsum(moves[:size]).max())))
        # An accumulation adds one element at a time, in order (a sum would add pairwise).
        busy.append(float(np.cumsum(np.array(dtab)[at])[-1]))
    return peaks, busy


# The same arguments as program_totals (duplicates flags the signature): the fallback it
# calls, and the reference a test compares it with.
def program_totals_exact(
    work: Sequence[Any],
    durations: list[list[float]],
    grows: list[int],
    shrinks: list[int],
    static: list[int],
) -> tuple[list[int], list[float]]:
    """:func:`program_totals` in Python ints, for memory sizes too large for int64.

    Example::

        program_totals_exact([[0]], [[1.0]], [2**63], [-(2**63)], [0])   # ([2**63], [1.0])
    """
    moves = [(g, x) for g, x in zip(grows, shrinks, strict=True)]
    peaks, busy = [], []
    for slots, dtab, base in zip(work, durations, static, strict=True):
        steps = accumulate(chain.from_iterable(map(moves.__getitem__, slots)), initial=base)
        peaks.append(max(steps))
        busy.append(reduce(add, map(dtab.__getitem__, slots), 0.0))
    return peaks, busy
