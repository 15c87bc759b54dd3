"""The simulator: memory by hand, communication over a topology, monotonicity, bad input."""

from __future__ import annotations

import os

import pytest
from families import BUILT, GENERATED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cost import (
    stage_activation_bytes,
    stage_compute_ms,
    stage_memory_bytes,
    stage_static_bytes,
    synthetic_profile,
    synthetic_tensor_parallel,
)
from planner.errors import InputError
from planner.plan import StageSpec, parse_stages
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.schedule import family
from planner.simulate import lower_bound_ms, simulate
from planner.simulate.tables import with_message_overheads
from planner.topology import topology_from_dict, uniform_topology


def _three_stage_profile() -> Profile:
    """Six layers with distinct sizes so that every term of the memory sum is visible."""
    params = [100, 200, 300, 400, 500, 600]
    layers = [Layer(f"l{i}", p // 4, p, 2 * p) for i, p in enumerate(params)]
    saved = [10, 20, 30, 40, 50, 60]
    timings = [LayerTiming(1.0, 2.0, 1.0, 1.0, 7 * (i + 1), saved[i]) for i in range(6)]
    return Profile("hand", layers, [Measurement(1, 5, timings)])


STAGES3 = "0-1:a;2-3:b;4-5:c"
# Property-test examples; raise it for a long hunt: SIM_EXAMPLES=2000 pytest tests/test_simulate.py
_EXAMPLES = int(os.environ.get("SIM_EXAMPLES", "40"))


def test_memory_matches_a_hand_computation_1f1b() -> None:
    prof = _three_stage_profile()
    result = simulate(prof, None, parse_stages(STAGES3), "1f1b", 6)
    # Static = weights + gradients (same size) + optimizer state (2x weights) = 4x weights.
    # Stage 0: layers 0-1, weights 300 -> 1200; stashed 10+20 = 30 per microbatch, 3 in flight.
    # Stage 1: layers 2-3, weights 700 -> 2800; stashed 70, 2 in flight.
    # Stage 2: layers 4-5, weights 1100 -> 4400; stashed 110, 1 in flight.
    assert result.memory_bytes == {"a": 1200 + 3 * 30, "b": 2800 + 2 * 70, "c": 4400 + 110}


def test_memory_matches_a_hand_computation_2bw_and_gpipe() -> None:
    prof = _three_stage_profile()
    stages = parse_stages(STAGES3)
    two = simulate(prof, None, stages, "2bw", 6)
    # 2BW adds a second weight version (300, 700, 1100) to 1F1B's memory.
    assert two.memory_bytes == {"a": 1500 + 90, "b": 3500 + 140, "c": 5500 + 110}
    gp = simulate(prof, None, stages, "gpipe", 6)
    assert gp.memory_bytes == {"a": 1200 + 6 * 30, "b": 2800 + 6 * 70, "c": 4400 + 6 * 110}


def test_memory_with_recompute_keeps_only_stage_inputs() -> None:
    prof = _three_stage_profile()
    stages = parse_stages(STAGES3, recompute=[1])
    result = simulate(prof, None, stages, "1f1b", 6)
    # Stage 1 keeps its input (layer 1's output, 14 bytes) for 2 microbatches, plus one
    # microbatch's full activations (70) while its backward re-runs the forward.
    assert result.memory_bytes["b"] == 2800 + 2 * 14 + 70
    assert stage_memory_bytes(prof, 2, 3, 1, 2, recompute=True) == 2800 + 2 * 14 + 70
    assert stage_activation_bytes(prof, 2, 3, 1, recompute=True) == 14
    f, b = stage_compute_ms(prof, 2, 3, 1, recompute=True)
    assert (f, b) == (2.0, 6.0)
    # And recompute costs a forward in time: 1f1b with a slower middle stage.
    plain = simulate(prof, None, parse_stages(STAGES3), "1f1b", 6)
    assert result.iteration_ms > plain.iteration_ms


def test_cost_helpers_agree_with_the_simulator() -> None:
    prof = _three_stage_profile()
    result = simulate(prof, None, parse_stages(STAGES3), "1f1b", 6)
    for s, (first, last) in enumerate([(0, 1), (2, 3), (4, 5)]):
        dev = "abc"[s]
        assert result.static_bytes[dev] == stage_static_bytes(prof, first, last)
        assert result.memory_bytes[dev] == stage_memory_bytes(prof, first, last, 1, 3 - s)
    assert stage_memory_bytes(prof, 0, 1, 1, 3, weight_versions=2) == 1500 + 90


def test_transfers_cost_latency_plus_bytes_over_bandwidth() -> None:
    prof = synthetic_profile(
        2, forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0, output_bytes=10**6
    )
    topo = topology_from_dict(
        {
            "devices": [{"name": "a", "memory": "1 GiB"}, {"name": "b", "memory": "1 GiB"}],
            "links": [{"between": ["a", "b"], "bandwidth": "1 GB/s", "latency": "10 us"}],
        }
    )
    result = simulate(prof, topo, parse_stages("0:a;1:b"), "gpipe", 1)
    hop = 0.01 + 1.0  # 10 us + 1 MB at 1 GB/s = 1 ms
    assert result.iteration_ms == pytest.approx(1 + hop + 1 + 2 + hop + 2)
    assert [t.kind for t in result.transfers] == ["F", "B"]
    assert result.lower_bound_ms == pytest.approx(result.iteration_ms)


def test_a_message_costs_each_end_its_device_s_overhead() -> None:
    """``message_overhead`` (a CPU process's own time per message it sends or receives) is
    added to the sending and to the receiving action, not to the link; stages on one
    device exchange no message."""
    prof = synthetic_profile(
        2, forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0, output_bytes=10**6
    )
    device = {"memory": "1 GiB", "message_overhead": "500 us"}
    topo = topology_from_dict(
        {
            "devices": [{"name": "a", **device}, {"name": "b", **device}],
            "links": [{"between": ["a", "b"], "bandwidth": "1 GB/s", "latency": "10 us"}],
        }
    )
    result = simulate(prof, topo, parse_stages("0:a;1:b"), "gpipe", 1)
    hop = 0.01 + 1.0
    assert result.iteration_ms == pytest.approx(1.5 + hop + 1.5 + 2.5 + hop + 2.5)
    times = {(0, "a"): (1.0, 2.0, 1.0, 1.0), (1, "a"): (1.0, 2.0, 1.0, 1.0)}
    one = parse_stages("0:a;1:a")
    assert with_message_overheads(times, topo, one, [0, 10**6]) == times
    two = parse_stages("0:a;1:b")
    both = with_message_overheads(times, topo, two, [0, 10**6])
    assert both[(0, "a")] == (1.5, 2.5, 1.5, 1.0)  # W exchanges nothing
    assert topology_from_dict(topo.to_dict()).devices == topo.devices


def test_a_tensor_parallel_group_pays_its_slowest_member_s_overhead() -> None:
    """The group's times are its leader's: the overhead is the members' largest, whatever
    the order the members are written in."""
    prof = synthetic_tensor_parallel(synthetic_profile(4, output_bytes=10**6), degrees=(2,))
    slow = {"memory": "1 GiB", "message_overhead": "5 ms"}
    fast = {"memory": "1 GiB"}
    topo = topology_from_dict(
        {
            "devices": [
                {"name": "c0", **fast},
                {"name": "c1", **slow},
                {"name": "c2", **fast},
                {"name": "c3", **slow},
            ],
            "switches": ["sw"],
            "links": [{"between": ["c{0..3}", "sw"], "bandwidth": "1 GB/s"}],
        }
    )
    times = [
        simulate(prof, topo, parse_stages(text), "1f1b", 4).iteration_ms
        for text in ("0-1:c0+c1;2-3:c2+c3", "0-1:c1+c0;2-3:c3+c2")
    ]
    free = simulate(prof, None, parse_stages("0-1:c0+c1;2-3:c2+c3"), "1f1b", 4).iteration_ms
    assert times[0] == pytest.approx(times[1])
    assert times[0] > free + 4 * 2 * 5.0  # every F and B of both stages pays 5 ms at least


def test_a_link_carries_one_transfer_at_a_time() -> None:
    # Forwards take no time, so both activations want the link at t = 0 and 0 + f.
    prof = synthetic_profile(
        2, forward_ms=0.0, backward_input_ms=1.0, backward_weight_ms=0.0, output_bytes=10**6
    )
    topo = topology_from_dict(
        {
            "devices": [{"name": "a", "memory": "1 GiB"}, {"name": "b", "memory": "1 GiB"}],
            "links": [{"between": ["a", "b"], "bandwidth": "1 GB/s"}],
        }
    )
    result = simulate(prof, topo, parse_stages("0:a;1:b"), "gpipe", 2)
    forward = sorted((t.start_ms, t.end_ms) for t in result.transfers if t.kind == "F")
    assert forward == [pytest.approx((0.0, 1.0)), pytest.approx((1.0, 2.0))]


def test_replicated_stage_pays_for_its_all_reduce() -> None:
    prof = synthetic_profile(2, param_bytes=10**7)
    topo = uniform_topology(3, bandwidth=10e9)
    stages = parse_stages("0:gpu0,gpu1;1:gpu2")
    result = simulate(prof, topo, stages, "1f1b", 4)
    reduces = [e for e in result.events if e.kind == "ALLREDUCE"]
    assert {e.device for e in reduces} == {"gpu0", "gpu1"}
    expected = topo.allreduce_ms(["gpu0", "gpu1"], 10**7)
    assert expected > 0
    assert all(e.end_ms - e.start_ms == pytest.approx(expected) for e in reduces)
    # Microbatch k of stage 0 runs on replica k % 2.
    f0 = {e.microbatch: e.device for e in result.events if e.kind == "F" and e.stage == 0}
    assert f0 == {0: "gpu0", 1: "gpu1", 2: "gpu0", 3: "gpu1"}


def test_slower_devices_show_in_compute_time() -> None:
    prof = synthetic_profile(2)
    fast = uniform_topology(2, speed=1.0)
    slow = uniform_topology(2, speed=0.5)
    stages = parse_stages("0:gpu0;1:gpu1")
    assert simulate(prof, slow, stages, "1f1b", 4).busy_ms["gpu0"] == pytest.approx(
        2 * simulate(prof, fast, stages, "1f1b", 4).busy_ms["gpu0"]
    )


_SCHEDULE = st.sampled_from(GENERATED)


@settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    cuts=st.lists(st.integers(1, 7), min_size=0, max_size=3, unique=True),
    schedule=_SCHEDULE,
    m=st.integers(1, 9),
    bw_factor=st.sampled_from([1.0, 0.7, 0.5, 0.1]),
    speed_factor=st.sampled_from([1.0, 0.8, 0.5]),
    replicate=st.booleans(),
    times=st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), min_size=8, max_size=8),
)
def test_slower_links_or_devices_never_shorten_the_iteration(  # type: ignore[no-untyped-def]
    cuts, schedule, m, bw_factor, speed_factor, replicate, times
) -> None:
    prof = synthetic_profile(8, output_bytes=4 * 10**6, param_bytes=10**6)
    for t, ms in zip(prof.measurements[0].layers, times, strict=True):
        t.forward_ms, t.backward_input_ms, t.backward_weight_ms = ms, ms, ms / 2
        t.backward_ms = 1.5 * ms
    bounds = [0, *sorted(cuts), 8]
    n = len(bounds) - 1
    topo = uniform_topology(n + 1, bandwidth=20e9, latency_ms=0.005)
    stages = [StageSpec(i, (bounds[i], bounds[i + 1] - 1), [f"gpu{i}"]) for i in range(n)]
    if replicate and m >= 2:
        last = stages[-1]
        stages[-1] = StageSpec(last.id, last.layers, (*last.devices, f"gpu{n}"))
    base = simulate(prof, topo, stages, schedule, m)
    slower = topo.scaled(bandwidth=bw_factor, speed=speed_factor)
    worse = simulate(prof, slower, stages, schedule, m)
    assert worse.iteration_ms >= base.iteration_ms - 1e-9
    assert base.lower_bound_ms <= base.iteration_ms + 1e-9


