"""The chain DP: exact against brute force on the same cost model, memory, recompute, speed."""

from __future__ import annotations

import itertools
import random

import pytest

from planner.cost import boundary_bytes, stage_compute_ms, stage_memory_bytes
from planner.partition.dp import (
    Linear,
    Slot,
    layer_costs,
    partition_chain,
    partition_chain_depths,
)
from planner.profile import Layer, LayerTiming, Measurement, Profile


def random_profile(n: int, seed: int, *, sizes: tuple[int, ...] = (1, 2)) -> Profile:
    rng = random.Random(seed)
    layers = []
    for i in range(n):
        p = rng.randint(1, 50) * 2**20
        layers.append(Layer(f"l{i}", p // 4, p, 2 * p))
    measurements = []
    base = [(rng.uniform(0.5, 5.0), rng.randint(1, 40) * 2**20) for _ in range(n)]
    for mb in sizes:
        timings = []
        for f, out in base:
            fw = f * mb**0.8
            timings.append(
                LayerTiming(fw, 2 * fw, 1.1 * fw, 0.9 * fw, out * mb, int(1.5 * out * mb))
            )
        measurements.append(Measurement(mb, 8 * 2**20 * mb, timings))
    return Profile(f"rand{seed}", layers, measurements)


def _brute(profile, slots, in_flight, m, mb, link=None, allow_rc=True):  # type: ignore[no-untyped-def]
    n = profile.num_layers
    s = len(slots)
    best = float("inf")
    for cuts in itertools.combinations(range(n - 1), s - 1):
        bounds = [-1, *cuts, n - 1]
        worst = 0.0
        for k in range(s):
            a, b = bounds[k] + 1, bounds[k + 1]
            options = []
            for rc in (False, True) if allow_rc else (False,):
                # Recompute in the unit that peaks lower (each layer, or the whole stage).
                mem = min(
                    stage_memory_bytes(
                        profile, a, b, mb, in_flight[k], recompute=rc, recompute_layers=each
                    )
                    for each in (False, rc)
                )
                if mem <= slots[k].memory_bytes:
                    f, bw = stage_compute_ms(profile, a, b, mb, speed=slots[k].speed, recompute=rc)
                    options.append(f + bw)
            t = min(options, default=float("inf"))
            if link is not None and k < s - 1:
                t += link(boundary_bytes(profile, b, mb))
            worst = max(worst, t)
        best = min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_dp_matches_brute_force(seed: int) -> None:
    rng = random.Random(100 + seed)
    n = rng.randint(4, 8)
    profile = random_profile(n, seed)
    s = rng.randint(1, min(4, n))
    mb = rng.choice([1, 2])
    speeds = [rng.choice([0.5, 1.0, 2.0]) for _ in range(s)]
    total = stage_memory_bytes(profile, 0, n - 1, mb, s)
    mems = [rng.uniform(0.3, 1.0) * total for _ in range(s)]
    slots = [Slot((f"d{k}",), speeds[k], mems[k]) for k in range(s)]
    in_flight = [s - k for k in range(s)]
    link = Linear(latency_ms=0.1, ms_per_byte=1e-8)
    part = partition_chain(
        layer_costs(profile, mb), slots, in_flight=in_flight, num_microbatches=8, links=[link] * s
    )
    expected = _brute(profile, slots, in_flight, 8, mb, link=link)
    if expected == float("inf"):
        assert part is None
        return
    assert part is not None
    assert part.bottleneck_ms == pytest.approx(expected)
    # The reported ranges really achieve it and cover every layer once.
    assert part.ranges[0][0] == 0 and part.ranges[-1][1] == n - 1
    for (_, b), (a, _) in zip(part.ranges, part.ranges[1:], strict=False):
        assert a == b + 1
    for k, (a, b) in enumerate(part.ranges):
        mem = stage_memory_bytes(profile, a, b, mb, in_flight[k], recompute=part.recompute[k])
        assert mem <= slots[k].memory_bytes


def test_recompute_only_when_needed() -> None:
    profile = random_profile(6, 7)
    plain = stage_memory_bytes(profile, 0, 5, 1, 4)
    slot = Slot(("d0",), 1.0, plain)
    part = partition_chain(layer_costs(profile, 1), [slot], in_flight=[4], num_microbatches=4)
    assert part is not None and part.recompute == [False]
    tight = Slot(("d0",), 1.0, stage_memory_bytes(profile, 0, 5, 1, 4, recompute=True))
    part = partition_chain(layer_costs(profile, 1), [tight], in_flight=[4], num_microbatches=4)
    assert part is not None and part.recompute == [True]
    too_small = Slot(("d0",), 1.0, 1.0)
    assert (
        partition_chain(layer_costs(profile, 1), [too_small], in_flight=[4], num_microbatches=4)
        is None
    )


def test_faster_device_gets_more_work() -> None:
    profile = random_profile(8, 3)
    slots = [Slot(("fast",), 4.0, 1e15), Slot(("slow",), 1.0, 1e15)]
    part = partition_chain(layer_costs(profile, 1), slots, in_flight=[2, 1], num_microbatches=8)
    assert part is not None
    f0, b0 = stage_compute_ms(profile, *part.ranges[0], 1)
    f1, b1 = stage_compute_ms(profile, *part.ranges[1], 1)
    assert f0 + b0 > f1 + b1


def test_200_layers_64_slots() -> None:
    # Its speed is measured by bench/solve_time.py ("dp 200x64"), not asserted here.
    profile = random_profile(200, 1, sizes=(1,))
    costs = layer_costs(profile, 1)
    slots = [Slot((f"g{k}",), 1.0, 1e15) for k in range(64)]
    part = partition_chain(costs, slots, in_flight=list(range(64, 0, -1)), num_microbatches=128)
    assert part is not None and len(part.ranges) == 64
    assert [r[0] for r in part.ranges] == sorted({r[0] for r in part.ranges})
    assert part.ranges[0][0] == 0 and part.ranges[-1][1] == 199
    assert all(a[1] + 1 == b[0] for a, b in zip(part.ranges, part.ranges[1:], strict=False))


@pytest.mark.parametrize("seed", range(4))
def test_all_depths_equal_one_dp_per_depth(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(5, 12)
    profile = random_profile(n, seed)
    costs = layer_costs(profile, 1)
    m = 6
    limit = rng.uniform(0.2, 0.8) * stage_memory_bytes(profile, 0, n - 1, 1, m)
    slot = Slot(("d",), 1.5, limit)
    link = Linear(0.05, 2e-8)
    from_end = [min(q + 1, m) for q in range(n)]
    parts = partition_chain_depths(
        costs, slot, max_stages=n, in_flight_from_end=from_end, num_microbatches=m, link=link
    )
    for s in range(1, n + 1):
        one = partition_chain(
            costs,
            [slot] * s,
            in_flight=[from_end[s - 1 - k] for k in range(s)],
            num_microbatches=m,
            links=[link] * (s - 1),
        )
        got = parts[s - 1]
        if one is None:
            assert got is None
            continue
        assert got is not None
        assert got.bottleneck_ms == pytest.approx(one.bottleneck_ms)
        assert max(got.stage_ms) == pytest.approx(got.bottleneck_ms)
        assert got.ranges[0][0] == 0 and got.ranges[-1][1] == n - 1 and len(got.ranges) == s
