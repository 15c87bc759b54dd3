"""Event-driven simulation of one training iteration of a pipeline plan.

The simulator executes the schedule's per-device action lists exactly as ``run`` does:

* compute (F, B, I, W) takes the profiled time of the stage's layers divided by the
  device's speed; recompute adds a forward to the backward (and to I);
* a send is non-blocking: the transfer starts when the data is ready and every link of
  its route is free; a receive blocks the device until the data has arrived;
* links: each directed link carries one transfer at a time. A transfer holds all links of
  its route for ``latency + bytes / bottleneck bandwidth``; transfers that want a busy
  link wait. A link serves its transfers in a fixed order -- the order their data becomes
  ready in a reference run (profile times, speed-1 devices, free communication), close to
  first come first served for equally fast devices, and it keeps the time monotone in
  every speed and bandwidth (see :func:`_link_plan`);
* ``ALLREDUCE s`` waits for every replica of stage ``s`` and then takes the topology's
  ring all-reduce time of the stage's gradients (links are not shared with pipeline
  transfers in this model); ``STEP s`` takes ``step_ms`` (the profile does not measure
  the optimizer, so the default is 0).

Memory per device over time = weights + gradients + optimizer state of its stages (plus a
second weight version under 2bw) + the activations of the microbatches in flight, which
are stashed when a forward starts and freed when the backward (or W) ends.

Example::

    result = simulate(profile, topology, stages, "1f1b", num_microbatches=8)
    result.iteration_ms, result.memory_bytes["gpu0"], result.bubble_fraction
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from planner.cost import (
    boundary_bytes,
    stage_activation_bytes,
    stage_param_bytes,
    stage_static_bytes,
    stage_times,
)
from planner.errors import InputError
from planner.plan import Plan, StageSpec, validate_stages
from planner.profile.schema import Profile
from planner.schedule import ActionType, Schedule, build_schedule, validate_schedule

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "STREAM_ITERATIONS",
    "SimEvent",
    "SimResult",
    "TransferEvent",
    "lower_bound_ms",
    "simulate",
    "simulate_schedule",
    "plan_from_result",
]

# Integer codes of the action kinds: the event loop compares small ints, not enums.
_CODE = {
    ActionType.F: 0,
    ActionType.B: 1,
    ActionType.I: 2,
    ActionType.W: 3,
    ActionType.SEND_ACT: 4,
    ActionType.RECV_ACT: 5,
    ActionType.SEND_GRAD: 6,
    ActionType.RECV_GRAD: 7,
    ActionType.ALLREDUCE: 8,
    ActionType.OPTIMIZER_STEP: 9,
}
_NAMES = ("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "ALLREDUCE", "STEP")
# A no-flush schedule (2bw) is timed as the average iteration of a stream this long: the
# pipeline fills and drains once per stream. (Differences of two stream lengths estimate
# the steady state more closely but are not monotone in the durations.)
STREAM_ITERATIONS = 4


class SimEvent(NamedTuple):
    """One timed action on one device (compute, all-reduce or optimizer step)."""

    device: str
    kind: str  # "F" "B" "I" "W" "ALLREDUCE" "STEP"
    stage: int
    microbatch: int  # -1 for ALLREDUCE/STEP
    start_ms: float
    end_ms: float


class TransferEvent(NamedTuple):
    """One transfer between devices: activations ("F") or gradients ("B")."""

    src: str
    dst: str
    kind: str
    stage: int  # the receiving stage
    microbatch: int
    start_ms: float
    end_ms: float
    nbytes: int


@dataclass
class SimResult:
    """What one simulated iteration costs.

    ``memory_timeline[dev]`` is a step curve ``[(time_ms, bytes), ...]``; ``staleness``
    lists, per stage, how many optimizer steps old the weights are that its gradients are
    computed with (asynchronous schedules only).
    """

    iteration_ms: float
    memory_bytes: dict[str, int]
    busy_ms: dict[str, float]
    bubble_fraction: float
    lower_bound_ms: float
    staleness: list[int] | None
    raw_events: list[tuple[int, int, int, int, float, float]]
    schedule: Schedule
    raw_transfers: list[tuple[int, int, int, int, float, float, int]] = field(default_factory=list)
    memory_timeline: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    memory_limit_bytes: dict[str, int] = field(default_factory=dict)
    static_bytes: dict[str, int] = field(default_factory=dict)
    makespan_ms: float = 0.0
    microbatch_size: int = 0
    num_microbatches: int = 0
    device_names: list[str] = field(default_factory=list)
    # Iterations the events cover (a no-flush schedule is timed as a stream).
    iterations: int = 1

    @property
    def transfers(self) -> list[TransferEvent]:
        """Timed transfers between devices (built on first use)."""
        cached: list[TransferEvent] | None = self.__dict__.get("_transfers")
        if cached is None:
            names, total = self.device_names, self.num_microbatches * self.iterations
            cached = [
                TransferEvent(
                    names[src],
                    names[dst],
                    "B" if back else "F",
                    into // total,
                    into % total,
                    start,
                    end,
                    nbytes,
                )
                for src, dst, back, into, start, end, nbytes in self.raw_transfers
            ]
            self.__dict__["_transfers"] = cached
        return cached

    @property
    def events(self) -> list[SimEvent]:
        """Timed compute, all-reduce and step actions (built on first use)."""
        cached: list[SimEvent] | None = self.__dict__.get("_events")
        if cached is None:
            names = self.device_names
            cached = [
                SimEvent(names[di], _NAMES[code], s, k, start, end)
                for di, code, s, k, start, end in self.raw_events
            ]
            self.__dict__["_events"] = cached
        return cached

    @property
    def samples_per_s(self) -> float:
        return (
            self.num_microbatches * self.microbatch_size / self.iteration_ms * 1e3
            if (self.iteration_ms > 0)
            else math.inf
        )

    @property
    def fits(self) -> bool:
        """Every device's peak memory is within its limit (True without a topology)."""
        return all(self.memory_bytes[d] <= limit for d, limit in self.memory_limit_bytes.items())

    @property
    def idle_ms(self) -> dict[str, float]:
        return {d: max(0.0, self.iteration_ms - b) for d, b in self.busy_ms.items()}

    def predicted(self) -> dict[str, Any]:
        """The plan's ``predicted`` object.

        Example::

            plan.predicted = result.predicted()
        """
        out: dict[str, Any] = {
            "iteration_ms": round(self.iteration_ms, 6),
            "samples_per_s": round(self.samples_per_s, 6),
            "bubble_fraction": round(self.bubble_fraction, 6),
            "lower_bound_ms": round(self.lower_bound_ms, 6),
            "memory_bytes": dict(self.memory_bytes),
            "memory_limit_bytes": dict(self.memory_limit_bytes),
            "busy_ms": {d: round(b, 6) for d, b in self.busy_ms.items()},
        }
        if self.staleness is not None:
            out["staleness"] = list(self.staleness)
        return out


