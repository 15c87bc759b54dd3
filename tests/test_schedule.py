"""Schedules: closed-form times with free communication, memory in flight, validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from families import BUILT, FLUSHED, GENERATED, partition, schedules

from planner.cost import synthetic_profile
from planner.errors import InputError
from planner.plan import StageSpec, parse_stages
from planner.profile.schema import load_profile
from planner.schedule import (
    FAMILIES,
    PLACEMENTS,
    Action,
    ActionType,
    Family,
    Schedule,
    as_stream,
    build_schedule,
    family,
    validate_schedule,
)
from planner.simulate import STREAM_ITERATIONS, optimized_schedule, simulate
from planner.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
VGG16 = load_profile(ROOT / "profiles" / "pipedream-vgg16.json")
NVLINK = load_topology(ROOT / "topologies" / "nvlink.yaml")

# Binary fractions keep every sum exact, so the closed forms can be compared with ==.
F, BI, BW = 0.5, 1.25, 0.75
B = BI + BW


def _chain(p: int, per_stage: int = 1, devices: list[str] | None = None) -> list[StageSpec]:
    names = devices or [f"d{i}" for i in range(p)]
    return [StageSpec(i, (i * per_stage, (i + 1) * per_stage - 1), [names[i]]) for i in range(p)]


@pytest.mark.parametrize(("p", "m"), [(1, 1), (1, 5), (2, 1), (3, 4), (4, 8), (5, 3), (6, 17)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_closed_form(name: str, p: int, m: int) -> None:
    prof = synthetic_profile(p, forward_ms=F, backward_input_ms=BI, backward_weight_ms=BW)
    result = simulate(prof, None, _chain(p), name, m)
    assert result.iteration_ms == (m + p - 1) * (F + B)
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 12), (3, 2, 6), (4, 2, 4)])
def test_interleaved_bubble_is_divided_by_v(p: int, v: int, m: int) -> None:
    # p*v chunks of one layer each; f and b per device are v chunk times.
    prof = synthetic_profile(p * v, forward_ms=F, backward_input_ms=BI, backward_weight_ms=BW)
    devices = [f"d{i}" for i in range(p)]
    stages = [StageSpec(i, (i, i), [devices[i % p]]) for i in range(p * v)]
    result = simulate(prof, None, stages, "interleaved", m)
    f_dev, b_dev = v * F, v * B
    assert result.iteration_ms == pytest.approx(m * (f_dev + b_dev) + (p - 1) * (f_dev + b_dev) / v)
    assert result.schedule.virtual_stages == v


@pytest.mark.parametrize(("p", "m"), [(2, 2), (3, 6), (4, 4), (4, 8), (6, 12), (8, 32)])
def test_zero_bubble_is_a_third_of_1f1b_with_equal_halves(p: int, m: int) -> None:
    prof = synthetic_profile(p, forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0)
    work = m * 3.0
    zb = simulate(prof, None, _chain(p), "zb", m)
    ofob = simulate(prof, None, _chain(p), "1f1b", m)
    assert zb.iteration_ms - work <= (ofob.iteration_ms - work) / 3 + 1e-9
    # Same peak memory as 1F1B (stage 0 holds p microbatches in both).
    assert max(zb.memory_bytes.values()) == max(ofob.memory_bytes.values())


@pytest.mark.parametrize("name", GENERATED)
@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 2), (3, 3)])
def test_activations_in_flight(name: str, p: int, m: int) -> None:
    saved = 64
    prof = synthetic_profile(p, saved_bytes=saved, param_bytes=0, optimizer_state_bytes=0)
    result = simulate(prof, None, _chain(p), name, m)
    for s in range(p):
        held = result.memory_bytes[f"d{s}"] // saved
        assert held == family(name).in_flight_microbatches(p, s, m)
        if name in ("1f1b", "2bw"):
            assert held <= p - s
        if name == "gpipe":
            assert held == m


def test_every_generator_output_passes_the_full_validator() -> None:
    prof = synthetic_profile(8)
    chunks = [str(k) for k in range(8)]
    shapes = [
        ("0-1:a;2-3:b;4-5:c;6-7:d", {}),
        ("0-2:a,b;3-5:c;6-7:d,e,f", {}),
        ("0-7:a", {}),
        (None, {"virtual_stages": 2}),  # 8 chunks on 4 devices, as each family places them
    ]
    for text, kw in shapes:
        names = [n for n, f in FAMILIES.items() if f.interleaved == bool(kw)]
        for name in names:
            stages = parse_stages(text or partition(name, chunks, ["a", "b", "c", "d"]))
            if family(name).searched:
                sched = optimized_schedule(stages, 8, profile=prof, microbatch_size=1)
            else:
                sched = build_schedule(name, stages, 8, **kw)
            validate_schedule(sched, stages)
            again = Schedule.from_dict(sched.to_dict())
            validate_schedule(again, stages)
            assert again.devices == sched.devices
            # The expanded lists time exactly like the compact order.
            direct = simulate(prof, None, stages, sched, 8)
            stored = simulate(prof, None, stages, again, 8)
            assert direct.iteration_ms == stored.iteration_ms
            assert direct.memory_bytes == stored.memory_bytes


def test_2bw_runs_without_flush() -> None:
    p, m = 4, 8
    prof = synthetic_profile(p, forward_ms=F, backward_input_ms=BI, backward_weight_ms=BW)
    result = simulate(prof, None, _chain(p), "2bw", m)
    # A stream of K iterations without flush fills and drains once: (K m + p - 1)(f + b).
    k = STREAM_ITERATIONS
    assert result.iteration_ms == pytest.approx((k * m + p - 1) * (F + B) / k)
    assert result.iteration_ms < simulate(prof, None, _chain(p), "1f1b", m).iteration_ms
    assert result.staleness == [1] * p
    assert result.schedule.flush is False


def test_optimized_is_never_worse_than_1f1b_on_uneven_stages() -> None:
    prof = synthetic_profile(8)
    for i, t in enumerate(prof.measurements[0].layers):
        t.forward_ms = [1, 3, 1, 1, 2, 1, 1, 4][i]
        t.backward_input_ms = t.forward_ms
        t.backward_weight_ms = [1, 1, 5, 1, 1, 1, 3, 1][i]
        t.backward_ms = t.backward_input_ms + t.backward_weight_ms
    stages = parse_stages("0-1:a;2-3:b;4-5:c;6-7:d")
    best = simulate(prof, None, stages, "optimized", 8)
    for name in ("1f1b", "zb"):
        assert best.iteration_ms <= simulate(prof, None, stages, name, 8).iteration_ms
    assert best.schedule.meta["warmup"]


def test_optimized_respects_memory_limits() -> None:
    prof = synthetic_profile(4, saved_bytes=1000, param_bytes=0, optimizer_state_bytes=0)
    stages = _chain(4)
    limits = {f"d{s}": 2000 for s in range(4)}  # two microbatches at most
    result = simulate(prof, None, stages, "optimized", 8, memory_limits=limits)
    assert max(result.memory_bytes.values()) <= 2000


def test_action_text_round_trip() -> None:
    for text in (
        "F0.3",
        "B12.0",
        "I1.2",
        "W1.2",
        "SEND_F0.3->gpu1",
        "RECV_B2.0<-gpu3",
        "ALLREDUCE3",
        "STEP0",
    ):
        assert str(Action.parse(text)) == text
    assert Action.parse("SEND_F0.3->x").kind is ActionType.SEND_ACT
    assert ActionType.SEND_F is ActionType.SEND_ACT


@pytest.mark.parametrize("text", ["X0.1", "F0", "SEND_F0.1", "RECV_F0.1->a", "STEP0.1", "F0.1<-a"])
def test_bad_action_text(text: str) -> None:
    with pytest.raises(InputError, match="schedule"):
        Action.parse(text)


def _two_stage_dict() -> tuple[list[StageSpec], dict]:  # type: ignore[type-arg]
    stages = parse_stages("0:a;1:b")
    return stages, build_schedule("1f1b", stages, 2).to_dict()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["devices"]["b"].remove("RECV_F1.0<-a"), "RECV_F1.0 is missing"),
        (lambda d: d["devices"]["a"].insert(0, "F0.0"), "appears twice"),
        (lambda d: d["devices"]["a"].remove("B0.1"), "expected one backward"),
        (lambda d: d["devices"]["a"].remove("STEP0"), "STEP0"),
        (
            lambda d: d["devices"].update(
                a=["B0.0", *[x for x in d["devices"]["a"] if x != "B0.0"]]
            ),
            "before its forward",
        ),
        (lambda d: d["devices"]["b"].insert(0, "F0.0"), "runs on a, not b"),
        (lambda d: d["devices"].update(z=["F0.0"]), "runs no stage"),
        (
            # b waits for the gradient of microbatch 1 before it has received microbatch 0.
            lambda d: d["devices"].update(
                a=[
                    "F0.0",
                    "SEND_F0.0->b",
                    "RECV_B0.1<-b",
                    "F0.1",
                    "SEND_F0.1->b",
                    "RECV_B0.0<-b",
                    "B0.0",
                    "B0.1",
                    "STEP0",
                ]
            ),
            "deadlock",
        ),
    ],
)
def test_broken_schedules_are_rejected_with_a_reason(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    stages, data = _two_stage_dict()
    mutate(data)
    with pytest.raises(InputError, match=message):
        validate_schedule(Schedule.from_dict(data), stages)


def test_deadlock_through_simulate_names_the_waiting_devices() -> None:
    stages, data = _two_stage_dict()
    # Both devices receive before they send: a classic wait-for cycle.
    data["devices"]["a"] = [
        "RECV_B0.0<-b",
        "F0.0",
        "SEND_F0.0->b",
        "F0.1",
        "SEND_F0.1->b",
        "B0.0",
        "RECV_B0.1<-b",
        "B0.1",
        "STEP0",
    ]
    prof = synthetic_profile(2)
    with pytest.raises(InputError, match=r"deadlocks: .*a waits at RECV_B0\.0"):
        simulate(prof, None, stages, Schedule.from_dict(data), 2)


def test_schedule_shape_errors() -> None:
    with pytest.raises(InputError, match="unknown schedule"):
        build_schedule("pipedream", _chain(2), 4)
    with pytest.raises(InputError, match="multiple of the number of devices"):
        build_schedule("interleaved", parse_stages("0:a;1:b;2:a;3:b"), 3)
    with pytest.raises(InputError, match="only 1 microbatches"):
        build_schedule("1f1b", parse_stages("0:a,b;1:c"), 1)
    with pytest.raises(InputError, match="same devices as stage s mod p"):
        build_schedule("interleaved", parse_stages("0:a;1:b;2:b;3:a"), 4)


@pytest.mark.parametrize("name", schedules(interleaved=True))
@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 3, 12), (2, 2, 4), (4, 2, 4), (3, 2, 9)])
def test_interleaved_in_flight_matches_the_simulated_peak(
    name: str, p: int, v: int, m: int
) -> None:
    prof = synthetic_profile(p * v, saved_bytes=64, param_bytes=0, optimizer_state_bytes=0)
    where = family(name).place([f"d{r}" for r in range(p)], v)
    stages = [StageSpec(i, (i, i), [where[i]]) for i in range(p * v)]
    result = simulate(prof, None, stages, name, m)
    for r in range(p):
        held = result.memory_bytes[f"d{r}"] // 64
        assert held == family(name).in_flight_microbatches(p, r, m, virtual_stages=v)


# --- replicated stages: one schedule per pipeline replica ----------------------------------


def _replicated(p: int, r: int, per_stage: int = 1) -> list[StageSpec]:
    return [
        StageSpec(s, (s * per_stage, (s + 1) * per_stage - 1), [f"d{s}_{j}" for j in range(r)])
        for s in range(p)
    ]


@pytest.mark.parametrize("name", FLUSHED)
@pytest.mark.parametrize(("p", "r", "m"), [(2, 2, 8), (3, 2, 6), (4, 4, 16), (2, 3, 9)])
def test_replicas_run_one_pipeline_each(name: str, p: int, r: int, m: int) -> None:
    # r replicas of a p-stage pipeline over m microbatches take exactly as long as one
    # pipeline over m / r (free communication, no all-reduce cost): DeepSpeed's and
    # Megatron's data x pipeline parallelism, not one schedule dealt out round robin.
    prof = synthetic_profile(p, forward_ms=F, backward_input_ms=BI, backward_weight_ms=BW)
    replicated = simulate(prof, None, _replicated(p, r), name, m)
    single = simulate(prof, None, _chain(p), name, m // r)
    assert replicated.iteration_ms == single.iteration_ms
    # Each device's compute order is the single pipeline's, on its own microbatches.
    sched = build_schedule(name, _replicated(p, r), m)
    alone = build_schedule(name, _chain(p), m // r)
    for s in range(p):
        for j in range(r):
            mine = [(a.kind, a.microbatch) for a in sched.devices[f"d{s}_{j}"] if a.is_compute]
            ref = [(a.kind, a.microbatch) for a in alone.devices[f"d{s}"] if a.is_compute]
            assert mine == [(t, k * r + j) for t, k in ref]


@pytest.mark.parametrize("name", FLUSHED)
@pytest.mark.parametrize(("p", "r", "m"), [(3, 2, 8), (4, 2, 4), (2, 4, 8)])
def test_replicated_in_flight_matches_the_simulated_peak(name: str, p: int, r: int, m: int) -> None:
    saved = 64
    prof = synthetic_profile(p, saved_bytes=saved, param_bytes=0, optimizer_state_bytes=0)
    result = simulate(prof, None, _replicated(p, r), name, m)
    for s in range(p):
        total = family(name).in_flight_microbatches(p, s, m, rounds=r)
        for j in range(r):
            assert result.memory_bytes[f"d{s}_{j}"] // saved == total // r


def test_replica_rounds_where_they_pay_off() -> None:
    from planner.schedule.replicas import per_replica_order, replica_round

    # The largest count, when every other divides it, M holds it and the rounds are whole
    # or at least two; else 1 (dealt out round robin).
    assert replica_round([2, 2], 8) == 2 and replica_round([3, 1], 8) == 3
    assert replica_round([3, 1, 1], 7) == 3 and replica_round([3, 1], 4) == 1
    assert replica_round([2, 3], 12) == 1 and replica_round([1, 1], 8) == 1
    assert replica_round([4, 2, 1], 4) == 4 and replica_round([4, 1], 3) == 1
    assert per_replica_order({0: [("F", 0, 0), ("B", 0, 0)]}, 2, 2)[0] == [
        ("F", 0, 0),
        ("F", 0, 1),
        ("B", 0, 0),
        ("B", 0, 1),
    ]
    # A last round shorter than the others, in each iteration of a stream.
    ops = [("F", 0, q) for q in range(6)]
    assert [k for _, _, k in per_replica_order({0: ops}, 3, 7)[0]] == list(range(14))
    # Unequal replica counts: every device still gets a valid order.
    stages = [StageSpec(0, (0, 0), ["a", "b", "c"]), StageSpec(1, (1, 1), ["d"])]
    for name in FLUSHED:
        validate_schedule(build_schedule(name, stages, 6), stages)
        validate_schedule(build_schedule(name, stages, 7), stages)  # a round of 1 at the end


# The replica counts per stage the issue (and PipeDream's own optimizer) brought up, and more.
REPLICA_SHAPES = [
    (3, 1, 1), (4, 1, 1), (2, 1, 1), (1, 3, 1), (2, 2, 1), (3, 1), (2, 3, 1), (1, 1, 2, 1, 3, 1),
    (4, 2, 1), (3, 1, 1, 1, 1, 1),
]  # fmt: skip


def _with_replicas(counts: tuple[int, ...]) -> list[StageSpec]:
    return [StageSpec(s, (s, s), [f"d{s}_{j}" for j in range(r)]) for s, r in enumerate(counts)]


@pytest.mark.parametrize("counts", REPLICA_SHAPES)
def test_every_schedule_runs_every_replica_shape(counts: tuple[int, ...]) -> None:
    # Every schedule takes every shape and microbatch count the others take (each replica
    # at least one microbatch); 2bw's continuous stream included, checked as run checks it:
    # complete, deadlock free, each forward after the step that made its weights.
    stages = _with_replicas(counts)
    prof = synthetic_profile(len(counts))
    for m in range(max(counts), 13):
        for name in ("gpipe", "1f1b", "zb", "2bw"):
            sched = build_schedule(name, stages, m)
            validate_schedule(sched, stages)
            stream = as_stream(sched, stages, 4)
            if stream is not None:
                validate_schedule(stream, stages)
            result = simulate(prof, None, stages, name, m, events=False)
            assert result.iteration_ms > 0


def test_2bw_with_a_replicated_first_stage_simulates() -> None:
    # The case: VGG-16 from PipeDream's profile, 3 replicas on the first of three
    # stages; 2bw deadlocked for every M from 3 to 12.
    text = "0-24:gpu0,gpu1,gpu2;25-30:gpu3;31-40:gpu4"
    for m in range(3, 13):
        result = simulate(VGG16, NVLINK, text, "2bw", m, events=False)
        assert result.iteration_ms >= result.lower_bound_ms


def test_uneven_replicas_pipeline_as_well_as_gpipe() -> None:
    # 1F1B on replicas (3, 1, 1) took 1,398.9 ms at M = 6 but 2,758.8 ms at M = 8 (GPipe:
    # 2,010.7): where 3 did not divide M the order over all microbatches was dealt out round
    # robin, so the first stage's three replicas shared a warm-up of two microbatches and
    # ran one microbatch at a time. With rounds of three (the last one shorter) each
    # replica gets its own warm-up.
    text = "0-24:gpu0,gpu1,gpu2;25-30:gpu3;31-40:gpu4"
    for m in (6, 7, 8, 10, 11, 12, 16):
        times = {
            name: simulate(VGG16, NVLINK, text, name, m, events=False)
            for name in ("gpipe", "1f1b", "zb")
        }
        for name in ("1f1b", "zb"):
            assert times[name].iteration_ms <= times["gpipe"].iteration_ms
            if m % 3:  # the busiest replica has one microbatch more: the others fill and drain
                assert times[name].iteration_ms <= times[name].lower_bound_ms * 1.001
    per_sample = [
        simulate(VGG16, NVLINK, text, "1f1b", m, events=False).iteration_ms / m for m in (6, 8)
    ]
    assert per_sample[1] <= per_sample[0] * 1.05


@pytest.mark.parametrize("counts", REPLICA_SHAPES)
def test_uneven_replicas_in_flight_matches_the_simulated_peak(counts: tuple[int, ...]) -> None:
    from planner.schedule.replicas import replica_round

    saved, p = 64, len(counts)
    stages = _with_replicas(counts)
    prof = synthetic_profile(p, saved_bytes=saved, param_bytes=0, optimizer_state_bytes=0)
    for m in range(max(counts), 13):
        rounds = replica_round(counts, m)
        for name in ("gpipe", "1f1b", "zb", "2bw"):
            result = simulate(prof, None, stages, name, m)
            for st in stages:
                total = family(name).in_flight_microbatches(p, st.id, m, rounds=rounds)
                peak = max(result.memory_bytes[d] for d in st.devices) // saved
                assert peak == -(-total // len(st.devices)), (name, m, st.id)


def test_2bw_warmup_never_outruns_its_two_weight_versions() -> None:
    # Fewer microbatches than stages: a full 1F1B warm-up would run iteration 2's first
    # forwards before iteration 0's step made their weights (the run failed inside a rank).
    stages = _chain(6)
    for m in (1, 2, 3, 4):
        stream = as_stream(build_schedule("2bw", stages, m), stages, 4)
        assert stream is not None
        validate_schedule(stream, stages)
    # ... which the validator refuses in a hand-written order.
    from planner.schedule import schedule_from_order
    from planner.schedule.onef1b import onef1b_order

    deep = onef1b_order(6, 2, iterations=4)  # stage 0 warms up 5 deep
    sched = schedule_from_order("2bw", stages, deep, 2, iterations=4, flush=False)
    with pytest.raises(InputError, match=r"F0\.4 \(iteration 2\) comes before STEP0 of"):
        validate_schedule(sched, stages)


# --- what a family owns --------------------------------------------------------------------


def test_placements_loop_and_v() -> None:
    loop, v = PLACEMENTS["loop"], PLACEMENTS["v"]
    assert [loop(s, 3) for s in range(9)] == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    # ZB-V: down the devices and back up (zigzag for more chunks).
    assert [v(s, 3) for s in range(9)] == [0, 1, 2, 2, 1, 0, 0, 1, 2]
    zbv = Family("v-shaped", interleaved=True, placement="v")
    assert zbv.place(["a", "b"], 2) == ["a", "b", "b", "a"]
    assert family("interleaved").place(["a", "b"], 2) == ["a", "b", "a", "b"]
    assert zbv.virtual_stages_of(parse_stages("0:a;1:b;2:b;3:a")) == 2
    with pytest.raises(InputError, match="v-shaped: .*e.g. '0:gpu0;1:gpu1;2:gpu1;3:gpu0'"):
        zbv.virtual_stages_of(parse_stages("0:a;1:b;2:a;3:b"))
    with pytest.raises(InputError, match="same devices as stage s mod p"):
        family("interleaved").virtual_stages_of(parse_stages("0:a;1:b;2:b;3:a"))
    with pytest.raises(InputError, match="--virtual-stages 3 does not match"):
        zbv.virtual_stages_of(parse_stages("0:a;1:b;2:b;3:a"), 3)


@pytest.mark.parametrize("name", BUILT)
def test_the_family_dispatches_its_own_generator(name: str) -> None:
    fam = family(name)
    devices = ["a", "b"] if fam.interleaved else ["a", "b", "c", "d"]
    stages = parse_stages(partition(name, ["0", "1", "2", "3"], devices))
    sched = build_schedule(name, stages, 4)
    replicas = [len(s.devices) for s in stages]
    assert sched.order == fam.order(replicas, 4, sched.virtual_stages, 1)
    assert sched.flush == fam.flush and sched.generated
    # Streaming is the family's answer, and it streams a schedule read back from a plan
    # (compared with the generator once) exactly as the one built here.
    again = Schedule.from_dict(sched.to_dict())
    assert not again.generated
    stream = as_stream(sched, stages, 3)
    assert (stream is not None) == fam.streams
    if stream is not None:
        read = as_stream(again, stages, 3)
        assert read is not None and read.devices == stream.devices


def test_a_hand_made_order_of_a_streaming_family_runs_as_given() -> None:
    stages = parse_stages("0:a;1:b")
    # GPipe's lists under 2BW's name: valid, but not 2BW's generator (b runs F0 F1 B0 B1).
    data = {**build_schedule("gpipe", stages, 2).to_dict(), "name": "2bw", "flush": False}
    hand = Schedule.from_dict(data)
    validate_schedule(hand, stages)
    assert hand.devices != build_schedule("2bw", stages, 2).devices
    assert as_stream(hand, stages, 3) is None
    assert family("2bw").streams and not family("1f1b").streams


def test_a_searched_family_is_refused_by_build_schedule() -> None:
    for name in schedules(searched=True):
        with pytest.raises(InputError, match="searched by simulating"):
            build_schedule(name, _chain(2), 4)
