"""PipeDream's partitioning optimizer, reproduced as a baseline.

Source: ``optimizer/optimizer_graph_hierarchical.py`` (``compute_partitioning`` and
``analyze_partitioning``) in msr-fiddle/pipedream (MIT licence). For a topology given as
levels ``[(devices, bandwidth bytes/s), ...]`` from the innermost (GPUs in a server) out
(servers in a cluster), it solves, level by level,

    A[i][j][m] = min( (T(i..j) + 4 m P(i..j) / (B (m+1)) / W) / (m+1),          # replicate
                      min_{k, m'} max( A[i][k][m-m'],                           # split
                                       (T(k+1..j) + 4 (m'-1) P(k+1..j) / (B m')) / m' ) )

where ``T`` is forward+backward seconds per minibatch, ``P`` parameter bytes, ``B`` the
level's bandwidth, ``W`` the devices per worker of the level below, ``m + 1`` the workers
used. A level's best times ``A[i][j][last]`` become the next level's segment times. The
all-reduce term is PipeDream's ring estimate; stage-to-stage activation transfers count only
with ``activation_compression_ratio`` (off by default, as in PipeDream), memory only with
``memory_size`` (PipeDream's ``--use_memory_constraint``).

Simplification (documented in docs/baselines.md): PipeDream's states are the antichains of
the layer DAG; here they are the prefixes of the profile's topological order (on a chain the
two coincide; on a DAG these are a subset of PipeDream's cuts). As in PipeDream, layers a
PipeDream import marks as inputs (``meta["pipedream"]["input_layers"]``) cost nothing. Ties
go to the smallest split point, then the fewest replicas for the last stage.

PipeDream's loops are O(L^2 D^2) per level; they run here with numpy over the split point
and the last stage's workers, in the same floating-point operations and with the same
tie-breaking, so answers are bit-for-bit PipeDream's loops (kept as ``_pipedream_reference``
for the tests that check this): 200 layers on 64 workers take 0.3 s instead of 20-30 s.

Example::

    plan = pipedream_plan(profile, microbatch_size=32, levels=[(8, 300e9), (2, 25e9)])
    plan.stages            # [(0, 17, 4), (18, 47, 12)]: (first, last, replicas)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import InfeasibleError, InputError
from planner.profile.schema import Profile

__all__ = ["Level", "PipeDreamPlan", "pipedream_partition", "pipedream_plan"]

# A[i][j][m] = (time, (k, machines for i..k) or None, machines of the last stage)
_Entry = tuple[float, tuple[int, int] | None, int] | None


@dataclass(frozen=True)
class Level:
    """One level of the machine hierarchy: how many workers, joined by what bandwidth."""

    num_devices: int
    bandwidth: float  # bytes per second


@dataclass
class PipeDreamPlan:
    """PipeDream's answer: stages with replica counts and its own time estimates (seconds)."""

    stages: list[tuple[int, int, int]]
    stage_time_s: float  # PipeDream's "time per stage in pipeline" (its objective)
    data_parallel_time_s: float  # its estimate for plain data parallelism on all devices


@dataclass
class _Segments:
    """Prefix sums over the layers, PipeDream's ``states[j].compute_time`` etc."""

    compute: list[float]
    activation: list[float]
    parameter: list[float]
    output: list[float]  # bytes crossing the cut after state k

    def total(self, values: list[float], i: int, j: int) -> float:
        return values[j] - (values[i - 1] if i > 0 else 0.0)


def _segments(profile: Profile, microbatch_size: int) -> _Segments:
    timings = profile.measurement(microbatch_size).layers
    pipedream = profile.meta.get("pipedream")
    inputs = set(pipedream.get("input_layers", [])) if isinstance(pipedream, dict) else set()
    compute, activation, parameter = [], [], []
    c = a = p = 0.0
    for i, (layer, t) in enumerate(zip(profile.layers, timings, strict=True)):
        if i not in inputs:  # PipeDream zeroes Input sources: they always sit in stage 0
            c += (t.forward_ms + t.backward_ms) / 1000.0
            a += t.saved_bytes
            p += layer.param_bytes
        compute.append(c)
        activation.append(a)
        parameter.append(p)
    out_bytes = [0 if i in inputs else t.output_bytes for i, t in enumerate(timings)]
    edges = profile.edge_list()
    output = [
        float(sum(out_bytes[u] for u in {u for u, v in edges if u <= k < v}))
        for k in range(profile.num_layers)
    ]
    if profile.num_layers:
        output[-1] = float(out_bytes[-1])
    return _Segments(compute, activation, parameter, output)