def _speed(topology: Topology | None, device: str) -> float:
    return 1.0 if topology is None else topology.device(device).speed


def _pick_microbatch_size(profile: Profile, microbatch_size: int | None) -> int:
    if microbatch_size is None:
        return profile.microbatch_sizes[0]
    profile.measurement(microbatch_size)  # names the profiled sizes if it is missing
    return microbatch_size


def simulate(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: str | Schedule = "1f1b",
    num_microbatches: int = 8,
    microbatch_size: int | None = None,
    **opts: Any,
) -> SimResult:
    """Simulate one iteration of ``stages`` under ``schedule``.

    ``topology=None`` means free communication (devices need only distinct names).
    Options: ``virtual_stages`` (interleaved), ``step_ms`` (optimizer step per stage,
    default 0), ``events=False`` (skip the event list, for solver loops), ``validate``
    (check a given Schedule, default True), ``memory_limits`` and ``iterations``
    (passed on to the optimised schedule's search).

    Example::

        r = simulate(profile, None, parse_stages("0-1:a;2-3:b"), "gpipe", 8, 4)
        r.iteration_ms, r.memory_bytes
    """
    mbs = _pick_microbatch_size(profile, microbatch_size)
    name = schedule if isinstance(schedule, str) else schedule.name
    virtual = int(opts.get("virtual_stages", 1))
    shared = name == "interleaved" or (
        not isinstance(schedule, str) and schedule.virtual_stages > 1
    )
    validate_stages(stages, profile.num_layers, topology, allow_shared_devices=shared)
    if isinstance(schedule, str):
        extra = {}
        if schedule == "optimized":
            extra = {
                "profile": profile,
                "topology": topology,
                "microbatch_size": mbs,
                "memory_limits": opts.get("memory_limits"),
                "step_ms": opts.get("step_ms", 0.0),
            }
        sched = build_schedule(schedule, stages, num_microbatches, virtual_stages=virtual, **extra)
    else:
        sched = schedule
        if opts.get("validate", True):
            validate_schedule(sched, stages)
    stream = not sched.flush and sched.name == "2bw" and sched.iterations == 1
    timed = sched
    if stream:
        # No flush: time a stream of iterations (one fill and drain) and report its
        # average iteration; the events show the whole stream.
        timed = build_schedule("2bw", stages, sched.num_microbatches, iterations=STREAM_ITERATIONS)
    result = simulate_schedule(
        profile,
        topology,
        stages,
        timed,
        mbs,
        step_ms=opts.get("step_ms", 0.0),
        events=opts.get("events", True),
    )
    if stream:
        k = STREAM_ITERATIONS
        result.iteration_ms = result.makespan_ms / k
        result.busy_ms = {d: b / k for d, b in result.busy_ms.items()}
        result.bubble_fraction = _bubble(result.busy_ms, result.iteration_ms)
        result.schedule = sched
    result.lower_bound_ms = lower_bound_ms(
        profile,
        topology,
        stages,
        sched.num_microbatches,
        mbs,
        flush=sched.flush,
        split_backward=_uses_split(sched),
    )
    if not sched.flush:
        result.staleness = [1] * len(stages)
    return result


