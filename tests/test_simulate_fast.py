"""The simulator's fast paths give the results of the straightforward ones.

Transfers start at their send when their links' queues reach them (instead of in a pass
after every device has run as far as it can), and generated orders are compiled once per
shape: neither may change a single number.
"""

from __future__ import annotations

import random
import sys

import pytest

from planner.plan import StageSpec
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.simulate import SimResult, simulate
from planner.topology import uniform_topology

SIM = sys.modules["planner.simulate"]


def _profile(rng: random.Random, n: int) -> Profile:
    layers = [
        Layer(f"l{i}", 10, 40 * rng.randint(1, 50), 80, rng.choice([0.0, rng.uniform(0.1, 2)]))
        for i in range(n)
    ]
    timings = []
    for _ in range(n):
        bi, bw = rng.uniform(0.1, 3), rng.uniform(0, 2)
        out = rng.randint(0, 1 << 22)
        timings.append(LayerTiming(rng.uniform(0.1, 3), bi + bw, bi, bw, out, rng.randint(1, 999)))
    return Profile("random", layers, [Measurement(1, 100, timings)])


def _case(seed: int) -> tuple[Profile, list[StageSpec], object, int]:
    rng = random.Random(seed)
    p = rng.randint(1, 5)
    n = p + rng.randint(0, 3)
    cuts = [0, *sorted(rng.sample(range(1, n), p - 1)), n]
    replicas = [rng.choice([1, 1, 2]) for _ in range(p)]
    names = iter(f"gpu{i}" for i in range(sum(replicas)))
    stages = [
        StageSpec(i, (cuts[i], cuts[i + 1] - 1), [next(names) for _ in range(replicas[i])])
        for i in range(p)
    ]
    topo = uniform_topology(
        sum(replicas), bandwidth=rng.choice([1e9, 10e9, 100e9]), latency_ms=rng.choice([0, 0.01])
    )
    return _profile(rng, n), stages, topo, rng.randint(p, 10)


def _same(a: SimResult, b: SimResult) -> None:
    assert a.iteration_ms == b.iteration_ms
    assert a.memory_bytes == b.memory_bytes
    assert a.busy_ms == b.busy_ms
    assert a.lower_bound_ms == b.lower_bound_ms
    assert sorted(a.raw_events) == sorted(b.raw_events)
    assert sorted(a.raw_transfers) == sorted(b.raw_transfers)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("schedule", ["1f1b", "zb", "2bw"])
def test_starting_transfers_at_their_send_changes_nothing(
    seed: int, schedule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile, stages, topo, m = _case(seed)
    fast = simulate(profile, topo, stages, schedule, m)
    monkeypatch.setattr(SIM, "_START_AT_SEND", False)
    slow = simulate(profile, topo, stages, schedule, m)
    _same(fast, slow)


def test_cached_programs_give_the_results_of_fresh_ones() -> None:
    # Same shape (devices, microbatches), different layer ranges and times: the second call
    # reuses the first one's compiled programs.
    rng = random.Random(7)
    topo = uniform_topology(3, bandwidth=10e9, latency_ms=0.01)
    for cuts in ([(0, 1), (2, 3), (4, 5)], [(0, 0), (1, 4), (5, 5)]):
        profile = _profile(rng, 6)
        stages = [StageSpec(i, c, [f"gpu{i}"]) for i, c in enumerate(cuts)]
        cached = simulate(profile, topo, stages, "2bw", 6)
        SIM._COMPILED.clear()
        fresh = simulate(profile, topo, stages, "2bw", 6)
        _same(cached, fresh)
