"""Tensor, sequence and sharded data parallelism in the simulator: closed forms computed by
hand, collectives on the group's real links, members mirroring their leader, refusals,
and properties (plain paths unchanged, more bandwidth never slower)."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from families import GENERATED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_dp import random_profile

from planner.cost import synthetic_profile, synthetic_tensor_parallel
from planner.errors import InputError
from planner.profile.schema import profile_from_dict
from planner.profile.sharding import Collective, ShardTiming
from planner.profile.tied import TiedParameter
from planner.schedule import build_schedule, validate_schedule
from planner.schedule.groups import unmirror
from planner.simulate import simulate
from planner.simulate.group_comm import group_transfer_ms
from planner.simulate.tables import with_message_overheads
from planner.solve.bounds import search_bound_ms
from planner.stages import StageSpec, parse_stages, reshards, with_parallelism
from planner.topology import Topology, load_topology, topology_from_dict, uniform_topology

ROOT = Path(__file__).resolve().parents[1]
_EXAMPLES = int(os.environ.get("SIM_EXAMPLES", "30"))
N = 8 * 2**20  # a block's b * s * h bytes
BW = 50e9


def _profile(**kw: float) -> object:
    """Four blocks: forward 1, backward 1 + 1 ms; TP entries for degrees 2 and 4."""
    base = synthetic_profile(
        4,
        output_bytes=N,
        param_bytes=4 * 2**20,
        saved_bytes=2**20,
        optimizer_state_bytes=2**23,
        **kw,
    )
    return synthetic_tensor_parallel(base, (2, 4))


def _ring2_ms(latency_ms: float, bandwidth: float, nbytes: float) -> float:
    """A two-device ring all-reduce by hand: 2 (n - 1) = 2 steps of half the bytes."""
    return 2 * (latency_ms + nbytes / 2 / bandwidth * 1e3)


def test_one_tp2_stage_is_half_the_compute_plus_four_allreduces_per_block() -> None:
    prof = _profile()
    topo = uniform_topology(2, bandwidth=BW)  # gpu - switch - gpu, no latency
    m = 4
    plain = simulate(prof, topo, "0-3:gpu0", "1f1b", m)
    tp = simulate(prof, topo, "0-3:gpu0+gpu1", "1f1b", m)
    ar = _ring2_ms(0.0, BW, N)
    # Per microbatch: 4 blocks x (0.5 forward + 1 backward) ms and 2 all-reduces per block
    # in each pass.
    assert plain.iteration_ms == pytest.approx(m * 4 * 3.0)
    assert tp.iteration_ms == pytest.approx(m * (4 * 1.5 + 4 * 4 * ar), rel=1e-12)
    assert tp.groups == {"gpu0": ("gpu0", "gpu1")} and tp.label("gpu0") == "gpu0+gpu1"
    # Every member holds its shard: weights, gradients, state / 2; one block's stash / 2.
    static = 4 * (2 * 2**20 + 2 * 2**20 + 2**22)
    assert tp.memory_bytes == {"gpu0": static + 4 * 2**19, "gpu1": static + 4 * 2**19}
    assert tp.busy_ms["gpu1"] == tp.busy_ms["gpu0"] and set(tp.memory_limit_bytes) == {
        "gpu0",
        "gpu1",
    }
    assert tp.lower_bound_ms == pytest.approx(tp.iteration_ms, rel=1e-12)


def test_sequence_parallel_pairs_cost_what_the_allreduces_cost() -> None:
    prof = _profile()
    stages = parse_stages("0-3:gpu0+gpu1")
    sp = with_parallelism(stages, sequence_parallel=True)
    shard = prof.measurements[0].layers[0].sharded
    per_rank = [sum(c.ring_bytes(2) for c in shard[key].collectives) for key in ("tp2", "tp2-sp")]
    # Per block: two all-reduces per pass, each 2 (t - 1) / t * N per rank.
    assert per_rank[0] == per_rank[1] == 2 * 2 * N
    topo = uniform_topology(2, bandwidth=BW, latency_ms=0.0)
    a = simulate(prof, topo, stages, "1f1b", 4)
    b = simulate(prof, topo, sp, "1f1b", 4)
    assert b.iteration_ms == pytest.approx(a.iteration_ms, rel=1e-12)
    # Sequence parallelism stashes and sends 1 / t of the activations at a cut.
    two = parse_stages("0-1:gpu0+gpu1;2-3:gpu2+gpu3")
    topo4 = uniform_topology(4, bandwidth=BW)
    whole = simulate(prof, topo4, two, "gpipe", 2)
    split = simulate(prof, topo4, with_parallelism(two, sequence_parallel=True), "gpipe", 2)
    assert [t.nbytes for t in whole.transfers][:1] == [N]
    assert [t.nbytes for t in split.transfers][:1] == [N // 2]


def test_zero1_shards_the_optimizer_state_and_the_step() -> None:
    prof = _profile(optimizer_ms=1.0)
    topo = uniform_topology(2, bandwidth=BW)
    stages = parse_stages("0-3:gpu0,gpu1")
    plain = simulate(prof, topo, stages, "1f1b", 4)
    zero = simulate(prof, topo, with_parallelism(stages, sharding="zero1"), "1f1b", 4)
    params, state = 4 * 4 * 2**20, 4 * 2**23
    gather = _ring2_ms(0.0, BW, params) / 2  # an all-gather: half the ring all-reduce
    assert plain.step_ms == [pytest.approx(4.0)]
    assert zero.step_ms == [pytest.approx(4.0 / 2 + gather, rel=1e-12)]
    # The reduce-scatter before the step and the gather after it move what the all-reduce
    # did: the iteration is shorter by half the step.
    assert zero.iteration_ms == pytest.approx(plain.iteration_ms - 2.0, rel=1e-12)
    assert plain.memory_bytes["gpu0"] - zero.memory_bytes["gpu0"] == state // 2


def test_fsdp_holds_shards_between_steps_and_the_whole_stage_during_one() -> None:
    prof = _profile(optimizer_ms=1.0)
    topo = uniform_topology(4, bandwidth=BW)
    stages = parse_stages("0-3:gpu0,gpu1,gpu2,gpu3")
    fsdp = with_parallelism(stages, sharding="fsdp")
    zero = simulate(prof, topo, with_parallelism(stages, sharding="zero1"), "gpipe", 8)
    res = simulate(prof, topo, fsdp, "gpipe", 8)
    params, state = 4 * 4 * 2**20, 4 * 2**23
    sharded = (2 * params + state) // 4
    stash = 2 * 4 * 2**20  # gpipe on one stage: each replica's two microbatches in flight
    assert res.static_bytes["gpu3"] == sharded
    assert res.memory_bytes["gpu3"] == sharded + 2 * params + stash
    curve = res.memory_timeline["gpu0"]
    assert curve[0][1] == curve[-1][1] == sharded  # given back after the reduce-scatter
    # One gather per iteration (at the first forward), one reduce-scatter, the step / 4:
    # the same communication as ZeRO-1's, elsewhere.
    assert res.iteration_ms == pytest.approx(zero.iteration_ms, rel=1e-12)
    first, second = (
        e.end_ms - e.start_ms for e in res.events if e.device == "gpu0" and e.kind == "F"
    )
    gather = topo.allreduce_ms(["gpu0", "gpu1", "gpu2", "gpu3"], params) / 2
    assert first - second == pytest.approx(gather, rel=1e-12)


def _two_node() -> object:
    return load_topology(ROOT / "topologies" / "two-node-ib.yaml")


def test_a_group_across_the_slow_link_costs_what_the_link_says() -> None:
    prof = _profile()
    m = 4
    topo = _two_node()
    inside = simulate(prof, topo, "0-3:gpu0+gpu1", "1f1b", m)
    across = simulate(prof, topo, "0-3:gpu0+gpu8", "1f1b", m)
    # Inside a node: two 450 GB/s NVSwitch links of 1 us; across: two 400 Gbit/s NIC links
    # of 2.5 us (two-node-ib.yaml).
    nvswitch = _ring2_ms(2 * 1e-3, 450e9, N)
    infiniband = _ring2_ms(2 * 2.5e-3, 400e9 / 8, N)
    per_pass = 4 * 2  # all-reduces per pass: 2 per block
    expected = m * 2 * per_pass * (infiniband - nvswitch)
    assert across.iteration_ms - inside.iteration_ms == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("name", "fast", "slow"),
    [
        ("nvlink-pairs", "gpu0+gpu1", "gpu0+gpu2"),  # NVLink bridge against PCIe
        ("dgx1-v100", "gpu0+gpu3", "gpu0+gpu5"),  # two NVLinks against none (relayed)
        ("two-node-ib", "gpu0+gpu1", "gpu0+gpu8"),
    ],
)
def test_the_fabric_decides_which_groups_are_fast(name: str, fast: str, slow: str) -> None:
    prof = _profile()
    topo = load_topology(ROOT / "topologies" / f"{name}.yaml")
    a = simulate(prof, topo, f"0-3:{fast}", "1f1b", 4)
    b = simulate(prof, topo, f"0-3:{slow}", "1f1b", 4)
    ar = [topo.allreduce_ms(g.split("+"), N) for g in (fast, slow)]
    assert ar[1] > ar[0]
    assert b.iteration_ms - a.iteration_ms == pytest.approx(4 * 16 * (ar[1] - ar[0]), rel=1e-9)


def test_members_send_to_members_and_share_the_links_they_share() -> None:
    # Two switches joined by one 10 GB/s link: gpu0 -> gpu2 and gpu1 -> gpu3 both cross it.
    topo = topology_from_dict(
        {
            "devices": [{"name": f"gpu{i}", "memory": "80 GiB"} for i in range(4)],
            "switches": ["a", "b"],
            "links": [
                {"between": ["gpu0", "a"], "bandwidth": "100 GB/s", "latency": "0 us"},
                {"between": ["gpu1", "a"], "bandwidth": "100 GB/s", "latency": "0 us"},
                {"between": ["gpu2", "b"], "bandwidth": "100 GB/s", "latency": "0 us"},
                {"between": ["gpu3", "b"], "bandwidth": "100 GB/s", "latency": "0 us"},
                {"between": ["a", "b"], "bandwidth": "10 GB/s", "latency": "1 us"},
            ],
        }
    )
    one = group_transfer_ms(topo, ["gpu0"], ["gpu2"], N)
    both = group_transfer_ms(topo, ["gpu0", "gpu1"], ["gpu2", "gpu3"], N)
    assert one == pytest.approx(topo.transfer_ms("gpu0", "gpu2", N), rel=1e-12)
    assert both == pytest.approx(1e-3 + 2 * N / 10e9 * 1e3, rel=1e-12)
    prof = _profile()
    res = simulate(prof, topo, "0-1:gpu0+gpu1;2-3:gpu2+gpu3", "gpipe", 1)
    (forward,) = [t for t in res.transfers if t.kind == "F"]
    assert (forward.src, forward.dst) == ("gpu0", "gpu2")
    assert forward.end_ms - forward.start_ms == pytest.approx(both, rel=1e-12)


def test_every_member_runs_its_leaders_list_with_its_own_peers() -> None:
    stages = parse_stages("0-1:gpu0+gpu1,gpu2+gpu3;2-3:gpu4+gpu5")
    sched = build_schedule("1f1b", stages, 4)
    lists = sched.devices
    assert list(lists) == [f"gpu{i}" for i in range(6)]
    assert [str(a) for a in lists["gpu0"][:2]] == ["F0.0", "SEND_F0.0->gpu4"]
    assert [str(a) for a in lists["gpu1"][:2]] == ["F0.0", "SEND_F0.0->gpu5"]
    assert [str(a) for a in lists["gpu5"][:2]] == ["RECV_F1.0<-gpu1", "F1.0"]
    assert "ALLREDUCE0" in [str(a) for a in lists["gpu3"]]
    validate_schedule(sched, stages)
    broken = {d: list(acts) for d, acts in lists.items()}
    broken["gpu3"][1] = broken["gpu3"][1]._replace(peer="gpu4")
    with pytest.raises(InputError, match="mirror of its group leader") as info:
        unmirror(broken, stages, source="plan.json")
    assert info.value.field == "schedule.devices.gpu3[1]" and info.value.file == "plan.json"


def test_what_cannot_be_timed_is_refused_with_one_line() -> None:
    prof = _profile()
    with pytest.raises(InputError, match="no entries for degree 8") as info:
        simulate(prof, None, "0-3:a+b+c+d+e+f+g+h", "1f1b", 4)
    assert info.value.field == "stages[0].tensor_parallel"
    plain = synthetic_profile(4)
    with pytest.raises(InputError, match="it has: none"):
        simulate(plain, None, "0-3:a+b", "1f1b", 4)
    no_sp = synthetic_tensor_parallel(plain, (2,), sequence_parallel=False)
    sp = with_parallelism(parse_stages("0-3:a+b"), sequence_parallel=True)
    with pytest.raises(InputError, match="with sequence parallelism"):
        simulate(no_sp, None, sp, "1f1b", 4)
    tied = dataclasses.replace(prof, tied_parameters=[TiedParameter("embed", (0, 3), 10, 40)])
    with pytest.raises(InputError, match="tied parameter 'embed'"):
        simulate(tied, None, "0-1:a+b;2-3:c+d", "1f1b", 4)
    zero = with_parallelism(parse_stages("0-1:a,b;2-3:c,d"), sharding="zero1")
    with pytest.raises(InputError, match="two weight versions") as info:
        simulate(prof, None, zero, "2bw", 4)
    assert info.value.field == "stages[0].sharding"
    weightless = synthetic_profile(2, param_bytes=0, optimizer_state_bytes=0)
    with pytest.raises(InputError, match="nothing to shard"):
        simulate(
            weightless, None, with_parallelism(parse_stages("0-1:a,b"), sharding="fsdp"), "1f1b", 4
        )


def test_a_measured_style_profile_round_trips_and_simulates() -> None:
    prof = _profile()
    again = profile_from_dict(prof.to_dict(), source="tp.json")  # the strict reader
    stages = parse_stages("0-1:gpu0+gpu1;2-3:gpu2+gpu3")
    topo = uniform_topology(4, bandwidth=BW, latency_ms=0.002)
    a = simulate(prof, topo, stages, "zb", 4)
    b = simulate(again, topo, stages, "zb", 4)
    assert a.iteration_ms == b.iteration_ms and a.memory_bytes == b.memory_bytes


def _whole_shards(profile: object) -> object:
    """TP entries equal to the whole layers, without collectives: a group then times as a
    single device."""
    prof = synthetic_tensor_parallel(profile, (2,), sequence_parallel=False)  # type: ignore[arg-type]
    for layer in prof.layers:
        s = layer.sharded["tp2"]
        layer.sharded["tp2"] = dataclasses.replace(
            s,
            param_count=layer.param_count,
            param_bytes=layer.param_bytes,
            optimizer_state_bytes=layer.optimizer_state_bytes,
            optimizer_ms=layer.optimizer_ms,
        )
    for m in prof.measurements:
        for t in m.layers:
            t.sharded["tp2"] = ShardTiming(
                t.forward_ms,
                t.backward_ms,
                t.backward_input_ms,
                t.backward_weight_ms,
                t.output_bytes,
                t.saved_bytes,
                t.workspace_bytes,
            )
    return prof


_CASE = {
    "cuts": st.lists(st.integers(1, 5), min_size=0, max_size=2, unique=True),
    "schedule": st.sampled_from([s for s in GENERATED if s != "interleaved"]),
    "m": st.sampled_from([2, 4, 6]),
    "replicas": st.sampled_from([1, 2]),
    "times": st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), min_size=6, max_size=6),
}


def _case(cuts, replicas, times, t=2, names=None):  # type: ignore[no-untyped-def]
    """Six layers of the given times cut at ``cuts``, each stage on ``replicas`` groups of
    ``t`` devices taken in order from ``names`` (default gpu0, gpu1, ...)."""
    prof = synthetic_profile(6, output_bytes=4 * 10**6, param_bytes=10**6, optimizer_ms=0.2)
    for timing, ms in zip(prof.measurements[0].layers, times, strict=True):
        timing.forward_ms, timing.backward_input_ms, timing.backward_weight_ms = ms, ms, ms / 2
        timing.backward_ms = 1.5 * ms
    bounds = [0, *sorted(cuts), 6]
    names = iter(names or [f"gpu{i}" for i in range(16)])
    stages = []
    for i in range(len(bounds) - 1):
        devices = tuple(next(names) for _ in range(replicas * t))
        stages.append(StageSpec(i, (bounds[i], bounds[i + 1] - 1), devices, tensor_parallel=t))
    return prof, stages


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASE)
def test_a_group_of_whole_layers_times_as_its_leader_alone(  # type: ignore[no-untyped-def]
    cuts, schedule, m, replicas, times
) -> None:
    prof, stages = _case(cuts, replicas, times)
    if replicas > m:
        return
    topo = uniform_topology(16, bandwidth=20e9, latency_ms=0.005)
    grouped = simulate(_whole_shards(prof), topo, stages, schedule, m, events=False)
    alone = [StageSpec(s.id, s.layers, s.leaders) for s in stages]
    single = simulate(prof, topo, alone, schedule, m, events=False)
    # The same compute on the leader; the members' transfers on their own links, as fast.
    assert grouped.iteration_ms == pytest.approx(single.iteration_ms, rel=1e-12)
    assert grouped.memory_bytes["gpu1"] == single.memory_bytes["gpu0"]


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASE)
def test_tensor_parallel_entries_leave_plain_stages_unchanged(  # type: ignore[no-untyped-def]
    cuts, schedule, m, replicas, times
) -> None:
    topo = load_topology(ROOT / "topologies" / "hetero.yaml")
    prof, stages = _case(cuts, replicas, times, t=1, names=topo.device_names())
    if replicas > m:
        return
    with_tp = synthetic_tensor_parallel(prof, (2, 4))
    a = simulate(prof, topo, stages, schedule, m)
    b = simulate(with_tp, topo, stages, schedule, m)
    assert (a.iteration_ms, a.memory_bytes, a.raw_events) == (
        b.iteration_ms,
        b.memory_bytes,
        b.raw_events,
    )


def _star(bandwidths: list[float]) -> object:
    return topology_from_dict(
        {
            "devices": [{"name": f"gpu{i}", "memory": "80 GiB"} for i in range(len(bandwidths))],
            "switches": ["sw"],
            "links": [
                {"between": [f"gpu{i}", "sw"], "bandwidth": f"{bw} GB/s", "latency": "2 us"}
                for i, bw in enumerate(bandwidths)
            ],
        }
    )


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    **_CASE,
    sp=st.booleans(),
    sharding=st.sampled_from(["none", "zero1", "fsdp"]),
    which=st.integers(0, 7),
    bws=st.lists(st.sampled_from([2, 10, 50]), min_size=8, max_size=8),
)
def test_doubling_a_links_bandwidth_never_slows_a_plan(  # type: ignore[no-untyped-def]
    cuts, schedule, m, replicas, times, sp, sharding, which, bws
) -> None:
    prof, stages = _case(cuts[:1], replicas, times)
    if replicas > m or (sharding != "none" and (replicas == 1 or schedule == "2bw")):
        return
    stages = with_parallelism(stages, sequence_parallel=sp, sharding=sharding)
    prof = synthetic_tensor_parallel(prof, (2,))
    base = simulate(prof, _star(bws), stages, schedule, m, events=False)
    bws = [bw * 2 if i == which else bw for i, bw in enumerate(bws)]
    faster = simulate(prof, _star(bws), stages, schedule, m, events=False)
    assert faster.iteration_ms <= base.iteration_ms + 1e-9
    assert faster.lower_bound_ms <= faster.iteration_ms + 1e-9


def test_collectives_in_the_forward_are_run_again_under_recompute() -> None:
    prof = _profile()
    topo = uniform_topology(2, bandwidth=BW)
    stages = parse_stages("0-3:gpu0+gpu1")
    again = [stages[0].with_recompute(True)]
    a = simulate(prof, topo, stages, "1f1b", 2)
    b = simulate(prof, topo, again, "1f1b", 2)
    ar = _ring2_ms(0.0, BW, N)
    assert b.iteration_ms - a.iteration_ms == pytest.approx(2 * 4 * (0.5 + 2 * ar), rel=1e-12)
    assert Collective("reduce_scatter", N, "forward").ring_bytes(2) == N / 2


@pytest.mark.parametrize("schedule", ["interleaved", "optimized", "2bw"])
def test_every_family_runs_tensor_parallel_groups(schedule: str) -> None:
    prof = _profile()
    topo = uniform_topology(8, bandwidth=BW, latency_ms=0.002)
    text = "0:gpu0+gpu1;1:gpu2+gpu3;2:gpu0+gpu1;3:gpu2+gpu3"
    if schedule != "interleaved":
        text = "0-1:gpu0+gpu1;2-3:gpu2+gpu3"
    res = simulate(prof, topo, text, schedule, 4)
    assert set(res.memory_bytes) == {"gpu0", "gpu1", "gpu2", "gpu3"}
    assert res.lower_bound_ms <= res.iteration_ms + 1e-9
    validate_schedule(res.schedule, parse_stages(text))


def test_synthetic_entries_are_megatrons_counts_and_read_back() -> None:
    base = synthetic_profile(4, output_bytes=N, param_bytes=4 * 2**20, saved_bytes=2**20)
    prof = synthetic_tensor_parallel(base, (2, 4), replicated=[3])
    assert prof.tensor_parallel is not None and prof.tensor_parallel.keys() == [
        "tp2",
        "tp2-sp",
        "tp4",
        "tp4-sp",
    ]
    block, head = prof.measurements[0].layers[0].sharded, prof.measurements[0].layers[3].sharded
    assert [c.op for c in block["tp4"].collectives] == ["all_reduce"] * 4
    assert [c.op for c in block["tp4-sp"].collectives] == ["all_gather", "reduce_scatter"] * 4
    assert block["tp4"].forward_ms == 0.25 and block["tp4"].output_bytes == N
    assert block["tp4-sp"].output_bytes == N // 4 and block["tp4"].saved_bytes == 2**18
    assert head["tp4"].collectives == () and head["tp4"].forward_ms == 1.0
    assert head["tp4-sp"].forward_ms == 0.25  # a replicated layer on 1 / t of the sequence
    assert prof.layers[0].sharded["tp2"].param_bytes == 2 * 2**20
    assert prof.layers[3].sharded["tp2"].param_bytes == 4 * 2**20
    assert profile_from_dict(prof.to_dict(), source="tp.json").to_dict() == prof.to_dict()


def test_a_group_computes_at_its_slowest_members_speed() -> None:
    prof = _profile()
    topo = topology_from_dict(
        {
            "devices": [
                {"name": "fast", "memory": "80 GiB", "speed": 2.0},
                {"name": "slow", "memory": "80 GiB", "speed": 1.0},
            ],
            "switches": ["sw"],
            "links": [
                {"between": [d, "sw"], "bandwidth": "50 GB/s", "latency": "0 us"}
                for d in ("fast", "slow")
            ],
        }
    )
    res = simulate(prof, topo, "0-3:fast+slow", "1f1b", 4)
    ar = _ring2_ms(0.0, BW, N)
    assert res.iteration_ms == pytest.approx(4 * (4 * 1.5 / 1.0 + 16 * ar), rel=1e-12)


def test_the_reference_run_times_compute_only_so_link_order_ignores_bandwidth() -> None:
    from planner.simulate.grouped import leader_schedule
    from planner.simulate.tables import reference_durations, stage_tables

    prof = _profile()
    stages = with_parallelism(
        parse_stages("0-1:gpu0+gpu1,gpu2+gpu3;2-3:gpu4+gpu5,gpu6+gpu7"), sharding="fsdp"
    )
    sched = leader_schedule(build_schedule("1f1b", stages, 4), stages)
    refs = []
    for bandwidth in (BW, BW / 7):
        topo = uniform_topology(8, bandwidth=bandwidth, latency_ms=0.01)
        refs.append(reference_durations(stage_tables(prof, topo, stages, sched, 1, None), topo))
    assert refs[0] == refs[1]
    # Stage 0, two blocks of shards: forward 0.5, backward 1.0 each, all of it in I.
    assert refs[0][0][:4] == [1.0, 2.0, 2.0, 0.0]


def _random_grouped_plan(rng: random.Random, n: int, names: list[str]) -> list[StageSpec]:
    """A random partition of ``n`` layers into stages of groups of one degree, with random
    replicas, recompute, sequence parallelism and sharding."""
    t = rng.choice([2, 4])
    s = rng.randint(1, min(n, len(names) // t))
    cuts = sorted(rng.sample(range(n - 1), s - 1))
    bounds = [-1, *cuts, n - 1]
    pool = list(names)
    rng.shuffle(pool)
    sp = rng.random() < 0.5
    out, pos = [], 0
    for k in range(s):
        left = (len(pool) - pos) // t - (s - k - 1)
        r = rng.randint(1, max(1, min(2, left)))
        devices = tuple(pool[pos : pos + r * t])
        pos += r * t
        sharding = rng.choice(["none", "zero1", "fsdp"]) if r > 1 else "none"
        out.append(
            StageSpec(
                k,
                (bounds[k] + 1, bounds[k + 1]),
                devices,
                rng.random() < 0.2,
                tensor_parallel=t,
                sequence_parallel=sp,
                sharding=sharding,
            )
        )
    return out


@pytest.mark.parametrize("topo_name", ["hetero", "dgx1-v100", "two-node-ib", "nvlink-pairs"])
def test_bounds_stay_below_the_simulated_time_with_groups(topo_name: str) -> None:
    topo = load_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    checked = _bounds_below_simulated(topo, random.Random(topo_name), 40, _random_grouped_plan)
    assert len(checked) >= 20


def _bounds_below_simulated(
    topo: Topology,
    rng: random.Random,
    cases: int,
    plan: Callable[[random.Random, int, list[str]], list[StageSpec]],
) -> list[list[StageSpec]]:
    """``cases`` random TP profiles and ``plan``s on ``topo``: both lower bounds at or below
    the simulated time; the stages of each case simulated (2BW's refusals skipped)."""
    checked = []
    for case in range(cases):
        profile = synthetic_tensor_parallel(
            random_profile(rng.randint(2, 9), case, sizes=(1, 2)), (2, 4)
        )
        stages = plan(rng, profile.num_layers, topo.device_names())
        schedule = rng.choice([s for s in GENERATED if s != "interleaved"])
        m, mb = rng.choice([4, 6, 8]), rng.choice([1, 2])
        try:
            res = simulate(profile, topo, stages, schedule, m, mb, events=False)
        except InputError as exc:
            assert "2bw" in str(exc) or "weight versions" in str(exc), exc
            continue
        bound = search_bound_ms(profile, topo, stages, schedule, m, mb)
        assert res.lower_bound_ms <= res.iteration_ms + 1e-9
        assert bound <= res.iteration_ms + 1e-9, (stages, schedule, m, mb)
        checked.append(stages)
    return checked


def test_a_profile_changed_in_place_is_read_as_it_is_now() -> None:
    prof = _profile()
    first = simulate(prof, None, "0-3:a+b", "1f1b", 2).iteration_ms
    for m in prof.measurements:
        for t in m.layers:
            t.sharded["tp2"] = dataclasses.replace(t.sharded["tp2"], forward_ms=2.0)
    assert simulate(prof, None, "0-3:a+b", "1f1b", 2).iteration_ms == first + 2 * 4 * 1.5


@pytest.mark.parametrize(
    ("text", "forward", "backward"),
    [
        # TP2 -> TP1: gpu2 takes the output from gpu0; both members take its gradient from
        # gpu2, whose one uplink carries it twice.
        ("0-1:gpu0+gpu1;2-3:gpu2", 1, 2),
        # TP1 -> TP2: gpu0 sends its output to both members; gpu1 returns the gradient.
        ("0-1:gpu0;2-3:gpu1+gpu2", 2, 1),
    ],
)
def test_stages_of_different_degrees_exchange_replicated_values(
    text: str, forward: int, backward: int
) -> None:
    topo = uniform_topology(4, bandwidth=BW)
    res = simulate(_profile(), topo, text, "gpipe", 1)
    times = {t.kind: t.end_ms - t.start_ms for t in res.transfers}
    assert times["F"] == pytest.approx(forward * N / BW * 1e3, rel=1e-12)
    assert times["B"] == pytest.approx(backward * N / BW * 1e3, rel=1e-12)
    stages = parse_stages(text)
    first, second = (st.replica_groups[0] for st in stages)
    assert group_transfer_ms(topo, first, second, N) == pytest.approx(times["F"], rel=1e-12)
    assert group_transfer_ms(topo, second, first, N) == pytest.approx(times["B"], rel=1e-12)


def test_members_of_groups_of_different_sizes_send_to_every_member_they_serve() -> None:
    stages = parse_stages("0-1:gpu0+gpu1;2-3:gpu2")
    sched = build_schedule("1f1b", stages, 2)
    lists = {d: [str(a) for a in acts if a.peer] for d, acts in sched.devices.items()}
    assert lists["gpu0"][:2] == ["SEND_F0.0->gpu2", "SEND_F0.1->gpu2"]
    assert lists["gpu1"][:2] == ["RECV_B0.0<-gpu2", "RECV_B0.1<-gpu2"]  # sends nothing
    assert lists["gpu2"][:3] == ["RECV_F1.0<-gpu0", "SEND_B1.0->gpu0", "SEND_B1.0->gpu1"]
    validate_schedule(sched, stages)
    broken = {d: list(acts) for d, acts in sched.devices.items()}
    del broken["gpu2"][[str(a) for a in broken["gpu2"]].index("SEND_B1.0->gpu1")]
    with pytest.raises(InputError, match="expected SEND_B1.0->gpu1") as info:
        unmirror(broken, stages)
    assert info.value.field.startswith("schedule.devices.gpu2[")
    wide = build_schedule("1f1b", parse_stages("0:a;1:b+c+d;2:e+f"), 1).devices
    peers = {d: [str(a) for a in acts if a.peer] for d, acts in wide.items()}
    assert peers["a"] == ["SEND_F0.0->b", "SEND_F0.0->c", "SEND_F0.0->d", "RECV_B0.0<-b"]
    assert peers["d"] == ["RECV_F1.0<-a", "RECV_B1.0<-e"]  # a takes from b; 2 mod 2: e
    assert peers["c"] == ["RECV_F1.0<-a", "SEND_F1.0->f", "RECV_B1.0<-f"]


@pytest.mark.parametrize(
    ("text", "forward", "backward"),
    [
        # TP2+SP -> TP1: gpu2 takes a half from each member (N through its downlink); it
        # sends each member the gradient of its half (N through its uplink, not 2 N).
        ("0-1:gpu0+gpu1;2-3:gpu2", 1, 1),
        # TP1 -> TP2+SP: gpu0 sends each member its half; each returns its half's gradient.
        ("0-1:gpu0;2-3:gpu1+gpu2", 1, 1),
        # TP2+SP -> TP4+SP: each member sends a quarter to two members (N / 2 per uplink).
        ("0-1:gpu0+gpu1;2-3:gpu2+gpu3+gpu4+gpu5", 0.5, 0.5),
        # TP4+SP -> TP2+SP: each receiver takes a quarter from two members.
        ("0-1:gpu0+gpu1+gpu2+gpu3;2-3:gpu4+gpu5", 0.5, 0.5),
    ],
)
def test_sequence_parallel_stages_of_different_degrees_reshard_along_the_sequence(
    text: str, forward: float, backward: float
) -> None:
    """Each member receives the sequence range it needs, from the members holding it:
    the synthetic profile's sequence-parallel cut is all split (``1 / t`` per member)."""
    topo = uniform_topology(6, bandwidth=BW)
    stages = with_parallelism(parse_stages(text), sequence_parallel=True)
    res = simulate(_profile(), topo, stages, "gpipe", 1)
    times = {t.kind: t.end_ms - t.start_ms for t in res.transfers}
    latency = topo.latency_ms("gpu0", "gpu1")
    assert times["F"] == pytest.approx(latency + forward * N / BW * 1e3, rel=1e-9)
    assert times["B"] == pytest.approx(latency + backward * N / BW * 1e3, rel=1e-9)
    devices = build_schedule("gpipe", stages, 1).devices
    lists = {d: [str(a) for a in acts if a.peer] for d, acts in devices.items()}
    if text == "0-1:gpu0+gpu1;2-3:gpu2":
        assert lists["gpu2"][:4] == [
            "RECV_F1.0<-gpu0", "RECV_F1.0<-gpu1", "SEND_B1.0->gpu0", "SEND_B1.0->gpu1"
        ]  # fmt: skip
        assert lists["gpu1"] == ["SEND_F0.0->gpu2", "RECV_B0.0<-gpu2"]


def test_split_and_whole_values_are_sized_from_the_profile() -> None:
    """A cut that is partly split along the sequence (a rotary table beside the hidden
    states): the split part from the whole and one member's bytes, the rest whole, sent
    once to each receiver (its first piece)."""
    from planner.simulate.reshard import piece_bytes, split_parts

    profile = _profile()
    for m in profile.measurements:
        for i, t in enumerate(m.layers):  # each member: N / 2 of the split part, all of 1 MiB
            sp = dataclasses.replace(t.sharded["tp2-sp"], output_bytes=N // 2 + 2**20)
            m.layers[i] = dataclasses.replace(t, output_bytes=N + 2**20)
            m.layers[i].sharded["tp2-sp"] = sp
    stages = with_parallelism(parse_stages("0-1:a+b;2-3:c"), sequence_parallel=True)
    parts = split_parts(profile, stages[0], stages[1], 1)
    assert parts == (N, 2**20)
    assert piece_bytes(("a", "b"), ("c",), (True, False), parts) == [
        ("a", "c", N // 2 + 2**20), ("b", "c", N // 2)
    ]  # fmt: skip
    assert piece_bytes(("c",), ("a", "b"), (False, True), parts) == [
        ("c", "a", N // 2 + 2**20), ("c", "b", N // 2 + 2**20)
    ]  # fmt: skip


def test_a_member_pays_a_message_overhead_per_piece_it_sends_or_receives() -> None:
    topo = load_topology(ROOT / "topologies" / "cpu4.yaml")  # 300 us per message
    stages = with_parallelism(parse_stages("0-1:cpu0+cpu1;2-3:cpu2"), sequence_parallel=True)
    zero = {(0, "cpu0"): (0.0, 0.0, 0.0, 0.0), (1, "cpu2"): (0.0, 0.0, 0.0, 0.0)}
    out = with_message_overheads(zero, topo, stages, [0, N])
    assert out[(0, "cpu0")] == pytest.approx((0.3, 0.3, 0.3, 0.0))  # its half, its gradient
    assert out[(1, "cpu2")] == pytest.approx((0.6, 0.6, 0.6, 0.0))  # two halves each way


def test_a_member_pays_a_message_overhead_per_peer_it_serves() -> None:
    topo = load_topology(ROOT / "topologies" / "cpu4.yaml")  # 300 us per message
    stages = parse_stages("0-1:cpu0+cpu1;2-3:cpu2")
    zero = {(0, "cpu0"): (0.0, 0.0, 0.0, 0.0), (1, "cpu2"): (0.0, 0.0, 0.0, 0.0)}
    out = with_message_overheads(zero, topo, stages, [0, N])
    assert out[(0, "cpu0")] == pytest.approx((0.3, 0.3, 0.3, 0.0))  # one send, one receive
    assert out[(1, "cpu2")] == pytest.approx((0.3, 0.6, 0.6, 0.0))  # gradient to both


def _random_mixed_plan(
    rng: random.Random, n: int, names: list[str], *, sequence_parallel: bool = False
) -> list[StageSpec]:
    """A random partition of ``n`` layers into stages of degrees 1, 2 or 4 each (with
    ``sequence_parallel`` on every group of two or more), random replicas, recompute and
    sharding."""
    s = rng.randint(1, min(n, len(names) // 2))
    cuts = sorted(rng.sample(range(n - 1), s - 1))
    bounds = [-1, *cuts, n - 1]
    pool = list(names)
    rng.shuffle(pool)
    out, pos = [], 0
    for k in range(s):
        t = rng.choice([t for t in (1, 2, 4) if pos + t + (s - k - 1) <= len(pool)])
        r = rng.randint(1, max(1, min(2, (len(pool) - pos - (s - k - 1)) // t)))
        devices = tuple(pool[pos : pos + r * t])
        pos += r * t
        sharding = rng.choice(["none", "zero1", "fsdp"]) if r > 1 else "none"
        out.append(
            StageSpec(k, (bounds[k] + 1, bounds[k + 1]), devices, rng.random() < 0.2,
                      tensor_parallel=t, sharding=sharding,
                      sequence_parallel=sequence_parallel and t > 1)
        )  # fmt: skip
    return out


@pytest.mark.parametrize("topo_name", ["hetero", "two-node-ib"])
def test_bounds_stay_below_the_simulated_time_with_mixed_degrees(topo_name: str) -> None:
    topo = load_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    rng = random.Random(topo_name + " mixed")
    checked = _bounds_below_simulated(topo, rng, 30, _random_mixed_plan)
    mixed = sum(len({st.tensor_parallel for st in stages}) > 1 for stages in checked)
    assert len(checked) >= 15 and mixed >= 8


@pytest.mark.parametrize("topo_name", ["hetero", "two-node-ib"])
def test_bounds_stay_below_the_simulated_time_with_resharded_boundaries(topo_name: str) -> None:
    topo = load_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    rng = random.Random(topo_name + " resharded")

    def plan(rng: random.Random, n: int, names: list[str]) -> list[StageSpec]:
        return _random_mixed_plan(rng, n, names, sequence_parallel=True)

    checked = _bounds_below_simulated(topo, rng, 30, plan)
    resharded = sum(
        any(reshards(a, b) for a, b in zip(stages, stages[1:], strict=False)) for stages in checked
    )
    assert len(checked) >= 15 and resharded >= 8
