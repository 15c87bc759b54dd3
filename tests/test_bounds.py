"""The search bound (compute + all-reduce + step of the busiest device) never exceeds the
simulated iteration, and is tight where one device's work is all there is."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from families import GENERATED
from test_dp import random_profile

from planner.errors import InputError
from planner.plan import StageSpec
from planner.profile.tied import TiedParameter
from planner.simulate import simulate
from planner.solve import bounds
from planner.solve.bounds import busy_bound_ms, search_bound_ms
from planner.topology import load_topology, uniform_topology

ROOT = Path(__file__).resolve().parents[1]


def _random_plan(rng: random.Random, n: int, names: list[str]) -> list[StageSpec]:
    s = rng.randint(1, min(n, len(names)))
    cuts = sorted(rng.sample(range(n - 1), s - 1))
    bounds = [-1, *cuts, n - 1]
    pool = list(names)
    rng.shuffle(pool)
    sizes = [1] * s
    for _ in range(rng.randint(0, len(names) - s)):
        sizes[rng.randrange(s)] += 1
    out, pos = [], 0
    for k in range(s):
        out.append(
            StageSpec(
                k, (bounds[k] + 1, bounds[k + 1]), pool[pos : pos + sizes[k]], rng.random() < 0.2
            )
        )
        pos += sizes[k]
    return out


@pytest.mark.parametrize("topo_name", ["hetero", "dgx1-v100", "two-node-ib"])
def test_bound_never_exceeds_the_simulated_time(topo_name: str) -> None:
    topo = load_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    rng = random.Random(topo_name)
    names = topo.device_names()
    checked = 0
    for case in range(60):
        profile = random_profile(rng.randint(2, 9), case, sizes=(1, 2))
        stages = _random_plan(rng, profile.num_layers, names)
        schedule = rng.choice(GENERATED)
        m = rng.choice([4, 6, 8, 12])
        mb = rng.choice([1, 2])
        try:
            res = simulate(profile, topo, stages, schedule, m, mb, events=False)
        except InputError:
            continue  # more replicas than microbatches, or a 2bw shape that deadlocks
        bound = search_bound_ms(profile, topo, stages, schedule, m, mb)
        assert bound <= res.iteration_ms * (1 + 1e-9), (case, schedule)
        checked += 1
    assert checked >= 40


def test_data_parallelism_is_bounded_by_its_all_reduce() -> None:
    # One stage on four devices: each runs 2 of 8 microbatches, then the ring all-reduce,
    # then its step; nothing else can overlap, so the bound is the simulated time.
    profile = random_profile(4, 3, sizes=(2,))
    topo = uniform_topology(4, bandwidth=1e9)
    stages = [StageSpec(0, (0, 3), topo.device_names())]
    res = simulate(profile, topo, stages, "1f1b", 8, 2, events=False)
    bound = busy_bound_ms(profile, topo, stages, 8, 2)
    assert bound == pytest.approx(res.iteration_ms, rel=1e-9)
    # The simulator's own bound leaves the all-reduce out: well below.
    from planner.simulate import lower_bound_ms

    assert lower_bound_ms(profile, topo, stages, 8, 2) < 0.9 * bound


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 3)])
def test_pipeline_bound_is_exact_for_equal_stages(p: int, m: int) -> None:
    from planner.cost import synthetic_profile
    from planner.solve.bounds import pipeline_bound_ms

    # (m + p - 1)(f + b): the 1F1B closed form is the fill, the work and the drain.
    profile = synthetic_profile(p, forward_ms=0.5, backward_input_ms=1.25, backward_weight_ms=0.75)
    stages = [StageSpec(i, (i, i), [f"d{i}"]) for i in range(p)]
    res = simulate(profile, None, stages, "1f1b", m, events=False)
    assert pipeline_bound_ms(profile, None, stages, m, 1) == res.iteration_ms == (m + p - 1) * 2.5


@pytest.mark.parametrize("topo_name", ["hetero", "two-node-ib", "nvlink-pairs", "dgx1-v100"])
def test_interleaved_bound_never_exceeds_the_simulated_time(topo_name: str) -> None:
    # Devices holding several chunks, with replicas (each its own pipeline or, where the
    # microbatches do not divide, one order round robin), recompute, uneven chunks, tied
    # weights and fp16 (steps deferred): the fill before a device's lowest chunk, the
    # all-reduces before its last backward and the drain after it still bound it.
    topo = load_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    rng = random.Random(topo_name)
    names = topo.device_names()
    checked = 0
    for case in range(150):
        p, v = rng.randint(2, 4), rng.randint(2, 3)
        r = rng.choice([1, 2]) if len(names) >= 2 * p else 1
        n = rng.randint(p * v, p * v + 5)
        profile = random_profile(n, case, sizes=(1, 2))
        if case % 3 == 0:
            first = profile.layers[0]
            tie = TiedParameter("embed", (0, n - 1), first.param_count, first.param_bytes)
            profile = dataclasses.replace(
                profile, tied_parameters=[tie], precision=rng.choice(["fp32", "fp16"])
            )
        pool = list(names)
        rng.shuffle(pool)
        groups = [pool[g * r : (g + 1) * r] for g in range(p)]
        cuts = sorted(rng.sample(range(n - 1), p * v - 1))
        bounds = [-1, *cuts, n - 1]
        stages = [
            StageSpec(k, (bounds[k] + 1, bounds[k + 1]), groups[k % p], rng.random() < 0.2)
            for k in range(p * v)
        ]
        m, mb = p * rng.randint(max(1, r - 1), 6), rng.choice([1, 2])
        res = simulate(profile, topo, stages, "interleaved", m, mb, virtual_stages=v, events=False)
        bound = search_bound_ms(profile, topo, stages, "interleaved", m, mb)
        assert bound <= res.iteration_ms * (1 + 1e-9), case
        checked += 1
    assert checked == 150


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (3, 3, 6)])
def test_interleaved_bound_is_exact_for_equal_chunks(p: int, v: int, m: int) -> None:
    from planner.cost import synthetic_profile
    from planner.simulate import lower_bound_ms
    from planner.solve.bounds import pipeline_bound_ms

    # (m + (p - 1) / v)(f + b) per device: interleaving divides the fill and drain by v.
    profile = synthetic_profile(
        p * v, forward_ms=0.5, backward_input_ms=1.25, backward_weight_ms=0.75
    )
    stages = [StageSpec(k, (k, k), [f"d{k % p}"]) for k in range(p * v)]
    res = simulate(profile, None, stages, "interleaved", m, virtual_stages=v, events=False)
    expected = (m + (p - 1) / v) * 2.5 * v
    assert pipeline_bound_ms(profile, None, stages, m, 1) == res.iteration_ms == expected
    # The simulator's own bound (the busiest device, one microbatch's path) is below it.
    assert lower_bound_ms(profile, None, stages, m, 1) < expected


def test_static_overflow_means_no_recompute_fits() -> None:
    from planner.solve.bounds import overflows_memory

    # Devices too small for some plans' weights, gradients and optimizer state: whenever
    # the bound says a plan overflows, the simulator's peak does too, with recompute on
    # every stage as well; and it says so for some plans and not for others.
    rng = random.Random(7)
    topo = uniform_topology(4, bandwidth=1e9, memory_bytes=300 * 2**20)
    names = topo.device_names()
    said = {True: 0, False: 0}
    for case in range(40):
        profile = random_profile(rng.randint(2, 8), case, sizes=(1,))
        stages = _random_plan(rng, profile.num_layers, names)
        schedule = rng.choice(GENERATED)
        over = overflows_memory(profile, topo, stages, schedule)
        said[over] += 1
        for recompute in (False, True):
            plan = [StageSpec(s.id, s.layers, s.devices, recompute) for s in stages]
            try:
                res = simulate(profile, topo, plan, schedule, 4, 1, events=False)
            except InputError:
                continue
            if over:
                assert any(b > 300 * 2**20 for b in res.memory_bytes.values()), case
    assert said[True] and said[False]


@pytest.mark.parametrize("limit", [None, 5])
@pytest.mark.parametrize("topo_name", ["hetero", "dgx1-v100"])
def test_a_shared_share_memo_gives_the_same_bounds(topo_name: str, limit: int | None) -> None:
    """search_bound_ms with one memo across many plans (stages met again under other
    schedules, microbatch counts and neighbours, as a search's sweep meets them) gives
    the bound it gives without one, to the bit; the memo is reused, and emptied past its
    size (``limit`` 5 shares: emptied often)."""
    topo = load_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    rng = random.Random(f"memo-{topo_name}")
    names = topo.device_names()
    profile = random_profile(6, 3, sizes=(1, 2))
    memo = bounds.ShareMemo(limit)
    looked = 0
    for _ in range(40):
        stages = _random_plan(rng, profile.num_layers, names)
        for schedule in GENERATED:
            m = rng.choice([4, 8])
            fresh = search_bound_ms(profile, topo, stages, schedule, m, 1)
            assert search_bound_ms(profile, topo, stages, schedule, m, 1, memo) == fresh
            looked += len(stages)
            assert memo.held == sum(map(len, memo.rows.values()))
            assert memo.held <= memo.limit + len(names)
    assert 0 < len(memo.rows) < looked
