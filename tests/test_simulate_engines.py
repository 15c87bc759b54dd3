"""The simulator's fast paths give the results of the straightforward ones.

Transfers start at their send when their links' queues reach them (instead of in a pass
after every device has run as far as it can), generated orders are compiled once per
shape, and over a topology the times are computed in one pass in the reference run's
order (``engine="in_order"``) instead of by the event engine (``engine="events"``): none
of these may change a single number.
"""

from __future__ import annotations

import copy
import random

import pytest
from families import GENERATED

from planner.cost import synthetic_profile
from planner.errors import InputError
from planner.plan import StageSpec
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.schedule import Schedule, build_schedule, family, schedule_from_order
from planner.simulate import STREAM_ITERATIONS, SimResult, simulate, simulate_schedule
from planner.simulate.program import compile_programs
from planner.simulate.shapes import SHAPES, CompiledShape
from planner.simulate.tables import stage_tables
from planner.simulate.timing import run_events
from planner.simulate.totals import program_totals, program_totals_exact
from planner.topology import topology_from_dict, uniform_topology


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
@pytest.mark.parametrize("schedule", GENERATED)
def test_starting_transfers_at_their_send_changes_nothing(seed: int, schedule: str) -> None:
    # The event engine over a topology, with transfers started at their send (the
    # default) and in a pass after every device has run as far as it can.
    profile, stages, topo, m = _case(seed)
    iterations = STREAM_ITERATIONS if family(schedule).streams else 1
    sched = build_schedule(schedule, stages, m, iterations=iterations)
    tables = stage_tables(profile, topo, stages, sched, 1, None)
    total_mb = m * iterations
    shape = CompiledShape(compile_programs(sched, stages, tables.devices, total_mb))
    runs = [
        run_events(shape, tables, topo, total_mb, record=True, start_at_send=at_send)
        for at_send in (True, False)
    ]
    fast, slow = runs
    assert fast.clock == slow.clock
    assert fast.link_free == slow.link_free
    assert sorted(fast.raw_events) == sorted(slow.raw_events)
    assert sorted(fast.raw_transfers) == sorted(slow.raw_transfers)
    assert (fast.mem, fast.levels) == (slow.mem, slow.levels)
    assert len(fast.raw_transfers) > 0 or len(stages) == 1


def test_cached_programs_give_the_results_of_fresh_ones() -> None:
    # Same shape (devices, microbatches), different layer ranges and times: the second
    # partition reuses the first one's compiled programs; a copy of the order is compiled
    # afresh.
    rng = random.Random(7)
    topo = uniform_topology(3, bandwidth=10e9, latency_ms=0.01)
    for i, cuts in enumerate(([(0, 1), (2, 3), (4, 5)], [(0, 0), (1, 4), (5, 5)])):
        profile = _profile(rng, 6)
        stages = [StageSpec(i, c, [f"gpu{i}"]) for i, c in enumerate(cuts)]
        sched = build_schedule("2bw", stages, 6, iterations=STREAM_ITERATIONS)
        assert sched.order is not None
        fresh_sched = schedule_from_order(
            "2bw", stages, copy.deepcopy(sched.order), 6, iterations=4, flush=False
        )
        before = SHAPES.info()
        cached = simulate_schedule(profile, topo, stages, sched, 1)
        after_cached = SHAPES.info()
        fresh = simulate_schedule(profile, topo, stages, fresh_sched, 1)
        if i:  # the second partition runs the first one's programs
            assert after_cached.hits == before.hits + 1
        assert SHAPES.info().misses == after_cached.misses + 1  # the copy: compiled afresh
        _same(cached, fresh)
    assert SHAPES.info().size <= SHAPES.maxsize