def _star(speeds: list[float], bandwidths: list[float]) -> object:
    """Devices on one switch, each with its own speed and link bandwidth (GB/s)."""
    return topology_from_dict(
        {
            "devices": [
                {"name": f"gpu{i}", "memory": "80 GiB", "speed": sp} for i, sp in enumerate(speeds)
            ],
            "switches": ["sw"],
            "links": [
                {"between": [f"gpu{i}", "sw"], "bandwidth": f"{bw} GB/s", "latency": "2 us"}
                for i, bw in enumerate(bandwidths)
            ],
        }
    )


@settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    cuts=st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True),
    schedule=st.sampled_from(BUILT),
    m=st.sampled_from([2, 4, 6, 8]),
    which=st.integers(0, 3),
    slow_link=st.booleans(),
    factor=st.sampled_from([0.9, 0.5, 0.2]),
    speeds=st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=4, max_size=4),
    bws=st.lists(st.sampled_from([2, 10, 50]), min_size=4, max_size=4),
)
def test_one_slower_link_or_device_never_shortens_the_iteration(  # type: ignore[no-untyped-def]
    cuts, schedule, m, which, slow_link, factor, speeds, bws
) -> None:
    prof = synthetic_profile(6, output_bytes=10**7, forward_ms=1.0)
    bounds = [0, *sorted(cuts), 6]
    n = len(bounds) - 1
    devices = [f"gpu{i % 4}" for i in range(n)]
    if family(schedule).interleaved:
        if n % 2 or m % (n // 2):
            return
        devices = family(schedule).place([f"gpu{i}" for i in range(n // 2)], 2)
    elif n > 4:
        return
    stages = [StageSpec(i, (bounds[i], bounds[i + 1] - 1), [devices[i]]) for i in range(n)]
    base = simulate(prof, _star(speeds, bws), stages, schedule, m)
    if slow_link:
        bws = [bw * factor if i == which else bw for i, bw in enumerate(bws)]
    else:
        speeds = [sp * factor if i == which else sp for i, sp in enumerate(speeds)]
    worse = simulate(prof, _star(speeds, bws), stages, schedule, m)
    assert worse.iteration_ms >= base.iteration_ms - 1e-9


def test_lower_bound_terms() -> None:
    prof = synthetic_profile(4, forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0)
    stages = parse_stages("0-2:a;3:b")
    # Busiest device: a runs 3 layers x 3 ms x 4 microbatches.
    assert lower_bound_ms(prof, None, stages, 4, 1) == 36.0
    # One microbatch: the whole critical path, 4 layers x 3 ms.
    assert lower_bound_ms(prof, None, parse_stages("0:a;1:b;2:c;3:d"), 1, 1) == 12.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0-1:a;3-5:b", "gap: layers 2..2 belong to no stage"),
        ("0-2:a;2-5:b", "overlap: layers 2..2"),
        ("0-1:a;2-4:b", "gap: layers 5..5"),
        ("0-1:a;2-6:b", "layer 6 does not exist"),
        ("0-1:a;2-5:a", "device 'a' is also in stage 0"),
        ("0-1:a,a;2-5:b", "listed twice"),
        ("3-1:a;2-5:b", "first layer 3 is after last layer 1"),
    ],
)
def test_bad_partitions_are_rejected(text: str, message: str) -> None:
    prof = synthetic_profile(6)
    with pytest.raises(InputError, match=message):
        simulate(prof, None, parse_stages(text), "1f1b", 4)


def test_unknown_devices_are_named() -> None:
    prof = synthetic_profile(4)
    with pytest.raises(InputError, match="unknown device 'gpu9'"):
        simulate(prof, uniform_topology(2), parse_stages("0-1:gpu0;2-3:gpu9"), "1f1b", 4)


def test_unprofiled_microbatch_size_is_rejected() -> None:
    with pytest.raises(InputError, match="profiled sizes are"):
        simulate(synthetic_profile(2), None, parse_stages("0:a;1:b"), "1f1b", 4, 3)


def test_events_off_gives_the_same_numbers() -> None:
    prof = synthetic_profile(4)
    stages = parse_stages("0:gpu0;1:gpu1;2:gpu2;3:gpu3")
    topo = uniform_topology(4)
    a = simulate(prof, topo, stages, "zb", 8)
    b = simulate(prof, topo, stages, "zb", 8, events=False)
    assert (a.iteration_ms, a.memory_bytes, a.busy_ms) == (
        b.iteration_ms,
        b.memory_bytes,
        b.busy_ms,
    )
    assert b.events == [] and a.events


def test_zb_halves_stay_as_profiled_when_the_split_costs_more_than_the_whole() -> None:
    # torch's split backward walks the graph twice: on small layers its halves add up to
    # more than the whole backward (1.06-1.4x on the examples). The runtime pays the sum,
    # so the halves are not scaled down; stages that run the whole backward pay the whole.
    import dataclasses

    from planner.cost import stage_times

    prof = synthetic_profile(4, forward_ms=1.0, backward_input_ms=2.0, backward_weight_ms=3.0)
    m = prof.measurements[0]
    layers = [dataclasses.replace(t, backward_ms=4.0) for t in m.layers]
    prof = dataclasses.replace(prof, measurements=[dataclasses.replace(m, layers=layers)])
    middle = stage_times(prof, 1, 2, 1)
    assert (middle.backward_ms, middle.input_grad_ms, middle.weight_grad_ms) == (8.0, 4.0, 6.0)
    first = stage_times(prof, 0, 1, 1)
    assert (first.input_grad_ms, first.weight_grad_ms) == (8.0, 0.0)
    result = simulate(prof, None, parse_stages("0-1:a;2-3:b"), "zb", 4, 1)
    busy_b = 4 * (2 * 1.0 + 4.0 + 6.0)
    assert result.busy_ms["b"] == pytest.approx(busy_b)


def test_zb_times_first_and_recompute_stages_as_the_runtime_runs_them() -> None:
    # planner/runtime/stage.py runs the first stage's and a recompute stage's whole
    # backward in I (nothing left for W); a middle stage splits it.
    from planner.cost import stage_times

    prof = synthetic_profile(6, forward_ms=1.0, backward_input_ms=2.0, backward_weight_ms=3.0)
    first = stage_times(prof, 0, 1, 1)
    assert (first.input_grad_ms, first.weight_grad_ms) == (10.0, 0.0)
    middle = stage_times(prof, 2, 3, 1)
    assert (middle.input_grad_ms, middle.weight_grad_ms) == (4.0, 6.0)
    recomputed = stage_times(prof, 2, 3, 1, recompute=True)
    assert (recomputed.input_grad_ms, recomputed.weight_grad_ms) == (12.0, 0.0)
    assert recomputed.backward_ms == 12.0
    stages = parse_stages("0-1:a;2-3:b;4-5:c", recompute=[2])
    result = simulate(prof, None, stages, "zb", 4, 1)
    durations: dict[tuple[str, int], set[float]] = {}
    for e in result.events:
        if e.kind in ("I", "W"):
            durations.setdefault((e.kind, e.stage), set()).add(round(e.end_ms - e.start_ms, 9))
    assert durations[("I", 0)] == {10.0} and durations.get(("W", 0), {0.0}) == {0.0}
    assert durations[("I", 1)] == {4.0} and durations[("W", 1)] == {6.0}
    assert durations[("I", 2)] == {12.0} and durations.get(("W", 2), {0.0}) == {0.0}
