"""The partitioners other systems ship, reproduced so that plans can be compared with them.

Each function is a pure function of a profile (or of a list of numbers) and returns
contiguous inclusive layer ranges ``[(first, last), ...]`` covering every layer in order;
none places stages on devices: the solver puts them in device order and the simulator
judges them. The algorithms follow their sources line by line, ties and quirks included:

- :func:`uniform_partition`: DeepSpeed ``partition_method="uniform"``
  (``deepspeed/runtime/utils.py: partition_uniform``, microsoft/DeepSpeed).
- :func:`parameter_balanced_partition`: DeepSpeed's default ``partition_method="parameters"``
  (``PipelineModule._partition_layers`` -> ``ds_utils.partition_balanced`` on per-layer
  parameter counts). Since DeepSpeed PR #4312 (merged October 2023, in 0.19.8 today) that is
  a dynamic program minimising *max - min* stage weight; before it, a binary search on the
  bottleneck with prefix sums (``_lprobe``/``_rb_partition_balanced``), kept here as
  ``algorithm="bisect"``.
- :func:`time_balanced_partition`: torchgpipe's ``balance_by_time``
  (``torchgpipe/balance/blockpartition.py: solve``, kakaobrain/torchgpipe 0.0.7), the block
  partition heuristic of Bárány and Grinberg (arXiv:1308.2452) on forward+backward time.
- :func:`pipedream_partition` (in :mod:`planner.partition.pipedream`): PipeDream's optimizer.

Example::

    uniform_partition(10, 3)                        # [(0, 3), (4, 6), (7, 9)]
    parameter_balanced_partition(profile, 4)
    time_balanced_partition(profile, microbatch_size=2, num_stages=4)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Literal

import numpy as np

from planner.errors import InputError
from planner.partition.pipedream import Level, PipeDreamPlan, pipedream_partition, pipedream_plan
from planner.profile.schema import Profile

__all__ = [
    "Level",
    "PipeDreamPlan",
    "block_partition",
    "deepspeed_partition_balanced",
    "deepspeed_partition_balanced_bisect",
    "deepspeed_partition_uniform",
    "parameter_balanced_partition",
    "pipedream_partition",
    "pipedream_plan",
    "ranges_from_bounds",
    "time_balanced_partition",
    "uniform_partition",
]

Ranges = list[tuple[int, int]]


def ranges_from_bounds(bounds: Sequence[int]) -> Ranges:
    """DeepSpeed's ``parts`` (``[0, b1, ..., n]``, stage ``s`` = ``parts[s]:parts[s+1]``) as ranges.

    An empty stage is an InputError: our stages always hold at least one layer.

    Example::

        ranges_from_bounds([0, 4, 7, 10])           # [(0, 3), (4, 6), (7, 9)]
    """
    ranges = []
    for stage, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        if stop <= start:
            raise InputError(
                f"the partition {list(bounds)} leaves stage {stage} without layers",
                field="num_stages",
            )
        ranges.append((int(start), int(stop) - 1))
    return ranges


def _check_stages(num_layers: int, num_stages: int) -> None:
    if num_stages < 1:
        raise InputError(f"expected at least one stage, got {num_stages}", field="num_stages")
    if num_layers < num_stages:
        raise InputError(
            f"{num_stages} stages need at least {num_stages} layers; the profile has {num_layers}",
            field="num_stages",
        )


# --- DeepSpeed ----------------------------------------------------------------------------


def deepspeed_partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: boundaries; the first ``n % p`` parts get one more.

    (DeepSpeed PR #4053 moved the remainder from the last part to the first ones.)

    Example::

        deepspeed_partition_uniform(10, 3)          # [0, 4, 7, 10]
    """
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def deepspeed_partition_balanced(weights: Sequence[float], num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_balanced`` (since PR #4312): DP minimising max - min part weight.

    ``dp[i][j]`` covers the first ``i`` items with ``j`` parts; among equal costs the *last*
    split point wins (DeepSpeed compares with ``>=``), and ``dp_min[0][0]`` stays infinite as
    in DeepSpeed. Returns boundaries like :func:`deepspeed_partition_uniform`.

    Example::

        deepspeed_partition_balanced([1, 1, 1, 1, 1], 4)    # [0, 2, 3, 4, 5]
    """
    n, m = len(weights), num_parts
    if n <= m:
        return deepspeed_partition_uniform(n, m)
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    pre = np.asarray(prefix, dtype=np.float64)
    dp_max = np.full((n + 1, m + 1), inf)
    dp_min = np.full((n + 1, m + 1), inf)
    position = np.zeros((n + 1, m + 1), dtype=np.int64)
    dp_max[0, 0] = 0.0
    for i in range(1, n + 1):
        top = min(i, m)
        # Rows: j = 1..top; columns: k = 0..i-1. Same IEEE operations as DeepSpeed's loop.
        part = pre[i] - pre[:i]
        max_sum = np.maximum(dp_max[:i, :top].T, part)
        min_sum = np.minimum(dp_min[:i, :top].T, part)
        cost = max_sum - min_sum
        # ">=" keeps the last k among equal costs: argmin over the reversed columns.
        k = i - 1 - np.argmin(cost[:, ::-1], axis=1)
        rows = np.arange(top)
        dp_max[i, 1 : top + 1] = max_sum[rows, k]
        dp_min[i, 1 : top + 1] = min_sum[rows, k]
        position[i, 1 : top + 1] = k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return parts[::-1]


def _deepspeed_partition_balanced_reference(weights: Sequence[float], num_parts: int) -> list[int]:
    """DeepSpeed's loops as written; :func:`deepspeed_partition_balanced` vectorises them
    and tests compare the two.

    Example::

        _deepspeed_partition_balanced_reference([1, 1, 1, 1, 1], 4)    # [0, 2, 3, 4, 5]
    """
    n, m = len(weights), num_parts
    if n <= m:
        return deepspeed_partition_uniform(n, m)
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    dp_max[0][0] = 0.0
    dp_cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                max_sum = max(dp_max[k][j - 1], part)
                min_sum = min(dp_min[k][j - 1], part)
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j] = cost
                    dp_max[i][j] = max_sum
                    dp_min[i][j] = min_sum
                    position[i][j] = k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(position[parts[-1]][j])
    return parts[::-1]


def deepspeed_partition_balanced_bisect(
    weights: Sequence[float], num_parts: int, eps: float = 1e-3
) -> list[int]:
    """DeepSpeed's ``partition_balanced`` before PR #4312: binary search on the bottleneck.

    Probes a bottleneck with ``_lprobe`` (greedy fill on inclusive prefix sums, ``bisect_left``
    in chunk-sized windows) and bisects between ``total / p`` and ``total`` until the window
    is below ``eps``. It can leave trailing parts empty (the bug PR #4312 fixed):
    ``[1, 1, 1, 1, 1]`` into 4 gives ``[0, 2, 4, 5, 5]``.

    Example::

        deepspeed_partition_balanced_bisect([1, 1, 1, 1, 1], 4)   # [0, 2, 4, 5, 5]
    """
    num_items = len(weights)
    if num_items <= num_parts:
        return deepspeed_partition_uniform(num_items, num_parts)
    prefix: list[float] = []
    for w in weights:
        prefix.append((prefix[-1] if prefix else 0) + w)
    total = prefix[-1]
    lower, upper = total / num_parts, total
    while upper > lower + eps:
        mid = lower + (upper - lower) / 2
        if _lprobe(prefix, num_parts, mid)[1]:
            upper = mid
        else:
            lower = mid + eps
    parts, success = _lprobe(prefix, num_parts, upper)
    if not success:  # DeepSpeed asserts here
        raise InputError(f"DeepSpeed's bisection found no partition into {num_parts} parts")
    return parts


def _lprobe(prefix: Sequence[float], num_parts: int, bottleneck: float) -> tuple[list[int], bool]:
    num_items = len(prefix)
    total = prefix[-1]
    parts = [0] + [num_items] * num_parts
    bsum = bottleneck  # running target: end of part p may weigh at most this (inclusive sums)
    chunk = num_items // num_parts
    step = chunk
    for p in range(1, num_parts):
        while step < num_items and prefix[step] < bsum:
            step += chunk
        parts[p] = bisect_left(prefix, bsum, lo=step - chunk, hi=min(step, num_items))
        if parts[p] == num_items:
            return parts, total - prefix[parts[p - 1]] < bottleneck
        bsum = prefix[parts[p] - 1] + bottleneck
    return parts, bsum >= total


def uniform_partition(num_layers: int, num_stages: int) -> Ranges:
    """Equal layer counts, the first ``num_layers % num_stages`` stages one layer longer.

    DeepSpeed's ``partition_method="uniform"``.

    Example::

        uniform_partition(10, 3)                    # [(0, 3), (4, 6), (7, 9)]
    """
    _check_stages(num_layers, num_stages)
    return ranges_from_bounds(deepspeed_partition_uniform(num_layers, num_stages))


def parameter_balanced_partition(
    profile: Profile, num_stages: int, *, algorithm: Literal["dp", "bisect"] = "dp"
) -> Ranges:
    """DeepSpeed's default ``partition_method="parameters"`` on the profile's parameter counts.

    ``algorithm="dp"`` is DeepSpeed today (max - min objective); ``"bisect"`` the binary search
    DeepSpeed used until October 2023 (minimises the largest stage; may leave a stage empty,
    which is an InputError here).

    Example::

        parameter_balanced_partition(profile, 4)    # [(0, 2), (3, 5), (6, 9), (10, 11)]
    """
    _check_stages(profile.num_layers, num_stages)
    weights = [layer.param_count for layer in profile.layers]
    if algorithm == "dp":
        return ranges_from_bounds(deepspeed_partition_balanced(weights, num_stages))
    if algorithm == "bisect":
        bounds = deepspeed_partition_balanced_bisect(weights, num_stages)
        try:
            return ranges_from_bounds(bounds)
        except InputError:
            raise InputError(
                f"DeepSpeed's pre-October-2023 partition_balanced gives boundaries {bounds}, "
                "leaving a stage without layers (the bug DeepSpeed PR #4312 fixed); use "
                "algorithm='dp'",
                field="num_stages",
            ) from None
    raise InputError(f"unknown algorithm {algorithm!r}; expected 'dp' or 'bisect'")


# --- torchgpipe ---------------------------------------------------------------------------


def block_partition(sequence: Sequence[float], partitions: int) -> list[int]:
    """torchgpipe's ``blockpartition.solve`` + ``balance_cost``: the size of each block.

    Values are normalised to [0, 1] and blocks start at ``n // k`` items each. Then, as in
    torchgpipe: take a heaviest block ``p`` (highest index on ties); while it is more than 1
    (one normalised largest item) heavier than a lightest block ``q`` (lowest index on ties),
    move one item into ``q`` from its neighbour on the side of ``p``; once ``p`` itself gives
    an item away, pick the heaviest block again.

    With zero-weight items torchgpipe can move a boundary past its neighbour; the sizes then
    include a 0 and no longer add up to ``len(sequence)``, exactly as torchgpipe's do. Where
    torchgpipe would loop forever (it can, on the same kind of input) this raises InputError.

    Example::

        block_partition([1, 2, 3, 4, 5, 6], 3)      # [3, 2, 1]
    """
    bounds = _block_bounds(sequence, partitions)
    # torchgpipe returns len(sequence[start:stop]); with zero-weight items its moves can
    # cross boundaries, and then that length is 0 and the sizes no longer add up to n.
    return [len(range(start, stop)) for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]


def _block_bounds(sequence: Sequence[float], partitions: int) -> list[int]:
    if partitions < 1:
        raise InputError(f"expected at least one partition, got {partitions}", field="num_stages")
    n = len(sequence)
    if n < partitions:
        raise InputError(
            f"sequence is shorter than intended partitions ({n} < {partitions})",
            field="num_stages",
        )
    minimum = min(sequence)
    spread = max(sequence) - minimum
    normal = [0.0] * n if spread == 0 else [(x - minimum) / spread for x in sequence]
    splits = [n // partitions * (x + 1) for x in range(partitions - 1)] + [n]

    def block_size(i: int) -> float:
        start = splits[i - 1] if i > 0 else 0
        return sum(normal[start : splits[i]])

    def leaderboard() -> list[tuple[float, int]]:
        return [(block_size(i), i) for i in range(partitions)]

    seen: set[tuple[tuple[int, ...], int, float]] = set()
    while True:
        # torchgpipe keeps this maximum while the inner loop moves items, and so do we.
        max_size, p = max(leaderboard())
        while True:
            # The state decides every later move, so a repeat means torchgpipe never stops
            # (it happens with zero-weight items, e.g. PipeDream's GNMT on 20 stages).
            # Boundaries that stay inside the sequence have finitely many states; ones that
            # leave it never come back to a partition.
            state = (tuple(splits), p, max_size)
            if state in seen or not 0 <= min(splits) <= max(splits) <= n:
                raise InputError(
                    f"torchgpipe's block partition into {partitions} blocks never stops "
                    "here (it cycles or runs its boundaries off the sequence; torchgpipe "
                    "itself hangs); choose another number of stages",
                    field="num_stages",
                )
            seen.add(state)
            min_size, q = min(leaderboard())
            if max_size <= min_size + 1:
                return [0, *splits]
            if p < q:
                h = q - 1
                splits[h] -= 1
            else:
                h = q + 1
                splits[q] += 1
            if p == h:
                break


def time_balanced_partition(profile: Profile, microbatch_size: int, num_stages: int) -> Ranges:
    """torchgpipe's ``balance_by_time``: block partition of forward+backward time per layer.

    torchgpipe times each layer's forward and backward together (integer microseconds summed
    over repeats); the profile's ``forward_ms + backward_ms`` at ``microbatch_size`` stands in
    for that (normalisation makes the unit irrelevant).

    Example::

        time_balanced_partition(profile, microbatch_size=4, num_stages=2)   # [(0, 5), (6, 11)]
    """
    _check_stages(profile.num_layers, num_stages)
    timings = profile.measurement(microbatch_size).layers
    costs = [t.forward_ms + t.backward_ms for t in timings]
    bounds = _block_bounds(costs, num_stages)
    try:
        return ranges_from_bounds(bounds)
    except InputError:
        raise InputError(
            f"torchgpipe's block partition into {num_stages} stages crosses its own "
            f"boundaries {bounds} (it happens with zero-time layers; torchgpipe would return "
            "an invalid balance); choose another number of stages",
            field="num_stages",
        ) from None