def _check_levels(levels: Sequence[Level | tuple[int, float]]) -> list[Level]:
    if not levels:
        raise InputError("expected at least one level (devices, bandwidth)", field="levels")
    checked = []
    for index, level in enumerate(levels):
        num, bandwidth = (level.num_devices, level.bandwidth) if isinstance(level, Level) else level
        if int(num) != num or num < 1 or not bandwidth > 0:
            raise InputError(
                f"expected (devices >= 1, bandwidth > 0 bytes/s), got ({num}, {bandwidth})",
                field=f"levels[{index}]",
            )
        checked.append(Level(int(num), float(bandwidth)))
    return checked


def _solve_level(
    times: list[list[float | None]],
    seg: _Segments,
    num_machines: int,
    within: int,
    bandwidth: float,
    *,
    final_level: bool,
    straight_pipeline: bool,
    memory_size: float | None,
    use_fewer_machines: bool,
    compression: float | None,
) -> list[list[list[_Entry]]]:
    """``compute_partitioning`` for one level; ``times[i][j]`` is segment i..j's time."""
    n = len(times)
    table: list[list[list[_Entry]]] = [[[None] * num_machines for _ in range(n)] for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            time = times[i][j]
            if time is None:
                continue
            params = seg.total(seg.parameter, i, j)
            stashed = seg.total(seg.activation, i, j) + params
            for m in range(1 if straight_pipeline else num_machines):
                if (
                    memory_size is not None
                    and math.ceil((num_machines - (m + 1)) / (m + 1)) * stashed > memory_size
                ):
                    continue
                allreduce = (4 * m * params) / (bandwidth * (m + 1)) / within
                table[i][j][m] = ((time + allreduce) / (m + 1), None, m + 1)

    for i in range(1 if final_level else n):
        for m in range(1, num_machines):
            for j in range(i + 1, n):
                best = table[i][j][m]
                if use_fewer_machines:
                    fewer = table[i][j][m - 1]
                    if best is None or (fewer is not None and fewer[0] < best[0]):
                        best = fewer
                # PipeDream tries every antichain k before j; on prefixes those are i..j-1.
                for k in range(i, j):
                    last_time = times[k + 1][j]
                    if last_time is None:
                        continue
                    params = seg.total(seg.parameter, k + 1, j)
                    stashed = seg.total(seg.activation, k + 1, j) + params
                    for m_last in range(1, 2 if straight_pipeline else m + 1):
                        if (
                            memory_size is not None
                            and stashed * math.ceil((num_machines - (m + 1)) / m_last) > memory_size
                        ):
                            continue
                        before = table[i][k][m - m_last]
                        if before is None:
                            continue
                        last = (last_time + 4 * (m_last - 1) * params / (bandwidth * m_last)) / (
                            m_last
                        )
                        time = max(before[0], last)
                        if compression is not None:
                            sent = 2.0 * seg.output[k] / (bandwidth * m_last) / compression
                            time = max(time, sent)
                            if j < n - 1:
                                out = 2.0 * seg.output[j] / (bandwidth * m_last) / compression
                                time = max(time, out)
                        if best is None or best[0] > time:
                            best = (time, (k, m - m_last), m_last)
                table[i][j][m] = best
    return table


def _unfold(
    table: list[list[list[_Entry]]], start: int, end: int, num_machines: int
) -> list[tuple[int, int, int]]:
    """``analyze_partitioning``: the stages of segment start..end on ``num_machines``."""
    entry = table[start][end][num_machines - 1]
    if entry is None:
        raise InfeasibleError(
            f"PipeDream's optimizer finds no feasible partition of layers {start}..{end} on "
            f"{num_machines} workers (memory constraint)",
            field="memory_size",
        )
    stages = []
    last = end
    while entry is not None and entry[1] is not None:
        k, machines_before = entry[1]
        stages.append((k + 1, last, entry[2]))
        last = k
        entry = table[start][k][machines_before]
    assert entry is not None
    stages.append((start, last, entry[2]))
    return stages[::-1]


@dataclass
class _Table:
    """One level's ``A[i][j][m]`` as arrays; ``time`` is ``inf`` where PipeDream has None.

    ``split[i, j, m]`` is the last split point ``k`` (-1: the segment is one stage),
    ``before`` the machines of ``i..k`` and ``last`` those of the last stage.
    """

    time: np.ndarray
    split: np.ndarray
    before: np.ndarray
    last: np.ndarray


def _prefix(values: list[float]) -> np.ndarray:
    # seg.total(values, i, j) == prefix[j + 1] - prefix[i], bit for bit (x - 0.0 == x).
    return np.concatenate(([0.0], np.asarray(values, dtype=np.float64)))


def _solve_level_fast(
    times: np.ndarray,
    seg: _Segments,
    num_machines: int,
    within: int,
    bandwidth: float,
    *,
    final_level: bool,
    straight_pipeline: bool,
    memory_size: float | None,
    use_fewer_machines: bool,
    compression: float | None,
) -> _Table:
    """:func:`_solve_level` with the split point and last-stage machines vectorised.

    Every float is computed by the same IEEE operations in the same order as the reference,
    and ties go the same way (``argmin`` takes the first minimum in (k, m_last) order, and a
    candidate replaces the incumbent only when strictly faster), so the tables are identical.
    """
    n, big_m = times.shape[0], num_machines
    param = _prefix(seg.parameter)
    params = param[None, 1:] - param[:-1, None]  # params[i, j] = P(i..j) for j >= i
    act = _prefix(seg.activation)
    stashed = (act[None, 1:] - act[:-1, None]) + params
    # Replicate segment i..j on all m + 1 workers, every m at once (m on the last axis).
    count = 1 if straight_pipeline else big_m
    ms = np.arange(count, dtype=np.float64)
    ok = np.repeat(np.isfinite(times)[:, :, None], count, axis=2)
    if memory_size is not None:
        stash = np.array([math.ceil((big_m - (m + 1)) / (m + 1)) for m in range(count)], float)
        ok &= ~(stash * stashed[:, :, None] > memory_size)
    allreduce = (4 * ms) * params[:, :, None] / (bandwidth * (ms + 1)) / within
    time = np.full((n, n, big_m), np.inf)
    with np.errstate(invalid="ignore"):
        time[:, :, :count] = np.where(ok, (times[:, :, None] + allreduce) / (ms + 1), np.inf)
    split = np.full((n, n, big_m), -1, dtype=np.int32)
    before = np.zeros((n, n, big_m), dtype=np.int32)
    last = np.zeros((n, n, big_m), dtype=np.int32)
    last[:, :, :count] = np.where(ok, (ms + 1).astype(np.int32), 0)

    # last_cost[r - 1, j, k]: stage k+1..j on r machines (inf where k >= j or no time).
    width = 1 if straight_pipeline else big_m - 1
    reps = np.arange(1, width + 1, dtype=np.float64)[:, None, None]
    tail_time = np.full((n, n), np.inf)  # tail_time[j, k] = times[k + 1][j]
    tail_time[:, : n - 1] = times[1:, :].T
    tail_params = np.zeros((n, n))
    tail_params[:, : n - 1] = params[1:, :].T
    tail_stashed = np.zeros((n, n))
    tail_stashed[:, : n - 1] = stashed[1:, :].T
    with np.errstate(invalid="ignore"):
        last_cost = (tail_time + 4 * (reps - 1) * tail_params / (bandwidth * reps)) / reps
    if compression is not None:
        # max is exact, so folding the transfer terms in here changes no value.
        output = np.asarray(seg.output, dtype=np.float64)
        last_cost = np.maximum(
            last_cost, 2.0 * output[None, None, :] / (bandwidth * reps) / compression
        )
        out = 2.0 * output[None, : n - 1, None] / (bandwidth * reps) / compression
        last_cost[:, : n - 1] = np.maximum(last_cost[:, : n - 1], out)
    last_cost[:, ~np.isfinite(tail_time)] = np.inf  # includes k >= j
    last_cost = np.ascontiguousarray(last_cost)

    buffer = np.empty(width * min(n, max(16, n // 8)) * n)
    for i in range(1 if final_level else n):
        for m in range(1, big_m):
            r_max = 1 if straight_pipeline else m
            # before_time[r - 1, k - i] = A[i][k][m - r]
            before_time = np.ascontiguousarray(time[i, i : n - 1, m - r_max : m][:, ::-1].T)
            factor = None
            if memory_size is not None:
                factor = np.array(
                    [math.ceil((big_m - (m + 1)) / r) for r in range(1, r_max + 1)],
                    dtype=np.float64,
                )[:, None, None]
            # Per (r, j): the first k of least time, and that time.
            k_min = np.empty((r_max, n - 1 - i), dtype=np.intp)
            v_min = np.empty((r_max, n - 1 - i))
            step = max(16, (n - i) // 8)
            for j0 in range(i + 1, n, step):
                j1 = min(j0 + step, n)
                # Splits k = i..j1-2 cover every j < j1 (k >= j is inf in last_cost).
                tails = last_cost[:r_max, j0:j1, i : j1 - 1]
                # One reused buffer: fresh multi-megabyte arrays cost page faults each time.
                cand = buffer[: tails.size].reshape(tails.shape)
                np.maximum(tails, before_time[:, None, : j1 - 1 - i], out=cand)
                if factor is not None and memory_size is not None:
                    heavy = tail_stashed[None, j0:j1, i : j1 - 1] * factor > memory_size
                    cand[heavy] = np.inf
                got = np.argmin(cand, axis=2)
                k_min[:, j0 - i - 1 : j1 - i - 1] = got
                v_min[:, j0 - i - 1 : j1 - i - 1] = np.take_along_axis(
                    cand, got[:, :, None], axis=2
                )[:, :, 0]
            _update(time, split, before, last, k_min, v_min, i, m, use_fewer_machines)
    return _Table(time, split, before, last)


def _update(
    time: np.ndarray,
    split: np.ndarray,
    before: np.ndarray,
    last: np.ndarray,
    k_min: np.ndarray,
    v_min: np.ndarray,
    i: int,
    m: int,
    use_fewer_machines: bool,
) -> None:
    """Settle ``A[i][j][m]`` for ``j > i`` from the best split ``i + k_min[r - 1, j - i - 1]``
    (of time ``v_min[r - 1, j - i - 1]``) for each number ``r`` of last-stage workers.

    PipeDream scans k, then r, and replaces its incumbent only when strictly faster: the
    winner is the smallest time, then the smallest k, then the smallest r.
    """
    cols = slice(i + 1, time.shape[1])
    best = time[i, cols, m].copy()
    b_split = split[i, cols, m].copy()
    b_before = before[i, cols, m].copy()
    b_last = last[i, cols, m].copy()
    if use_fewer_machines:
        take = np.isinf(best) | (time[i, cols, m - 1] < best)
        best[take] = time[i, cols, m - 1][take]
        b_split[take] = split[i, cols, m - 1][take]
        b_before[take] = before[i, cols, m - 1][take]
        b_last[take] = last[i, cols, m - 1][take]
    value = v_min.min(axis=0)
    hit = v_min == value
    k = np.where(hit, k_min, time.shape[1]).min(axis=0)
    r = np.argmax(hit & (k_min == k), axis=0) + 1  # first r with that k
    better = np.isfinite(value) & (best > value)
    time[i, cols, m] = np.where(better, value, best)
    split[i, cols, m] = np.where(better, i + k, b_split)
    before[i, cols, m] = np.where(better, m - r, b_before)
    last[i, cols, m] = np.where(better, r, b_last)


def _unfold_fast(
    table: _Table, start: int, end: int, num_machines: int
) -> list[tuple[int, int, int]]:
    """:func:`_unfold` on a :class:`_Table`."""
    m = num_machines - 1
    if not np.isfinite(table.time[start, end, m]):
        raise InfeasibleError(
            f"PipeDream's optimizer finds no feasible partition of layers {start}..{end} on "
            f"{num_machines} workers (memory constraint)",
            field="memory_size",
        )
    stages = []
    last = end
    while table.split[start, last, m] >= 0:
        k = int(table.split[start, last, m])
        stages.append((k + 1, last, int(table.last[start, last, m])))
        m = int(table.before[start, last, m])
        last = k
    stages.append((start, last, int(table.last[start, last, m])))
    return stages[::-1]


def pipedream_plan(
    profile: Profile,
    microbatch_size: int,
    levels: Sequence[Level | tuple[int, float]],
    *,
    straight_pipeline: bool = False,
    memory_size: float | None = None,
    use_fewer_machines: bool = False,
    activation_compression_ratio: float | None = None,
) -> PipeDreamPlan:
    """Run PipeDream's hierarchical DP; stages carry their total replica count.

    ``levels`` go from the innermost (e.g. ``(8, 300e9)``: 8 GPUs per server) outwards. A
    stage replicated ``r`` times at an outer level and ``s`` times inside each server has
    ``r * s`` replicas. The keyword options are PipeDream's command-line flags.

    Example::

        pipedream_plan(profile, 32, [(4, 25e9)]).stages     # [(0, 9, 3), (10, 11, 1)]
    """
    checked = _check_levels(levels)
    seg = _segments(profile, microbatch_size)
    n = profile.num_layers
    compute = _prefix(seg.compute)
    times = compute[None, 1:] - compute[:-1, None]
    times[np.tril_indices(n, -1)] = np.inf  # j < i: no segment
    tables = []
    within = 1
    for index, level in enumerate(checked):
        table = _solve_level_fast(
            times,
            seg,
            level.num_devices,
            within,
            level.bandwidth,
            final_level=index == len(checked) - 1,
            straight_pipeline=straight_pipeline,
            memory_size=memory_size,
            use_fewer_machines=use_fewer_machines,
            compression=activation_compression_ratio,
        )
        tables.append(table)
        within = level.num_devices
        # The next level sees each segment's best time on all of this level's workers.
        times = table.time[:, :, -1].copy()

    segments = [(0, n - 1, 1)]
    for level, table in zip(reversed(checked), reversed(tables), strict=True):
        segments = [
            (first, last, replicas * outer)
            for start, end, outer in segments
            for first, last, replicas in _unfold_fast(table, start, end, level.num_devices)
        ]
    top = float(tables[-1].time[0, n - 1, checked[-1].num_devices - 1])
    return PipeDreamPlan(segments, top, _data_parallel_time(seg, checked))


def _pipedream_reference(
    profile: Profile,
    microbatch_size: int,
    levels: Sequence[Level | tuple[int, float]],
    *,
    straight_pipeline: bool = False,
    memory_size: float | None = None,
    use_fewer_machines: bool = False,
    activation_compression_ratio: float | None = None,
) -> PipeDreamPlan:
    """The pure-Python DP that :func:`pipedream_plan` vectorises; tests compare the two.

    Example::

        _pipedream_reference(profile, 32, [(4, 25e9)]).stages   # == pipedream_plan's
    """
    checked = _check_levels(levels)
    seg = _segments(profile, microbatch_size)
    n = profile.num_layers
    times: list[list[float | None]] = [
        [seg.total(seg.compute, i, j) if j >= i else None for j in range(n)] for i in range(n)
    ]
    tables = []
    within = 1
    for index, level in enumerate(checked):
        table = _solve_level(
            times,
            seg,
            level.num_devices,
            within,
            level.bandwidth,
            final_level=index == len(checked) - 1,
            straight_pipeline=straight_pipeline,
            memory_size=memory_size,
            use_fewer_machines=use_fewer_machines,
            compression=activation_compression_ratio,
        )
        tables.append(table)
        within = level.num_devices
        # The next level sees each segment's best time on all of this level's workers.
        times = [[cell[-1][0] if cell[-1] is not None else None for cell in row] for row in table]

    segments = [(0, n - 1, 1)]
    for level, table in zip(reversed(checked), reversed(tables), strict=True):
        segments = [
            (first, last, replicas * outer)
            for start, end, outer in segments
            for first, last, replicas in _unfold(table, start, end, level.num_devices)
        ]
    top = tables[-1][0][n - 1][checked[-1].num_devices - 1]
    assert top is not None  # _unfold raised otherwise
    return PipeDreamPlan(segments, top[0], _data_parallel_time(seg, checked))


def _data_parallel_time(seg: _Segments, levels: list[Level]) -> float:
    total_time = seg.compute[-1]
    params = seg.parameter[-1]
    within = 1
    for level in levels:
        num, bandwidth = level.num_devices, level.bandwidth
        allreduce = (4 * (num - 1) * params) / (bandwidth * num) / within
        total_time = (total_time + allreduce) / num
        within = num
    return total_time


def pipedream_partition(
    profile: Profile,
    microbatch_size: int,
    levels: Sequence[Level | tuple[int, float]],
    *,
    straight_pipeline: bool = False,
    memory_size: float | None = None,
    use_fewer_machines: bool = False,
    activation_compression_ratio: float | None = None,
) -> list[tuple[int, int, int]]:
    """PipeDream's partition as ``[(first, last, replicas), ...]``; see :func:`pipedream_plan`.

    Example::

        pipedream_partition(profile, 32, [(4, 25e9)])       # [(0, 9, 3), (10, 11, 1)]
    """
    return pipedream_plan(
        profile,
        microbatch_size,
        levels,
        straight_pipeline=straight_pipeline,
        memory_size=memory_size,
        use_fewer_machines=use_fewer_machines,
        activation_compression_ratio=activation_compression_ratio,
    ).stages
