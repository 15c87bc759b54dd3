"""Baseline partitioners: DeepSpeed, torchgpipe and PipeDream reproduced."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import InfeasibleError, InputError
from planner.partition import (
    block_partition,
    deepspeed_partition_balanced,
    deepspeed_partition_balanced_bisect,
    deepspeed_partition_uniform,
    parameter_balanced_partition,
    pipedream_partition,
    pipedream_plan,
    time_balanced_partition,
    uniform_partition,
)
from planner.partition.baselines import _deepspeed_partition_balanced_reference
from planner.partition.pipedream import _pipedream_reference
from planner.profile import Layer, LayerTiming, Measurement, Profile


def _profile(
    times_ms: list[float],
    params: list[int] | None = None,
    *,
    microbatch_size: int = 1,
    meta: dict | None = None,  # type: ignore[type-arg]
) -> Profile:
    params = params if params is not None else [0] * len(times_ms)
    layers = [Layer(f"l{i}", p, 4 * p, 8 * p) for i, p in enumerate(params)]
    timings = [LayerTiming(t, 0.0, 0.0, 0.0, 1000, 1000) for t in times_ms]
    return Profile("toy", layers, [Measurement(microbatch_size, 0, timings)], meta=meta or {})


def _covers(ranges: list[tuple[int, int]], n: int) -> bool:
    starts = [0] + [last + 1 for _, last in ranges[:-1]]
    return (
        [first for first, _ in ranges] == starts
        and ranges[-1][1] == n - 1
        and all(first <= last for first, last in ranges)
    )


# --- uniform ------------------------------------------------------------------------------


def test_uniform_hand_cases() -> None:
    assert uniform_partition(10, 3) == [(0, 3), (4, 6), (7, 9)]
    assert uniform_partition(9, 3) == [(0, 2), (3, 5), (6, 8)]
    assert uniform_partition(3, 3) == [(0, 0), (1, 1), (2, 2)]
    # DeepSpeed PR #4053's own example: 38 layers on 8 stages.
    assert deepspeed_partition_uniform(38, 8) == [0, 5, 10, 15, 20, 25, 30, 34, 38]
    assert deepspeed_partition_uniform(2, 4) == [0, 1, 2, 2, 2]
    for n, s in [(2, 3), (5, 0)]:
        with pytest.raises(InputError, match="num_stages"):
            uniform_partition(n, s)


# --- DeepSpeed parameters -----------------------------------------------------------------


def test_parameter_balanced_hand_cases() -> None:
    # One heavy layer then five light ones: [5] | [1 1 1 1 1] makes max - min = 0.
    assert parameter_balanced_partition(_profile([1.0] * 6, [5, 1, 1, 1, 1, 1]), 2) == [
        (0, 0),
        (1, 5),
    ]
    # [1 4 2 2] into 3: [1][4][2 2] and [1 4][2][2] both have max - min = 3; DeepSpeed's ">="
    # keeps the later split point, so it returns the second (worse bottleneck 5 vs 4).
    profile = _profile([1.0] * 4, [1, 4, 2, 2])
    assert parameter_balanced_partition(profile, 3) == [(0, 1), (2, 2), (3, 3)]
    # The older binary search minimises the bottleneck instead.
    assert parameter_balanced_partition(profile, 3, algorithm="bisect") == [(0, 0), (1, 1), (2, 3)]


def test_deepspeed_pr_4312_example() -> None:
    assert deepspeed_partition_balanced([1, 1, 1, 1, 1], 4) == [0, 2, 3, 4, 5]
    # The bug that PR fixed: the binary search left the last stage empty.
    assert deepspeed_partition_balanced_bisect([1, 1, 1, 1, 1], 4) == [0, 2, 4, 5, 5]
    with pytest.raises(InputError, match="PR #4312"):
        parameter_balanced_partition(_profile([1.0] * 5, [1] * 5), 4, algorithm="bisect")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=7),
    st.integers(1, 4),
)
def test_deepspeed_dp_is_optimal_for_max_minus_min(weights: list[int], parts: int) -> None:
    n = len(weights)
    if n <= parts:
        assert deepspeed_partition_balanced(weights, parts) == deepspeed_partition_uniform(n, parts)
        return
    bounds = deepspeed_partition_balanced(weights, parts)

    def spread(b: list[int]) -> int:
        sums = [sum(weights[x:y]) for x, y in itertools.pairwise(b)]
        return max(sums) - min(sums)

    best = min(spread([0, *cut, n]) for cut in itertools.combinations(range(1, n), parts - 1))
    assert spread(bounds) == best
    assert _covers(parameter_balanced_partition(_profile([1.0] * n, weights), parts), n)


# --- torchgpipe ---------------------------------------------------------------------------


def test_time_balanced_hand_cases() -> None:
    # Normalised [0, .2, .4, .6, .8, 1]: the start 2|2|2 has blocks .2, 1, 1.8; the last
    # block hands its first item to the middle one: .2, 1.6, 1 is within 1 of each other.
    assert block_partition([1, 2, 3, 4, 5, 6], 3) == [3, 2, 1]
    profile = _profile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert time_balanced_partition(profile, 1, 3) == [(0, 2), (3, 4), (5, 5)]
    # Equal times: the initial n // k blocks already satisfy the stop rule.
    assert time_balanced_partition(_profile([2.0] * 7), 1, 3) == [(0, 1), (2, 3), (4, 6)]


def test_torchgpipe_quirk_with_zero_times_is_reported() -> None:
    # torchgpipe 0.0.7 itself returns [2, 3, 2, 0, 2] here (sum 9 for 7 layers).
    weights = [0, 57172759, 0, 0, 13315874, 0, 59957556]
    assert block_partition(weights, 5) == [2, 3, 2, 0, 2]
    with pytest.raises(InputError, match="crosses its own boundaries"):
        time_balanced_partition(_profile([float(w) for w in weights]), 1, 5)


def test_torchgpipe_endless_loop_is_an_error() -> None:
    # PipeDream's GNMT (forward+backward ms per layer) on 20 stages: torchgpipe 0.0.7's solve()
    # never returns; we detect the repeated state instead of hanging.
    gnmt = [0, 0, 0, 7.022, 5.263, 0.273, 8.538, 0, 0, 0.192, 6.694, 0, 0, 0, 0.18, 6.693]
    gnmt += [0, 0, 0, 0, 0.394, 0, 10.687, 0, 0, 0, 0, 0.234, 0, 0, 8.439, 0, 0, 0.235, 0, 0]
    gnmt += [8.451, 0, 0, 0, 0.253, 0, 0, 19.032, 0, 0, 0, 6.836]
    with pytest.raises(InputError, match="never stops"):
        time_balanced_partition(_profile(gnmt), 1, 20)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.1, 100.0), min_size=1, max_size=12), st.integers(1, 5))
def test_time_balanced_covers_all_layers(times: list[float], stages: int) -> None:
    if len(times) < stages:
        with pytest.raises(InputError):
            time_balanced_partition(_profile(times), 1, stages)
        return
    try:
        ranges = time_balanced_partition(_profile(times), 1, stages)
    except InputError as exc:  # only torchgpipe's own quirks may fail
        assert "crosses its own boundaries" in str(exc) or "never stops" in str(exc)
        return
    assert len(ranges) == stages and _covers(ranges, len(times))
    # The stop rule of Barany et al.: heaviest block within one largest item of the lightest.
    lo, hi = min(times), max(times)
    sums = [
        sum((t - lo) / (hi - lo) if hi > lo else 0.0 for t in times[a : b + 1]) for a, b in ranges
    ]
    assert max(sums) <= min(sums) + 1 + 1e-9


def test_microbatch_size_must_be_profiled() -> None:
    with pytest.raises(InputError, match="profiled sizes"):
        time_balanced_partition(_profile([1.0, 2.0]), 8, 2)


# --- PipeDream ----------------------------------------------------------------------------

GB = 10**9


def test_pipedream_replicates_a_heavy_layer_with_few_parameters() -> None:
    # Layer 0: 100 ms, 1 KB of parameters; layer 1: 10 ms, 400 MB. Four workers at 1 GB/s.
    profile = _profile([100.0, 10.0], [250, 100_000_000])
    plan = pipedream_plan(profile, 1, [(4, 1e9)])
    assert plan.stages == [(0, 0, 3), (1, 1, 1)]
    # (0.1 s + 4 * 2 * 1000 B / (1e9 B/s * 3)) / 3 replicas
    assert plan.stage_time_s == pytest.approx((0.1 + 8000 / 3e9) / 3, rel=1e-12)
    # Plain data parallelism pays the 400 MB all-reduce: (0.11 + 4*3*400e6/4e9) / 4.
    assert plan.data_parallel_time_s == pytest.approx((0.11 + 4 * 3 * 400_001_000 / 4e9) / 4)


def test_pipedream_does_not_replicate_parameter_heavy_layers() -> None:
    profile = _profile([10.0] * 4, [GB // 4] * 4)  # 1 GB of parameters each
    assert pipedream_partition(profile, 1, [(4, 1e9)]) == [(i, i, 1) for i in range(4)]
    # ...but with few parameters and one slow layer, that layer gets the spare workers.
    light = _profile([10.0, 10.0, 40.0], [10, 10, 10])
    assert pipedream_partition(light, 1, [(6, 1e9)]) == [(0, 0, 1), (1, 1, 1), (2, 2, 4)]


def test_pipedream_straight_pipeline_and_compression() -> None:
    profile = _profile([100.0, 10.0], [250, 100_000_000])
    assert pipedream_partition(profile, 1, [(2, 1e9)], straight_pipeline=True) == [
        (0, 0, 1),
        (1, 1, 1),
    ]
    # 800 B of parameters, 1000 B between the layers, 10 kB/s. Ignoring transfers (PipeDream's
    # default) the split wins: max(0.1, 0.01) < (0.11 + 4 * 800 / (2 * 1e4)) / 2 = 0.135.
    # Counting them (2 * 1000 / 1e4 = 0.2 s for the cut), replicating both layers wins.
    small = _profile([100.0, 10.0], [100, 100])
    assert pipedream_partition(small, 1, [(2, 1e4)]) == [(0, 0, 1), (1, 1, 1)]
    counted = pipedream_plan(small, 1, [(2, 1e4)], activation_compression_ratio=1.0)
    assert counted.stages == [(0, 1, 2)]
    assert counted.stage_time_s == pytest.approx(0.135)


def test_pipedream_ignores_pipedream_input_layers() -> None:
    meta = {"pipedream": {"input_layers": [0]}}
    with_input = _profile([500.0, 10.0, 10.0], meta=meta)
    without = _profile([0.0, 10.0, 10.0])
    a = pipedream_plan(with_input, 1, [(2, 1e9)])
    b = pipedream_plan(without, 1, [(2, 1e9)])
    assert a.stages == b.stages and a.stage_time_s == b.stage_time_s == pytest.approx(0.01)


def _brute_force(times: list[float], params: list[int], workers: int, bandwidth: float) -> float:
    n, best = len(times), math.inf
    for stages in range(1, min(n, workers) + 1):
        for cut in itertools.combinations(range(1, n), stages - 1):
            bounds = [0, *cut, n]
            for reps in itertools.product(range(1, workers + 1), repeat=stages):
                if sum(reps) != workers:
                    continue
                worst = 0.0
                for (a, b), r in zip(itertools.pairwise(bounds), reps, strict=True):
                    t, p = sum(times[a:b]) / 1000.0, 4 * sum(params[a:b])
                    worst = max(worst, (t + 4 * (r - 1) * p / (bandwidth * r)) / r)
                best = min(best, worst)
    return best


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 50.0), st.integers(0, 10**8)), min_size=1, max_size=5),
    st.integers(1, 4),
    st.sampled_from([1e8, 1e9, 1e10]),
)
def test_pipedream_single_level_is_optimal(
    layers: list[tuple[float, int]], workers: int, bandwidth: float
) -> None:
    times, params = [t for t, _ in layers], [p for _, p in layers]
    plan = pipedream_plan(_profile(times, params), 1, [(workers, bandwidth)])
    assert plan.stage_time_s == pytest.approx(_brute_force(times, params, workers, bandwidth))
    ranges = [(a, b) for a, b, _ in plan.stages]
    assert _covers(ranges, len(times)) and sum(r for *_, r in plan.stages) == workers


def test_pipedream_hierarchy() -> None:
    profile = _profile([100.0, 10.0, 30.0, 5.0], [250, 10**8, 10**6, 10**7])
    flat = pipedream_plan(profile, 1, [(4, 1e9)])
    # A level of one worker changes nothing, inside or outside.
    assert pipedream_plan(profile, 1, [(1, 5e9), (4, 1e9)]).stages == flat.stages
    assert pipedream_plan(profile, 1, [(4, 1e9), (1, 5e9)]).stages == flat.stages
    two = pipedream_plan(profile, 1, [(2, 100e9), (4, 1e9)])
    assert sum(r for *_, r in two.stages) == 8
    assert _covers([(a, b) for a, b, _ in two.stages], 4)
    assert two.stage_time_s < flat.stage_time_s  # twice the devices
    with pytest.raises(InputError, match="levels"):
        pipedream_plan(profile, 1, [])
    with pytest.raises(InputError, match=r"levels\[0\]"):
        pipedream_plan(profile, 1, [(0, 1e9)])


def test_pipedream_memory_constraint_forces_replication() -> None:
    profile = _profile([10.0, 10.0], [10, 10])
    assert pipedream_partition(profile, 1, [(2, 1e9)]) == [(0, 0, 1), (1, 1, 1)]
    # PipeDream's stash estimate: a stage with w workers and M - m - 1 workers after it keeps
    # ceil((M - m - 1) / w) minibatches of activations + parameters; with 2 workers the first
    # of two stages keeps 1 x (1000 + 40) B > 1000 B, so only full replication (no stash) fits.
    constrained = pipedream_partition(profile, 1, [(2, 1e9)], memory_size=1000.0)
    assert constrained == [(0, 1, 2)]


# --- the vectorised DPs against the loops they replace ------------------------------------


def _random_chain(rng: random.Random, n: int) -> Profile:
    # Small integers make ties (equal times, zero-time and parameter-free layers) common, so
    # the tie-breaking of the vectorised DP is exercised, not just its arithmetic.
    layers, timings = [], []
    for i in range(n):
        p = rng.choice([0, 1, 3, rng.randint(0, 10**7)])
        layers.append(Layer(f"l{i}", p, 4 * p, 8 * p))
        f = float(rng.choice([0, 1, 2, rng.randint(0, 50)]))
        b = float(rng.choice([0, f, 2 * f]))
        saved, out = rng.choice([0, 100, rng.randint(0, 10**6)]), rng.randint(0, 10**6)
        timings.append(LayerTiming(f, b, 0.0, 0.0, out, saved))
    return Profile("rand", layers, [Measurement(1, 0, timings)])


@pytest.mark.parametrize("num_levels", [1, 2])
def test_pipedream_vectorised_matches_reference(num_levels: int) -> None:
    rng = random.Random(num_levels)
    options: list[dict[str, object]] = [
        {},
        {"straight_pipeline": True},
        {"use_fewer_machines": True},
        {"activation_compression_ratio": 1.0},
        {"activation_compression_ratio": 2.0, "use_fewer_machines": True},
    ]
    checked = 0
    for _ in range(60):
        profile = _random_chain(rng, rng.randint(1, 9))
        levels = [(rng.randint(1, 6), rng.choice([1e4, 1e6, 1e9])) for _ in range(num_levels)]
        opts = dict(rng.choice(options))
        if rng.random() < 0.3:
            opts["memory_size"] = float(rng.choice([10**5, 10**6, 10**7]))
        try:
            expected = _pipedream_reference(profile, 1, levels, **opts)  # type: ignore[arg-type]
        except InfeasibleError:
            with pytest.raises(InfeasibleError, match="memory_size"):
                pipedream_plan(profile, 1, levels, **opts)  # type: ignore[arg-type]
            continue
        got = pipedream_plan(profile, 1, levels, **opts)  # type: ignore[arg-type]
        # Bit for bit: same stages and the same float for PipeDream's objective.
        assert got == expected, (profile.to_dict(), levels, opts)
        checked += 1
    assert checked > 30
    # Long enough for the vectorised DP to work in several blocks of split points.
    profile = _random_chain(rng, 40)
    levels = [(7, 1e9)] if num_levels == 1 else [(3, 1e9), (2, 1e7)]
    for opts in options[:3]:
        got = pipedream_plan(profile, 1, levels, **opts)  # type: ignore[arg-type]
        assert got == _pipedream_reference(profile, 1, levels, **opts)  # type: ignore[arg-type]


def test_pipedream_vectorised_tables_match_reference() -> None:
    """Every entry of a level's table, not just the path the answer takes through it."""
    from planner.partition.pipedream import (
        _prefix,
        _segments,
        _solve_level,
        _solve_level_fast,
    )

    rng = random.Random(7)
    for case in range(40):
        profile = _random_chain(rng, rng.randint(2, 8))
        seg = _segments(profile, 1)
        n = profile.num_layers
        ref_times: list[list[float | None]] = [
            [seg.total(seg.compute, i, j) if j >= i else None for j in range(n)] for i in range(n)
        ]
        compute = _prefix(seg.compute)
        times = compute[None, 1:] - compute[:-1, None]
        times[np.tril_indices(n, -1)] = np.inf
        kwargs = {
            "final_level": case % 2 == 0,
            "straight_pipeline": False,
            "memory_size": 10**6 if case % 3 == 0 else None,
            "use_fewer_machines": case % 4 == 1,
            "compression": 1.0 if case % 5 == 0 else None,
        }
        machines, within, bandwidth = rng.randint(1, 5), rng.randint(1, 3), 1e6
        ref = _solve_level(ref_times, seg, machines, within, bandwidth, **kwargs)  # type: ignore[arg-type]
        fast = _solve_level_fast(times, seg, machines, within, bandwidth, **kwargs)  # type: ignore[arg-type]
        for i in range(1 if kwargs["final_level"] else n):
            for j in range(n):
                for m in range(machines):
                    entry = ref[i][j][m]
                    if entry is None:
                        assert math.isinf(fast.time[i, j, m]), (case, i, j, m)
                        continue
                    split = None
                    if fast.split[i, j, m] >= 0:
                        split = (int(fast.split[i, j, m]), int(fast.before[i, j, m]))
                    assert (float(fast.time[i, j, m]), split, int(fast.last[i, j, m])) == entry