def _two_switches(rng: random.Random, n: int) -> object:
    """Devices split over two switches joined by one link (which cross-switch transfers
    share), with random speeds, bandwidths and latencies."""
    half = max(1, n // 2)
    links = [
        {
            "between": [f"gpu{i}", "sw0" if i < half else "sw1"],
            "bandwidth": f"{rng.choice([1, 5, 25])} GB/s",
            "latency": f"{rng.choice([0, 1, 3])} us",
        }
        for i in range(n)
    ]
    links.append({"between": ["sw0", "sw1"], "bandwidth": f"{rng.choice([2, 20])} GB/s"})
    return topology_from_dict(
        {
            "devices": [
                {"name": f"gpu{i}", "memory": "80 GiB", "speed": rng.choice([0.5, 1.0, 1.0, 2.0])}
                for i in range(n)
            ],
            "switches": ["sw0", "sw1"],
            "links": links,
        }
    )


def _in_order_case(seed: int) -> tuple[Profile, list[StageSpec], object, int]:
    rng = random.Random(1000 + seed)
    p = rng.randint(1, 5)
    n = p + rng.randint(0, 3)
    cuts = [0, *sorted(rng.sample(range(1, n), p - 1)), n]
    profile = _profile(rng, n)
    if rng.random() < 0.5:
        # Equal (or zero) times and sizes: many actions and transfers end at the same time.
        profile = synthetic_profile(
            n,
            forward_ms=rng.choice([0.0, 1.0]),
            backward_weight_ms=rng.choice([0.0, 1.0]),
            output_bytes=rng.choice([0, 1 << 20]),
        )
    stages = [StageSpec(i, (cuts[i], cuts[i + 1] - 1), [f"gpu{i}"]) for i in range(p)]
    return profile, stages, _two_switches(rng, p), rng.randint(1, 9)


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("schedule", [*GENERATED, "written"])
def test_the_pass_in_reference_order_gives_the_event_loops_results(
    seed: int, schedule: str
) -> None:
    # Over a topology the times are computed in one pass in the reference run's order
    # (engine="in_order", which refuses where it does not apply, so it did run); the
    # event engine is the definition it must reproduce to the bit.
    profile, stages, topo, m = _in_order_case(seed)
    sched: object = schedule
    if schedule == "written":  # a hand-written schedule: explicit sends and receives
        sched = Schedule.from_dict(build_schedule("1f1b", stages, m).to_dict())
    fast = simulate(profile, topo, stages, sched, m, engine="in_order")
    lean = simulate(profile, topo, stages, sched, m, events=False, engine="in_order")
    loop = simulate(profile, topo, stages, sched, m, engine="events")
    _same(fast, loop)
    assert fast.memory_timeline == loop.memory_timeline
    assert fast.makespan_ms == loop.makespan_ms
    assert (lean.iteration_ms, lean.memory_bytes, lean.busy_ms) == (
        loop.iteration_ms,
        loop.memory_bytes,
        loop.busy_ms,
    )
    _same(simulate(profile, topo, stages, sched, m), fast)  # "auto" takes the pass


def test_replicated_stages_and_deadlocks_keep_the_event_loop() -> None:
    # All-reduce barriers and deadlock messages stay with the event loop.
    rng = random.Random(3)
    stages = [StageSpec(0, (0, 1), ["gpu0", "gpu1"]), StageSpec(1, (2, 3), ["gpu2"])]
    topo = uniform_topology(3, bandwidth=10e9)
    result = simulate(_profile(rng, 4), topo, stages, "1f1b", 4)
    assert [e.kind for e in result.events].count("ALLREDUCE") == 2
    _same(simulate(_profile(random.Random(3), 4), topo, stages, "1f1b", 4, engine="events"), result)
    with pytest.raises(InputError, match="in_order engine needs"):
        simulate(_profile(rng, 4), topo, stages, "1f1b", 4, engine="in_order")
    two = [StageSpec(0, (0, 1), ["gpu0"]), StageSpec(1, (2, 3), ["gpu1"])]
    stuck = Schedule.from_dict(
        {
            "name": "mine",
            "devices": {
                "gpu0": ["RECV_B0.0<-gpu1", "F0.0", "SEND_F0.0->gpu1", "B0.0"],
                "gpu1": ["RECV_F1.0<-gpu0", "F1.0", "B1.0", "SEND_B1.0->gpu0"],
            },
        }
    )
    with pytest.raises(InputError, match="deadlocks"):
        simulate(_profile(rng, 4), topo, two, stuck, 1, validate=False)


@pytest.mark.parametrize("huge", [False, True])
def test_peaks_and_busy_times_match_the_action_by_action_sums(huge: bool) -> None:
    # Vectorised, the peaks must be the same ints and the busy times the same floats as
    # adding action by action in Python (the event loop's definition); sizes beyond
    # int64 take the Python path.
    rng = random.Random(11)
    slots = 30
    scale = 2**62 if huge else 1 << 30
    grows = [rng.randint(0, scale) for _ in range(slots)]
    shrinks = [-rng.randint(0, scale) for _ in range(slots)]
    durations = [[rng.uniform(0, 3) for _ in range(slots)] for _ in range(3)]
    work = [[rng.randrange(slots) for _ in range(n)] for n in (0, 1, 500)]
    static = [rng.randint(0, scale) for _ in range(3)]
    fast = program_totals(work, durations, grows, shrinks, static)
    exact = program_totals_exact(work, durations, grows, shrinks, static)
    assert fast == exact
    peaks, busy = exact
    level, top, total = static[2], static[2], 0.0
    for slot in work[2]:
        level += grows[slot]
        top = max(top, level)
        level += shrinks[slot]
        total += durations[2][slot]
    assert (peaks[2], busy[2]) == (top, total)


def test_engines_are_chosen_by_name_and_options_are_spelled_out() -> None:
    profile = synthetic_profile(4)
    stages = [StageSpec(0, (0, 1), ["gpu0"]), StageSpec(1, (2, 3), ["gpu1"])]
    free = simulate(profile, None, stages, "1f1b", 4, engine="events")
    assert free.iteration_ms == simulate(profile, None, stages, "1f1b", 4).iteration_ms
    with pytest.raises(InputError, match="in_order engine needs"):
        simulate(profile, None, stages, "1f1b", 4, engine="in_order")  # no topology
    with pytest.raises(InputError, match="unknown engine 'fast'"):
        simulate(profile, None, stages, "1f1b", 4, engine="fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="evnts"):
        simulate(profile, None, stages, "1f1b", 4, evnts=False)  # type: ignore[call-arg]