def _uses_split(schedule: Schedule) -> bool:
    """Whether the schedule runs backwards as separate I and W actions."""
    if schedule.order is not None:
        return any(op[0] == "I" for ops in schedule.order.values() for op in ops)
    return any(a.kind is ActionType.I for acts in schedule.devices.values() for a in acts)


def _bubble(busy: dict[str, float], iteration_ms: float) -> float:
    if iteration_ms <= 0 or not busy:
        return 0.0
    return max(0.0, 1.0 - sum(busy.values()) / (len(busy) * iteration_ms))


def _stage_tables(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    microbatch_size: int,
) -> tuple[dict[tuple[int, str], tuple[float, float, float, float]], list[int]]:
    times = {}
    for st in stages:
        for dev in st.devices:
            t = stage_times(
                profile,
                st.first,
                st.last,
                microbatch_size,
                speed=_speed(topology, dev),
                recompute=st.recompute,
            )
            times[(st.id, dev)] = (t.forward_ms, t.backward_ms, t.input_grad_ms, t.weight_grad_ms)
    # Bytes entering stage s from stage s-1 (activations forward, gradients backward).
    cut = [0] + [boundary_bytes(profile, st.first - 1, microbatch_size) for st in stages[1:]]
    return times, cut


def simulate_schedule(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    microbatch_size: int,
    *,
    step_ms: float | Sequence[float] = 0.0,
    events: bool = True,
) -> SimResult:
    """Time an explicit schedule (no validation, no lower bound); the core event loop.

    A schedule that deadlocks raises an InputError naming where each device waits.

    Example::

        simulate_schedule(profile, None, stages, build_schedule("1f1b", stages, 8), 4)
    """
    times, cut = _stage_tables(profile, topology, stages, microbatch_size)
    devices = _devices_of(schedule, stages)
    num_dev = len(devices)
    total_mb = schedule.num_microbatches * schedule.iterations
    steps = (
        [float(step_ms)] * len(stages)
        if isinstance(step_ms, int | float)
        else [float(x) for x in step_ms]
    )
    weight_versions = 1 if schedule.flush else 2

    # Memory bookkeeping per stage: stashed per microbatch, and the rebuilt activations
    # that exist during a recomputing backward.
    stash = [
        stage_activation_bytes(profile, s.first, s.last, microbatch_size, recompute=s.recompute)
        for s in stages
    ]
    rebuilt = [
        stage_activation_bytes(profile, s.first, s.last, microbatch_size) if s.recompute else 0
        for s in stages
    ]
    static = dict.fromkeys(devices, 0)
    for spec in stages:
        per_dev = stage_static_bytes(profile, spec.first, spec.last, replicas=len(spec.devices))
        per_dev += (weight_versions - 1) * stage_param_bytes(profile, spec.first, spec.last)
        for d in spec.devices:
            if d in static:
                static[d] += per_dev
    allreduce_ms = [
        (
            topology.allreduce_ms(s.devices, stage_param_bytes(profile, s.first, s.last))
            if topology is not None and len(s.devices) > 1
            else 0.0
        )
        for s in stages
    ]

    # Memory change at the start and at the end of each compute kind (F, B, I, W): the
    # stash is taken when a forward starts and freed when B (or W) ends; with recompute
    # the rebuilt activations exist from the start of B (or I) until it (or W) ends.
    deltas = [
        (
            (stash[i], 0),
            (rebuilt[i], -stash[i] - rebuilt[i]),
            (rebuilt[i], 0),
            (0, -stash[i] - rebuilt[i]),
        )
        for i in range(len(stages))
    ]
    programs = _compile(schedule, stages, devices, times, allreduce_ms, steps, total_mb, deltas)

    # Links: each directed link serves its transfers one at a time in a fixed order (see
    # _link_order), so that times are monotone in every duration.
    xfer: dict[int, tuple[list[int], float, float, int, int]] = {}
    queues: list[list[int]] = []
    head: list[int] = []
    link_free: list[float] = []
    if topology is not None:
        xfer, queues = _link_plan(topology, programs, devices, stages)
        head = [0] * len(queues)
        link_free = [0.0] * len(queues)

    clock = [0.0] * num_dev
    pos = [0] * num_dev
    busy = [0.0] * num_dev
    arrival: dict[int, float] = {}
    waiting: dict[int, int] = {}
    ready_at: dict[int, float] = {}
    pending: list[int] = []
    ar_seen = [dict[int, int]() for _ in range(num_dev)]
    ar_groups: dict[tuple[int, int], list[Any]] = {}
    # Memory is tracked inline: a device's allocations happen in time order.
    levels = [static[d] for d in devices]
    peaks_now = list(levels)
    mem: list[list[tuple[float, int]]] = [[(0.0, static[d])] for d in devices]
    raw_events: list[tuple[int, int, int, int, float, float]] = []
    raw_transfers: list[tuple[int, int, int, int, float, float, int]] = []
    free_comm = topology is None
    record = events
    runnable = list(range(num_dev - 1, -1, -1))

    while True:
        while runnable:
            di = runnable.pop()
            prog = programs[di]
            n = len(prog)
            p = pos[di]
            t = clock[di]
            dmem = mem[di]
            level = levels[di]
            peak = peaks_now[di]
            worked = 0.0
            while p < n:
                code, s, k, dur, rkey, skey, sdst, grow, shrink = prog[p]
                if rkey >= 0:
                    at = arrival.get(rkey)
                    if at is None:
                        waiting[rkey] = di
                        break
                    if at > t:
                        t = at
                if code <= 3:
                    if grow:
                        level += grow
                        if level > peak:
                            peak = level
                        if record:
                            dmem.append((t, level))
                    end = t + dur
                    if shrink:
                        level += shrink
                        if record:
                            dmem.append((end, level))
                    if record:
                        raw_events.append((di, code, s, k, t, end))
                    worked += dur
                    t = end
                elif code == 8:
                    occ = ar_seen[di].get(s, 0)
                    group = ar_groups.setdefault((s, occ), [0, 0.0, []])
                    if di not in group[2]:
                        group[0] += 1
                        group[1] = max(group[1], t)
                    if group[0] < len(stages[s].devices):
                        if di not in group[2]:
                            group[2].append(di)
                        break
                    ar_seen[di][s] = occ + 1
                    end = group[1] + dur
                    for w in group[2]:
                        if w != di:
                            ar_seen[w][s] = occ + 1
                            clock[w] = end
                            pos[w] += 1
                            runnable.append(w)
                            if record:
                                raw_events.append((w, 8, s, -1, group[1], end))
                    if record:
                        raw_events.append((di, 8, s, -1, group[1], end))
                    t = end
                elif code == 9:
                    if record and dur > 0:
                        raw_events.append((di, 9, s, -1, t, t + dur))
                    t += dur
                if skey >= 0:
                    if free_comm:
                        arrival[skey] = t
                        w = waiting.pop(skey, -1)
                        if w >= 0:
                            runnable.append(w)
                    else:
                        ready_at[skey] = t
                        pending.append(skey)
                p += 1
            pos[di] = p
            clock[di] = t
            levels[di] = level
            peaks_now[di] = peak
            busy[di] += worked
        if not pending:
            break
        # Start every transfer that is ready and next in line on all links of its route.
        while pending:
            key = pending.pop()
            if key in arrival:
                continue  # queued twice (by its send and by the link ahead), started once
            links, lat, bw, src, dst = xfer[key]
            start = ready_at[key]
            for link in links:
                if queues[link][head[link]] != key:
                    break  # it starts when the transfers ahead of it on this link are done
                if link_free[link] > start:
                    start = link_free[link]
            else:
                link = -1
            if link >= 0:
                continue
            into, backward = divmod(key, 2)
            nbytes = cut[into // total_mb + backward]
            end = start + lat + (nbytes / bw * 1e3 if nbytes else 0.0)
            for link in links:
                link_free[link] = end
                head[link] += 1
                queue = queues[link]
                if head[link] < len(queue) and queue[head[link]] in ready_at:
                    pending.append(queue[head[link]])
            arrival[key] = end
            if record:
                raw_transfers.append((src, dst, backward, into, start, end, nbytes))
            w = waiting.pop(key, -1)
            if w >= 0:
                runnable.append(w)

    stuck = [
        f"{devices[di]} waits at {_describe(programs[di][pos[di]], devices, total_mb)}"
        for di in range(num_dev)
        if pos[di] < len(programs[di])
    ]
    if stuck:
        raise InputError("the schedule deadlocks: " + ", ".join(stuck[:4]), field="schedule")

    makespan = max(clock, default=0.0)
    makespan = max(makespan, max(link_free, default=0.0))
    peaks = {d: peaks_now[i] for i, d in enumerate(devices)}
    timeline: dict[str, list[tuple[float, int]]] = {}
    if events:
        for i, d in enumerate(devices):
            timeline[d] = [*mem[i], (makespan, levels[i])]
    busy_ms = {d: busy[i] for i, d in enumerate(devices)}
    limits = {d: topology.device(d).memory_bytes for d in devices} if topology is not None else {}
    return SimResult(
        iteration_ms=makespan,
        memory_bytes=peaks,
        busy_ms=busy_ms,
        bubble_fraction=_bubble(busy_ms, makespan),
        lower_bound_ms=0.0,
        staleness=None,
        raw_events=raw_events,
        device_names=devices,
        schedule=schedule,
        raw_transfers=raw_transfers,
        memory_timeline=timeline,
        memory_limit_bytes=limits,
        static_bytes=static,
        makespan_ms=makespan,
        microbatch_size=microbatch_size,
        num_microbatches=schedule.num_microbatches,
        iterations=schedule.iterations,
    )


def _link_plan(
    topology: Topology,
    programs: list[Program],
    devices: list[str],
    stages: Sequence[StageSpec],
) -> tuple[dict[int, tuple[list[int], float, float, int, int]], list[list[int]]]:
    """Each transfer's route, and per directed link the order it serves transfers in.

    The order is the order in which the data becomes ready in a reference run of the same
    programs with the profile's times on speed-1 devices and free communication. It does
    not depend on device speeds or link bandwidths, which keeps the simulated times
    monotone in them (first-come-first-served by actual time is not: a slower device can
    reorder a queue and finish earlier), and it cannot deadlock: the reference run is a
    valid execution in which every transfer is ready after everything it depends on.
    """
    speed = [topology.device(d).speed for d in devices]
    sends = _reference_sends(programs, speed, stages)
    link_ids: dict[tuple[str, str], int] = {}
    routes: dict[int, tuple[list[int], float, float]] = {}
    queues: list[list[int]] = []
    xfer: dict[int, tuple[list[int], float, float, int, int]] = {}
    n = len(devices)
    for key, src, dst in sends:
        found = routes.get(src * n + dst)
        if found is None:
            a, b = devices[src], devices[dst]
            ids = []
            for hop in topology.route_links(a, b):
                if hop not in link_ids:
                    link_ids[hop] = len(queues)
                    queues.append([])
                ids.append(link_ids[hop])
            found = (ids, topology.latency_ms(a, b), topology.bandwidth(a, b))
            routes[src * n + dst] = found
        xfer[key] = (found[0], found[1], found[2], src, dst)
        for link in found[0]:
            queues[link].append(key)
    return xfer, queues


def _reference_sends(
    programs: list[Program], speed: list[float], stages: Sequence[StageSpec]
) -> list[tuple[int, int, int]]:
    """``(key, src, dst)`` of every transfer in the order its data is ready in a
    free-communication run (ties: the order the sends ran)."""
    num_dev = len(programs)
    clock = [0.0] * num_dev
    pos = [0] * num_dev
    arrival: dict[int, float] = {}
    waiting: dict[int, int] = {}
    sends: list[tuple[int, int, int]] = []
    ready: list[float] = []
    seen = [dict[int, int]() for _ in range(num_dev)]
    groups: dict[tuple[int, int], list[Any]] = {}
    runnable = list(range(num_dev - 1, -1, -1))
    while runnable:
        di = runnable.pop()
        prog, p, t, sp = programs[di], pos[di], clock[di], speed[di]
        n = len(prog)
        while p < n:
            code, s, _, dur, rkey, skey, dst, _, _ = prog[p]
            if rkey >= 0:
                at = arrival.get(rkey)
                if at is None:
                    waiting[rkey] = di
                    break
                if at > t:
                    t = at
            if code <= 3:
                t += dur * sp
            elif code == 8:
                occ = seen[di].get(s, 0)
                group = groups.setdefault((s, occ), [0, 0.0, []])
                if di not in group[2]:
                    group[0] += 1
                    group[1] = max(group[1], t)
                    group[2].append(di)
                if group[0] < len(stages[s].devices):
                    break
                seen[di][s] = occ + 1
                t = group[1]
                for w in group[2]:
                    if w != di:
                        seen[w][s] = occ + 1
                        clock[w] = t
                        pos[w] += 1
                        runnable.append(w)
            if skey >= 0:
                arrival[skey] = t
                ready.append(t)
                sends.append((skey, di, dst))
                w = waiting.pop(skey, -1)
                if w >= 0:
                    runnable.append(w)
            p += 1
        pos[di], clock[di] = p, t
    # A stable sort by time keeps the run's order among equal times.
    return [sends[i] for i in sorted(range(len(sends)), key=ready.__getitem__)]


def _devices_of(schedule: Schedule, stages: Sequence[StageSpec]) -> list[str]:
    if schedule.order is not None and schedule._devices is None:
        return list(dict.fromkeys(d for st in stages for d in st.devices))
    return list(schedule.devices)


def _describe(
    entry: tuple[int, int, int, float, int, int, int, int, int], devices: list[str], total_mb: int
) -> str:
    """An action's text form from its compiled entry (for deadlock messages)."""
    code, s, k, _, rkey, _, _, _, _ = entry
    if rkey >= 0:
        into, backward = divmod(rkey, 2)
        return f"{'RECV_B' if backward else 'RECV_F'}{into // total_mb}.{into % total_mb}"
    if code in (8, 9):
        return f"{_NAMES[code]}{s}"
    return f"{_NAMES[code]}{s}.{k}"


Program = list[tuple[int, int, int, float, int, int, int, int, int]]


def _compile(
    schedule: Schedule,
    stages: Sequence[StageSpec],
    devices: list[str],
    times: dict[tuple[int, str], tuple[float, float, float, float]],
    allreduce_ms: list[float],
    steps: list[float],
    total_mb: int,
    deltas: Sequence[Sequence[tuple[int, int]]],
) -> list[Program]:
    """Flat per-device programs of
    ``(code, stage, mb, duration, recv_key, send_key, dst, memory_grow, memory_shrink)``.

    Keys name a transfer: ``(stage * total_mb + mb) * 2`` for the activations entering
    ``stage``, ``+ 1`` for the gradient entering it from the next stage. Generated
    schedules compile straight from their compute order (each receive fused into its
    consumer, each send into its producer): the same semantics as the expanded lists,
    without building them.
    """
    index = {d: i for i, d in enumerate(devices)}
    last = len(stages) - 1
    t2 = total_mb
    programs: list[Program] = []
    if schedule.order is not None and schedule._devices is None:
        per_device: dict[str, list[tuple[str, int, int]]] = {d: [] for d in devices}
        for rank in sorted(schedule.order):
            for op in schedule.order[rank]:
                only = stages[op[1]].devices
                per_device[only[0] if len(only) == 1 else only[op[2] % len(only)]].append(op)
        m = schedule.num_microbatches
        single = [st.devices[0] if len(st.devices) == 1 else None for st in stages]

        def where(s: int, k: int) -> str:
            return single[s] or stages[s].replica(k)

        for d in devices:
            ops = per_device[d]
            closing: dict[tuple[int, int], int] = {}
            for i, (kind, s, k) in enumerate(ops):
                if kind != "F":
                    closing[(s, k // m)] = i
            closers = {i: key[0] for key, i in closing.items()}
            prog: Program = []
            append = prog.append
            tab = {s: times[(s, d)] for s in range(len(stages)) if (s, d) in times}
            # Per stage: do its neighbours sit elsewhere for every microbatch (True),
            # never (False), or does it depend on the replica (None)?
            fixed_prev: dict[int, bool | None] = {}
            fixed_next: dict[int, bool | None] = {}
            for s in tab:
                fixed_prev[s] = (
                    None if s and single[s - 1] is None else (bool(s) and single[s - 1] != d)
                )
                fixed_next[s] = (
                    None
                    if s < last and single[s + 1] is None
                    else (s < last and single[s + 1] != d)
                )
            for i, (kind, s, k) in enumerate(ops):
                rkey = skey = dst = -1
                prev_away = fixed_prev[s]
                if prev_away is None:
                    prev_away = where(s - 1, k) != d
                next_away = fixed_next[s]
                if next_away is None:
                    next_away = where(s + 1, k) != d
                if kind == "F":
                    code = 0
                    if prev_away:
                        rkey = (s * t2 + k) * 2
                    if next_away:
                        skey, dst = ((s + 1) * t2 + k) * 2, index[where(s + 1, k)]
                elif kind == "W":
                    code = 3
                else:
                    code = 1 if kind == "B" else 2
                    if next_away:
                        rkey = (s * t2 + k) * 2 + 1
                    if prev_away:
                        skey, dst = ((s - 1) * t2 + k) * 2 + 1, index[where(s - 1, k)]
                grow, shrink = deltas[s][code]
                append((code, s, k, tab[s][code], rkey, skey, dst, grow, shrink))
                if i in closers:
                    c = closers[i]
                    if len(stages[c].devices) > 1:
                        append((8, c, -1, allreduce_ms[c], -1, -1, -1, 0, 0))
                    append((9, c, -1, steps[c], -1, -1, -1, 0, 0))
            programs.append(prog)
        return programs
    for d in devices:
        prog = []
        for a in schedule.devices[d]:
            code = _CODE[a.kind]
            s, k = a.stage, a.microbatch
            if code <= 3:
                grow, shrink = deltas[s][code]
                prog.append((code, s, k, times[(s, d)][code], -1, -1, -1, grow, shrink))
            elif code == 4:  # SEND_F: activations into stage s+1
                peer = index[str(a.peer)]
                prog.append((4, s, k, 0.0, -1, ((s + 1) * t2 + k) * 2, peer, 0, 0))
            elif code == 5:
                prog.append((5, s, k, 0.0, (s * t2 + k) * 2, -1, -1, 0, 0))
            elif code == 6:  # SEND_B: gradient into stage s-1
                peer = index[str(a.peer)]
                prog.append((4, s, k, 0.0, -1, ((s - 1) * t2 + k) * 2 + 1, peer, 0, 0))
            elif code == 7:
                prog.append((5, s, k, 0.0, (s * t2 + k) * 2 + 1, -1, -1, 0, 0))
            elif code == 8:
                prog.append((8, s, -1, allreduce_ms[s], -1, -1, -1, 0, 0))
            else:
                prog.append((9, s, -1, steps[s], -1, -1, -1, 0, 0))
        programs.append(prog)
    return programs


def lower_bound_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    num_microbatches: int,
    microbatch_size: int,
    *,
    flush: bool = True,
    split_backward: bool = False,
) -> float:
    """``max(total work / devices, busiest device's work, one microbatch's critical path)``.

    Work is forward + backward (with recompute) on the device that runs each microbatch;
    the critical path is forward through every stage, backward back, with the transfers
    between them (no contention). With ``split_backward`` (zb, optimized) only the input
    half of each backward is on the path, plus the weight half of the stage it ends on.
    Schedules without a flush (2bw) overlap iterations, so only the work terms bound them.

    Example::

        lower_bound_ms(profile, topology, stages, 8, 4)
    """
    times, cut = _stage_tables(profile, topology, stages, microbatch_size)
    work: dict[str, float] = {}
    for st in stages:
        r = len(st.devices)
        for j, dev in enumerate(st.devices):
            count = num_microbatches // r + (1 if j < num_microbatches % r else 0)
            f, b, _, _ = times[(st.id, dev)]
            work[dev] = work.get(dev, 0.0) + count * (f + b)
    bound = max(max(work.values()), sum(work.values()) / len(work))
    if not flush:
        return bound
    path_max = 0.0
    for k in range(min(num_microbatches, 64)):
        devs = [st.replica(k) for st in stages]
        # Forward down the pipeline, then the (input-)gradient back up.
        down = 0.0
        for s, st in enumerate(stages):
            if s and topology is not None and devs[s - 1] != devs[s]:
                down += topology.transfer_ms(devs[s - 1], devs[s], cut[s])
            down += times[(st.id, devs[s])][0]
        up = down
        for s in range(len(stages) - 1, -1, -1):
            _, b, bi, bw = times[(stages[s].id, devs[s])]
            if s + 1 < len(stages) and topology is not None and devs[s + 1] != devs[s]:
                up += topology.transfer_ms(devs[s + 1], devs[s], cut[s + 1])
            if split_backward:
                up += bi
                path_max = max(path_max, up + bw)
            else:
                up += b
        path_max = max(path_max, up)
    return max(bound, path_max)


def plan_from_result(
    result: SimResult,
    stages: Sequence[StageSpec],
    *,
    profile_path: str | None,
    topology_path: str | None,
    solver: dict[str, Any] | None = None,
    baselines: list[dict[str, Any]] | None = None,
) -> Plan:
    """A :class:`~planner.plan.Plan` holding a simulated partition and its schedule.

    The profile's and topology's sha256 are recorded so ``show`` and ``run`` can refuse
    a plan whose inputs changed.

    Example::

        plan = plan_from_result(result, stages, profile_path="p.json", topology_path=None)
        plan.save("plan.json")
    """
    from planner.fileio import sha256_file
    from planner.plan import Plan

    def ref(path: str | None) -> dict[str, Any]:
        if path is None:
            return {"path": None, "sha256": None}
        return {"path": str(path), "sha256": sha256_file(path)}

    return Plan(
        profile=ref(profile_path),
        topology=ref(topology_path),
        microbatch_size=result.microbatch_size,
        num_microbatches=result.num_microbatches,
        stages=[StageSpec(s.id, (s.first, s.last), list(s.devices), s.recompute) for s in stages],
        schedule=result.schedule.to_dict(),
        predicted=result.predicted(),
        solver=solver or {"method": "manual", "status": "given", "seconds": 0.0, "gap": None},
        baselines=list(baselines or []),
    )