def test_deepspeed_vectorised_matches_reference() -> None:
    rng = random.Random(3)
    for _ in range(500):
        weights = [rng.choice([0, 1, 2, rng.randint(0, 10**6)]) for _ in range(rng.randint(1, 14))]
        parts = rng.randint(1, 8)
        assert deepspeed_partition_balanced(weights, parts) == (
            _deepspeed_partition_balanced_reference(weights, parts)
        ), (weights, parts)


# --- the real libraries, when installed ---------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=10), st.integers(1, 5))
def test_matches_installed_deepspeed(weights: list[int], parts: int) -> None:
    ds = pytest.importorskip("deepspeed.runtime.utils")
    assert [int(x) for x in ds.partition_balanced(weights, parts)] == (
        deepspeed_partition_balanced(weights, parts)
    )
    n = len(weights)
    assert [int(x) for x in ds.partition_uniform(n, parts)] == deepspeed_partition_uniform(n, parts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=12), st.integers(1, 5))
def test_matches_installed_torchgpipe(weights: list[int], parts: int) -> None:
    blockpartition = pytest.importorskip("torchgpipe.balance.blockpartition")
    if len(weights) < parts:
        return
    try:
        ours = block_partition(weights, parts)
    except InputError as exc:
        assert "never stops" in str(exc)
        return  # torchgpipe would hang: nothing to compare
    assert ours == [len(block) for block in blockpartition.solve(weights, parts)]
