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

Example::

    plan = pipedream_plan(profile, microbatch_size=32, levels=[(8, 300e9), (2, 25e9)])
    plan.stages            # [(0, 17, 4), (18, 47, 12)]: (first, last, replicas)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
