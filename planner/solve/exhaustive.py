"""The exhaustive search on tiny instances: every contiguous partition x every sequence of
disjoint, ordered device lists, simulated, so small cases are exactly optimal.

:func:`exhaustive_size` counts that space; ``solve`` enumerates it when the count (times the
batch settings and schedules) is at most :attr:`SolveOptions.exhaustive_limit`.

Example::

    exhaustive_size(6, 3)  # 165
    scored = exhaustive(search, ["1f1b"], [(4, 8)])
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from planner.schedule.families import family
from planner.solve.scored import Scored
from planner.solve.search import Search, make_shape

__all__ = ["exhaustive", "exhaustive_size"]


def _device_groupings(names: Sequence[str], s: int) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every sequence of ``s`` disjoint non-empty device lists. The order inside a list
    matters too: replica ``k % r`` runs microbatch ``k`` and the all-reduce ring follows it."""
    for k in range(s, len(names) + 1):
        for order in itertools.permutations(names, k):
            for cuts in itertools.combinations(range(1, k), s - 1):
                bounds = [0, *cuts, k]
                yield tuple(tuple(order[bounds[i] : bounds[i + 1]]) for i in range(s))


def _partitions(n: int, s: int) -> Iterator[list[tuple[int, int]]]:
    """Every split of ``n`` layers into ``s`` contiguous ranges."""
    for cuts in itertools.combinations(range(n - 1), s - 1):
        bounds = [-1, *cuts, n - 1]
        yield [(bounds[k] + 1, bounds[k + 1]) for k in range(s)]


def exhaustive_size(num_layers: int, num_devices: int) -> int:
    """How many (partition, device lists) pairs the exhaustive search would simulate.

    Example::

        exhaustive_size(6, 3)   # 165
    """
    total = 0
    for s in range(1, min(num_layers, num_devices) + 1):
        parts = math.comb(num_layers - 1, s - 1)
        # Choose and order k devices, then cut the sequence into s non-empty lists.
        maps = sum(
            math.perm(num_devices, k) * math.comb(k - 1, s - 1) for k in range(s, num_devices + 1)
        )
        total += parts * maps
    return total


def exhaustive(
    search: Search, schedules: Sequence[str], settings: Sequence[tuple[int, int]]
) -> list[Scored]:
    """Every plan of the space :func:`exhaustive_size` counts, simulated (interleaved
    schedules are left to the re-cuts of the winner).

    Example::

        best = min(exhaustive(search, ["1f1b", "gpipe"], [(4, 8)]), key=Scored.key)
    """
    names = search.topology.device_names()
    n = search.profile.num_layers
    out = []
    for mb, m in settings:
        for sched in schedules:
            if family(sched).interleaved:
                continue
            for s in range(1, min(n, len(names)) + 1):
                for ranges in _partitions(n, s):
                    for groups in _device_groupings(names, s):
                        cand = make_shape(search, ranges, groups, sched, mb, m)
                        out.append(search.evaluate(cand, "exhaustive"))
    return out
