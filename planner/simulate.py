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
  transfers in this model); ``STEP s`` takes the stage's optimizer step: the profiled
  ``optimizer_ms`` of its layers divided by the device's speed (0 for profiles without
  it), unless an explicit ``step_ms`` replaces it;
* a tied parameter (``profile.tied_parameters``) is held, and counted in memory, by every
  stage that uses it; its gradient is exchanged by a ring all-reduce of its bytes among all
  devices of those stages, which each such device pays in its first STEP (of an iteration)
  of a stage that holds it. A replicated stage's ALLREDUCE leaves its tied parameters out;
* precision is the profile's: its times and bytes were measured under autocast. In fp16
  every device's STEPs come after its backward work, and its first STEP pays the
  all-reduce of one overflow flag among all devices (:func:`overflow_agreement_ms`).

Memory per device over time = weights + gradients + optimizer state of its stages (plus a
second weight version under 2bw) + the activations of the microbatches in flight, which
are stashed when a forward starts and freed when the backward (or W) ends; while a
forward, backward or half runs, the stage's workspace (``stage_workspace_bytes``), and
while a STEP runs the temporaries of its optimizer step (``stage_step_workspace_bytes``)
come on top. Both are measured on CUDA only; CPU profiles have none.

How it is computed: the event loop in :func:`simulate_schedule` is the definition. Over
a topology, schedules without all-reduces get the same numbers, bit for bit, from one
pass in a fixed order (:func:`_run_in_order`: the reference run's order, cached per
schedule shape, sorted by the reference times), which is several times faster for long
no-flush streams; peaks and busy times follow from program order alone
(:func:`_program_totals`).

Example::

    result = simulate(profile, topology, stages, "1f1b", num_microbatches=8)
    result.iteration_ms, result.memory_bytes["gpu0"], result.bubble_fraction
"""

from __future__ import annotations

import functools
import gc
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from itertools import accumulate, chain
from operator import add
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar

from planner.cost import (
    boundary_bytes,
    stage_activation_bytes,
    stage_param_bytes,
    stage_static_bytes,
    stage_step_ms,
    stage_step_workspace_bytes,
    stage_tied_parameters,
    stage_times,
    stage_workspace_bytes,
)
from planner.errors import InputError
from planner.plan import Plan, StageSpec, as_stages, validate_stages
from planner.profile.schema import Profile, as_profile
from planner.schedule import ActionType, Schedule, build_schedule, validate_schedule
from planner.schedule.tied import defer_tied_steps

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
    "overflow_agreement_ms",
    "tied_exchange_ms",
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
# Start a transfer as soon as its send has run and its links' queues reach it (False: in a
# pass after every device has run as far as it can, as the first versions did; the
# results are the same, which a test checks with this switch).
_START_AT_SEND = True
# Over a topology, compute the times in one pass in a fixed order (_run_in_order) instead
# of the event loop, where the schedule has no all-reduce; the results are the same,
# which a test checks with this switch.
_IN_ORDER = True


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
    # Optimizer step per stage (its slowest device's), as the iteration includes it.
    step_ms: list[float] = field(default_factory=list)

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
        if any(self.step_ms):  # absent: the prediction leaves the optimizer step out
            out["step_ms"] = [round(x, 6) for x in self.step_ms]
        return out


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _pausing_gc(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` with the cyclic garbage collector paused (as it was before, after).

    A long stream allocates hundreds of thousands of small tuples that form no cycles;
    the collector would walk them again and again during the run, and paused it walks
    them once, at its first collection afterwards (warm 64 x 512 2bw runs with events
    measured about 0.04 s of collection per run instead of 0.15 s).
    """

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return run


def _speed(topology: Topology | None, device: str) -> float:
    return 1.0 if topology is None else topology.device(device).speed


def _pick_microbatch_size(profile: Profile, microbatch_size: int | None) -> int:
    if microbatch_size is None:
        return profile.microbatch_sizes[0]
    profile.measurement(microbatch_size)  # names the profiled sizes if it is missing
    return microbatch_size


@_pausing_gc
def simulate(
    profile: Profile | str | os.PathLike[str],
    topology: Topology | str | os.PathLike[str] | None,
    stages: Sequence[StageSpec] | str | Sequence[Any],
    schedule: str | Schedule = "1f1b",
    num_microbatches: int = 8,
    microbatch_size: int | None = None,
    **opts: Any,
) -> SimResult:
    """Simulate one iteration of ``stages`` under ``schedule``.

    ``profile`` and ``topology`` may be paths; ``stages`` anything :func:`planner.plan.as_stages`
    reads (StageSpecs, ``"0-2:gpu0;3-5:gpu1"``, the plan JSON's stage objects, tuples).
    ``topology=None`` means free communication (devices need only distinct names).
    Options: ``virtual_stages`` (interleaved), ``step_ms`` (optimizer step per stage, a
    number or one per stage; default None: the profile's ``optimizer_ms`` of the stage's
    layers over the device's speed), ``events=False`` (skip the event list, for solver
    loops), ``validate`` (check a given Schedule, default True), ``memory_limits`` and
    ``iterations`` (passed on to the optimised schedule's search).

    Example::

        r = simulate(profile, None, parse_stages("0-1:a;2-3:b"), "gpipe", 8, 4)
        r.iteration_ms, r.memory_bytes
    """
    profile = as_profile(profile)
    if isinstance(topology, str | os.PathLike):
        from planner.topology import load_topology

        topology = load_topology(topology)
    stages = as_stages(stages)
    mbs = _pick_microbatch_size(profile, microbatch_size)
    name = schedule if isinstance(schedule, str) else schedule.name
    virtual = int(opts.get("virtual_stages", 1))
    shared = name == "interleaved" or (
        not isinstance(schedule, str) and schedule.virtual_stages > 1
    )
    validate_stages(stages, profile.num_layers, topology, allow_shared_devices=shared)
    if isinstance(schedule, str):
        extra: dict[str, Any] = {}
        if schedule == "optimized":
            extra = {
                "profile": profile,
                "topology": topology,
                "microbatch_size": mbs,
                "memory_limits": opts.get("memory_limits"),
                "step_ms": opts.get("step_ms"),
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
        step_ms=opts.get("step_ms"),
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
        step_ms=opts.get("step_ms"),
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


def _step_table(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    step_ms: float | Sequence[float] | None,
) -> dict[tuple[int, str], float]:
    """The STEP duration of each stage on each of its devices.

    ``None``: the profile's optimizer step of the stage's layers at the device's speed; a
    number (or one per stage) given explicitly is taken as it is, on every device.
    """
    if step_ms is None:
        return {
            (st.id, d): stage_step_ms(profile, st.first, st.last, speed=_speed(topology, d))
            for st in stages
            for d in st.devices
        }
    if isinstance(step_ms, int | float):
        given = [float(step_ms)] * len(stages)
    else:
        given = [float(x) for x in step_ms]
        if len(given) != len(stages):
            raise InputError(
                f"expected one step time per stage ({len(stages)}), got {len(given)}",
                field="step_ms",
            )
    return {(st.id, d): given[st.id] for st in stages for d in st.devices}


def tied_exchange_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
) -> dict[tuple[int, str], float]:
    """The time each device spends exchanging tied gradients, keyed by the STEP that pays it.

    Per tied parameter: a ring all-reduce of its ``param_bytes`` (the topology's
    ``allreduce_ms``) among every device of every stage that uses it. A device pays the
    exchanges of all the tied parameters it holds in its first ``STEP`` of a stage that
    holds any (where the runtime exchanges them). Nothing without a topology (free
    communication) or when one device holds all copies of a parameter.

    Example::

        tied_exchange_ms(profile, topology, stages, build_schedule("1f1b", stages, 8))
        # {(0, 'gpu0'): 0.41, (3, 'gpu1'): 0.41}
    """
    out: dict[tuple[int, str], float] = {}
    if topology is None or not profile.tied_parameters:
        return out
    per_device: dict[str, float] = {}
    holding: set[int] = set()  # stages that hold any tied parameter
    for tie in profile.tied_parameters:
        holders = [st for st in stages if tie.held_by(st.first, st.last)]
        holding.update(st.id for st in holders)
        devices = list(dict.fromkeys(d for st in holders for d in st.devices))
        if len(devices) > 1:
            ms = topology.allreduce_ms(devices, tie.param_bytes)
            for d in devices:
                per_device[d] = per_device.get(d, 0.0) + ms
    for d, ms in per_device.items():
        steps = (a.stage for a in schedule.devices[d] if a.kind is ActionType.OPTIMIZER_STEP)
        first = next((s for s in steps if s in holding), None)
        if first is not None:  # a hand-made list without a STEP: nothing to pay there
            out[(first, d)] = ms
    return out


def overflow_agreement_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
) -> dict[tuple[int, str], float]:
    """fp16: the all-reduce (MAX) of one overflow flag among every device, keyed by each
    device's first STEP, where the runtime agrees on it (:mod:`planner.runtime.loss_scale`).
    Nothing for another precision, without a topology, or on one device. The wait for the
    slowest device that this agreement also is, is not modelled.

    Example::

        overflow_agreement_ms(fp16_profile, topology, stages, schedule)
        # {(0, 'gpu0'): 0.011, (1, 'gpu1'): 0.011}
    """
    if profile.precision != "fp16" or topology is None:
        return {}
    devices = _devices_of(schedule, stages)
    if len(devices) < 2:
        return {}
    ms = topology.allreduce_ms(devices, 4)
    out: dict[tuple[int, str], float] = {}
    for d in devices:
        steps = [a.stage for a in schedule.devices[d] if a.kind is ActionType.OPTIMIZER_STEP]
        if steps:
            out[(steps[0], d)] = ms
    return out


def _with_deferred_steps(
    profile: Profile, stages: Sequence[StageSpec], schedule: Schedule
) -> Schedule:
    """The order the runtime runs: STEPs of tie-holding stages (of every stage in fp16,
    where all ranks agree on overflows at the first) after the device's backward work on
    such stages (:func:`planner.schedule.tied.defer_tied_steps`)."""
    holding = frozenset(
        st.id
        for st in stages
        if profile.precision == "fp16"
        or any(t.held_by(st.first, st.last) for t in profile.tied_parameters)
    )
    deferred = defer_tied_steps(schedule.devices, holding, schedule.num_microbatches)
    if deferred == schedule.devices:
        return schedule
    return Schedule(
        schedule.name,
        schedule.num_stages,
        schedule.num_microbatches,
        deferred,
        virtual_stages=schedule.virtual_stages,
        flush=schedule.flush,
        iterations=schedule.iterations,
        meta=schedule.meta,
    )


def _replica_allreduce_bytes(profile: Profile, spec: StageSpec) -> int:
    """What a replicated stage's ALLREDUCE sums: its gradients less the tied ones."""
    total = stage_param_bytes(profile, spec.first, spec.last)
    if not profile.tied_parameters:
        return total
    return total - sum(t.param_bytes for t in stage_tied_parameters(profile, spec.first, spec.last))


@_pausing_gc
def simulate_schedule(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    microbatch_size: int,
    *,
    step_ms: float | Sequence[float] | None = None,
    events: bool = True,
) -> SimResult:
    """Time an explicit schedule (no validation, no lower bound); the core event loop.

    A schedule that deadlocks raises an InputError naming where each device waits.

    Example::

        simulate_schedule(profile, None, stages, build_schedule("1f1b", stages, 8), 4)
    """
    if profile.tied_parameters or profile.precision == "fp16":
        schedule = _with_deferred_steps(profile, stages, schedule)
    times, cut = _stage_tables(profile, topology, stages, microbatch_size)
    devices = _devices_of(schedule, stages)
    num_dev = len(devices)
    total_mb = schedule.num_microbatches * schedule.iterations
    steps = _step_table(profile, topology, stages, step_ms)
    for key, ms in tied_exchange_ms(profile, topology, stages, schedule).items():
        steps[key] += ms
    for key, ms in overflow_agreement_ms(profile, topology, stages, schedule).items():
        steps[key] += ms
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
            topology.allreduce_ms(s.devices, _replica_allreduce_bytes(profile, s))
            if topology is not None and len(s.devices) > 1
            else 0.0
        )
        for s in stages
    ]

    # Memory change at the start and at the end of each compute kind (F, B, I, W): the
    # stash is taken when a forward starts and freed when B (or W) ends; with recompute
    # the rebuilt activations exist from the start of B (or I) until it (or W) ends; the
    # workspace exists while each runs.
    scratch = [stage_workspace_bytes(profile, s.first, s.last, microbatch_size) for s in stages]
    deltas = [
        (
            (stash[i] + scratch[i], -scratch[i]),
            (rebuilt[i] + scratch[i], -stash[i] - rebuilt[i] - scratch[i]),
            (rebuilt[i] + scratch[i], -scratch[i]),
            (scratch[i], -stash[i] - rebuilt[i] - scratch[i]),
        )
        for i in range(len(stages))
    ]
    shape = _compiled(schedule, stages, devices, total_mb)
    programs, work = shape.programs, shape.work
    # Per device, the duration of each slot (stage * _SLOTS + code); per slot the memory
    # taken at its start and given back at its end.
    durations: list[list[float]] = []
    for d in devices:
        table = [0.0] * (_SLOTS * len(stages))
        for si in range(len(stages)):
            if (si, d) in times:
                table[si * _SLOTS : si * _SLOTS + 4] = times[(si, d)]
                table[si * _SLOTS + 8] = allreduce_ms[si]
                table[si * _SLOTS + 9] = steps[(si, d)]
        durations.append(table)
    grows = [0] * (_SLOTS * len(stages))
    shrinks = [0] * (_SLOTS * len(stages))
    for si, spec in enumerate(stages):
        for code in range(4):
            grows[si * _SLOTS + code], shrinks[si * _SLOTS + code] = deltas[si][code]
        # The optimizer step's temporaries, while STEP runs.
        step_work = stage_step_workspace_bytes(profile, spec.first, spec.last)
        grows[si * _SLOTS + 9], shrinks[si * _SLOTS + 9] = step_work, -step_work

    def finish(
        clock: list[float],
        link_free: list[float],
        raw_events: list[tuple[int, int, int, int, float, float]],
        raw_transfers: list[tuple[int, int, int, int, float, float, int]],
        mem: list[list[tuple[float, int]]],
        levels: list[int],
    ) -> SimResult:
        makespan = max(clock, default=0.0)
        makespan = max(makespan, max(link_free, default=0.0))
        peak_list, busy = _program_totals(work, durations, grows, shrinks, levels_at_start)
        peaks = dict(zip(devices, peak_list, strict=True))
        timeline: dict[str, list[tuple[float, int]]] = {}
        if events:
            for i, d in enumerate(devices):
                timeline[d] = [*mem[i], (makespan, levels[i])]
        busy_ms = dict(zip(devices, busy, strict=True))
        limits = (
            {d: topology.device(d).memory_bytes for d in devices} if topology is not None else {}
        )
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
            step_ms=[max(steps[(st.id, d)] for d in st.devices) for st in stages],
        )

    # Transfers are named by small integer keys (see _compile): flat lists indexed by key
    # hold their state, with -1 for "not yet".
    num_keys = 2 * len(stages) * total_mb
    # The memory curve is tracked as the actions run: a device's allocations happen in
    # time order.
    levels = [static[d] for d in devices]
    levels_at_start = list(levels)
    mem: list[list[tuple[float, int]]] = [[(0.0, static[d])] for d in devices]
    # Over a topology, the times can be computed in one pass in a fixed order (see
    # _run_in_order): the same numbers as the event loop below, several times faster.
    if topology is not None and _IN_ORDER:
        order = shape.order(num_keys, total_mb, len(stages))
        if order is not None:
            run = _run_in_order(
                order,
                topology,
                devices,
                durations,
                cut,
                num_keys,
                grows,
                shrinks,
                levels,
                mem,
                record=events,
            )
            return finish(*run)
    # Links: each directed link serves its transfers one at a time in a fixed order (see
    # _link_plan), so that times are monotone in every duration.
    route_of: list[Any] = []
    queues: list[list[int]] = []
    head: list[int] = []
    head_key: list[int] = []  # the transfer each link serves next
    link_free: list[float] = []
    if topology is not None:
        route_of, queues = _link_plan(
            topology, programs, durations, devices, stages, num_keys, cut, total_mb
        )
        head = [0] * len(queues)
        head_key = [q[0] for q in queues]
        link_free = [0.0] * len(queues)

    clock = [0.0] * num_dev
    pos = [0] * num_dev
    arrival = [-1.0] * num_keys  # when the data is at its receiver
    waiting = [-1] * num_keys  # the device blocked on receiving it
    # When its send ran; one more entry, never ready, for the key ending each link queue.
    ready_at = [-1.0] * (num_keys + 1) if topology is not None else []
    pending: list[int] = []
    ar_seen = [dict[int, int]() for _ in range(num_dev)]
    ar_groups: dict[tuple[int, int], list[Any]] = {}
    raw_events: list[tuple[int, int, int, int, float, float]] = []
    raw_transfers: list[tuple[int, int, int, int, float, float, int]] = []
    free_comm = topology is None
    record = events
    at_send = _START_AT_SEND
    runnable = list(range(num_dev - 1, -1, -1))

    def launch(stack: list[int]) -> None:
        """Start every transfer in ``stack`` that is next in line on all links of its route,
        and then the ones behind it that became next in line and whose data is ready.

        A transfer's start is its ready time or, if later, the end of the transfer before it
        on each of its links: it does not depend on when this runs, so a transfer is
        started as soon as its send has run and its links' queues reach it.
        """
        while stack:
            key = stack.pop()
            if arrival[key] >= 0.0:
                continue  # queued twice (by its send and by the link ahead), started once
            links, lat, wire_ms, src, dst = route_of[key]
            start = ready_at[key]
            for link in links:
                if head_key[link] != key:
                    break  # it starts when the transfers ahead of it on this link are done
                if link_free[link] > start:
                    start = link_free[link]
            else:
                end = start + lat + wire_ms
                for link in links:
                    link_free[link] = end
                    h = head[link] + 1
                    head[link] = h
                    after = queues[link][h]  # the sentinel when the queue is done
                    head_key[link] = after
                    if ready_at[after] >= 0.0:
                        stack.append(after)
                arrival[key] = end
                if record:
                    into, backward = divmod(key, 2)
                    nbytes = cut[into // total_mb + backward]
                    raw_transfers.append((src, dst, backward, into, start, end, nbytes))
                w = waiting[key]
                if w >= 0:
                    waiting[key] = -1
                    runnable.append(w)

    while True:
        while runnable:
            di = runnable.pop()
            prog = programs[di]
            dtab = durations[di]
            n = len(prog)
            p = pos[di]
            t = clock[di]
            dmem = mem[di]
            level = levels[di]
            while p < n:
                code, s, k, slot, rkey, skey, _ = prog[p]
                if rkey >= 0:
                    at = arrival[rkey]
                    if at < 0.0:
                        waiting[rkey] = di
                        break
                    if at > t:
                        t = at
                if code <= 3:
                    dur = dtab[slot]
                    if record:
                        # The memory curve; the peaks and busy times need no times and
                        # are summed in program order afterwards (_program_totals).
                        end = t + dur
                        grow = grows[slot]
                        if grow:
                            level += grow
                            dmem.append((t, level))
                        shrink = shrinks[slot]
                        if shrink:
                            level += shrink
                            dmem.append((end, level))
                        raw_events.append((di, code, s, k, t, end))
                    t += dur
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
                    end = group[1] + dtab[slot]
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
                    dur = dtab[slot]
                    if record and dur > 0:
                        raw_events.append((di, 9, s, -1, t, t + dur))
                    if record and grows[slot]:  # the step's temporaries (CUDA profiles)
                        dmem.append((t, level + grows[slot]))
                        dmem.append((t + dur, level))
                    t += dur
                if skey >= 0:
                    if free_comm:
                        arrival[skey] = t
                        w = waiting[skey]
                        if w >= 0:
                            waiting[skey] = -1
                            runnable.append(w)
                    else:
                        ready_at[skey] = t
                        if not at_send:
                            pending.append(skey)
                            p += 1
                            continue
                        launch([skey])
                p += 1
            pos[di] = p
            clock[di] = t
            levels[di] = level
        if not pending:
            break
        launch(pending)

    stuck = [
        f"{devices[di]} waits at {_describe(programs[di][pos[di]], devices, total_mb)}"
        for di in range(num_dev)
        if pos[di] < len(programs[di])
    ]
    if stuck:
        raise InputError("the schedule deadlocks: " + ", ".join(stuck[:4]), field="schedule")

    return finish(clock, link_free, raw_events, raw_transfers, mem, levels)


def _link_plan(
    topology: Topology,
    programs: list[Program],
    durations: list[list[float]],
    devices: list[str],
    stages: Sequence[StageSpec],
    num_keys: int,
    cut: list[int],
    total_mb: int,
) -> tuple[list[Any], list[list[int]]]:
    """Each transfer's route (by key), and per directed link the order it serves transfers in.

    The order is the order in which the data becomes ready in a reference run of the same
    programs with the profile's times on speed-1 devices and free communication (ties: the
    order the sends ran). It does not depend on device speeds or link bandwidths, which
    keeps the simulated times monotone in them (first-come-first-served by actual time is
    not: a slower device can reorder a queue and finish earlier), and it cannot deadlock:
    the reference run is a valid execution in which every transfer is ready after
    everything it depends on. A transfer's route is ``(links, latency_ms, wire_ms, src,
    dst)`` (``wire_ms``: its bytes over the bottleneck bandwidth); each queue ends with the
    key ``num_keys``. (:func:`_run_in_order` reproduces these queues without building
    them: :func:`_reference_order` replays this run's order of execution.)
    """
    speed = [topology.device(d).speed for d in devices]
    n = len(devices)
    cuts = len(cut) + 1
    link_ids: dict[tuple[str, str], int] = {}
    queues: list[list[int]] = []
    route_of: list[Any] = [None] * num_keys
    # Per (device pair, cut): the route, and the appends to its links' queues.
    ways: dict[int, tuple[Any, list[Any]]] = {}

    def way_of(way: int) -> tuple[Any, list[Any]]:
        pair, c = divmod(way, cuts)
        src, dst = divmod(pair, n)
        a, b = devices[src], devices[dst]
        ids = []
        for hop in topology.route_links(a, b):
            if hop not in link_ids:
                link_ids[hop] = len(queues)
                queues.append([])
            ids.append(link_ids[hop])
        nbytes = cut[c]
        wire_ms = nbytes / topology.bandwidth(a, b) * 1e3 if nbytes else 0.0
        found = ways[way] = (
            (ids, topology.latency_ms(a, b), wire_ms, src, dst),
            [queues[link].append for link in ids],
        )
        return found

    # The reference run: each send joins its links' queues in the order the sends run.
    clock = [0.0] * n
    pos = [0] * n
    arrival = [-1.0] * num_keys
    waiting = [-1] * num_keys
    seen = [dict[int, int]() for _ in range(n)]
    groups: dict[tuple[int, int], list[Any]] = {}
    runnable = list(range(n - 1, -1, -1))
    while runnable:
        di = runnable.pop()
        prog, p, t, sp = programs[di], pos[di], clock[di], speed[di]
        dtab = durations[di]
        size = len(prog)
        src = di * n
        while p < size:
            code, s, _, slot, rkey, skey, dst = prog[p]
            if rkey >= 0:
                at = arrival[rkey]
                if at < 0.0:
                    waiting[rkey] = di
                    break
                if at > t:
                    t = at
            if code <= 3:
                t += dtab[slot] * sp
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
                # The cut it crosses: its receiving stage's input, or its gradient.
                way = (src + dst) * cuts + (skey >> 1) // total_mb + (skey & 1)
                found = ways.get(way) or way_of(way)
                route_of[skey] = found[0]
                for append in found[1]:
                    append(skey)
                w = waiting[skey]
                if w >= 0:
                    waiting[skey] = -1
                    runnable.append(w)
            p += 1
        pos[di], clock[di] = p, t
    # Stable sorts by ready time keep the run's order among equal times. Each device's
    # sends are in time order already, so a queue is a merge of sorted runs: cheap.
    for queue in queues:
        queue.sort(key=arrival.__getitem__)
        queue.append(num_keys)
    return route_of, queues


def _run_in_order(
    order: _Order,
    topology: Topology,
    devices: list[str],
    durations: list[list[float]],
    cut: list[int],
    num_keys: int,
    grows: list[int],
    shrinks: list[int],
    levels: list[int],
    mem: list[list[tuple[float, int]]],
    *,
    record: bool,
) -> tuple[
    list[float],
    list[float],
    list[tuple[int, int, int, int, float, float]],
    list[tuple[int, int, int, int, float, float, int]],
    list[list[tuple[float, int]]],
    list[int],
]:
    """The event loop's times, computed action by action in one fixed order.

    Every action and transfer depends only on actions and transfers whose time in the
    reference run of :func:`_link_plan` is earlier, or the same and that ran before it
    there: its device's previous action, the send of the data it receives, and the
    transfers ahead of it in its links' queues (which :func:`_link_plan` orders by that
    very key). So the reference run's order of execution (:class:`_Order`, fixed per
    shape), sorted stably by the reference times, is an order in which everything an
    action waits for is known when it is reached: no device blocks, no queue is kept,
    and each time is the same maximum of the same sums as in the event loop, so the
    same float. Returns what the event loop leaves: clocks, link-free times, events,
    transfers, memory curves and levels.
    """
    steps, ways, programs = order
    # Durations of all devices end to end, then the empty action's 0; the reference
    # run's are the profile's on speed-1 devices, computed as _link_plan computes them.
    table = [*chain.from_iterable(durations), 0.0]
    ref = [
        *chain.from_iterable(
            [x * sp for x in dtab]
            for dtab, sp in zip(durations, [topology.device(d).speed for d in devices], strict=True)
        ),
        0.0,
    ]
    n, cuts = len(devices), len(cut) + 1
    link_ids: dict[tuple[str, str], int] = {}
    routes: dict[int, tuple[tuple[int, ...], float, float, int, int, int]] = {}
    for way in sorted(ways):
        pair, c = divmod(way, cuts)
        src, dst = divmod(pair, n)
        a, b = devices[src], devices[dst]
        ids = tuple(link_ids.setdefault(hop, len(link_ids)) for hop in topology.route_links(a, b))
        nbytes = cut[c]
        wire_ms = nbytes / topology.bandwidth(a, b) * 1e3 if nbytes else 0.0
        routes[way] = (ids, topology.latency_ms(a, b), wire_ms, src, dst, nbytes)

    # The reference run. A key's time is only read after its send wrote it; the entry
    # after the keys stays 0 for "no receive", the one after it takes "no send".
    clock = [0.0] * len(devices)
    ready = [0.0] * (num_keys + 2)
    ends: list[float] = []
    end_of = ends.append
    for di, recv, slot, _, send, _, _ in steps:
        t = clock[di]
        at = ready[recv]
        if at > t:
            t = at
        t += ref[slot]
        clock[di] = t
        ready[send] = t
        end_of(t)
    # Stable: among equal times, the order the reference run executed them.
    ranked = sorted(range(len(ends)), key=ends.__getitem__)

    no_send = num_keys + 1
    clock = [0.0] * len(devices)
    arrival = ready  # reused: each key is written by its send before it is read
    link_free = [0.0] * len(link_ids)
    raw_events: list[tuple[int, int, int, int, float, float]] = []
    raw_transfers: list[tuple[int, int, int, int, float, float, int]] = []
    if not record:
        for di, recv, _, slot, skey, way, _ in map(steps.__getitem__, ranked):
            t = clock[di]
            at = arrival[recv]
            if at > t:
                t = at
            t += table[slot]
            clock[di] = t
            if skey != no_send:
                links, lat, wire_ms, _, _, _ = routes[way]
                start = t
                if len(links) == 2:  # through one switch, the usual route: unrolled
                    first, second = links
                    if link_free[first] > start:
                        start = link_free[first]
                    if link_free[second] > start:
                        start = link_free[second]
                    link_free[first] = link_free[second] = end = start + lat + wire_ms
                else:
                    for link in links:
                        if link_free[link] > start:
                            start = link_free[link]
                    end = start + lat + wire_ms
                    for link in links:
                        link_free[link] = end
                arrival[skey] = end
        return clock, link_free, raw_events, raw_transfers, mem, levels
    event = raw_events.append
    transfer = raw_transfers.append
    for j in ranked:
        di, recv, _, slot, skey, way, at = steps[j]
        code, s, k, kslot, _, _, _ = programs[di][at]
        t = clock[di]
        at = arrival[recv]
        if at > t:
            t = at
        dur = table[slot]
        end = t + dur
        if code <= 3:
            grow = grows[kslot]
            shrink = shrinks[kslot]
            if grow or shrink:
                level = levels[di]
                if grow:
                    level += grow
                    mem[di].append((t, level))
                if shrink:
                    level += shrink
                    mem[di].append((end, level))
                levels[di] = level
            event((di, code, s, k, t, end))
        elif code == 9:
            if dur > 0:
                event((di, 9, s, -1, t, end))
            if grows[kslot]:  # the step's temporaries (CUDA profiles)
                mem[di].append((t, levels[di] + grows[kslot]))
                mem[di].append((end, levels[di]))
        t = end
        clock[di] = t
        if skey != no_send:
            links, lat, wire_ms, src, dst, nbytes = routes[way]
            start = t
            for link in links:
                if link_free[link] > start:
                    start = link_free[link]
            end = start + lat + wire_ms
            for link in links:
                link_free[link] = end
            arrival[skey] = end
            transfer((src, dst, skey & 1, skey >> 1, start, end, nbytes))
    return clock, link_free, raw_events, raw_transfers, mem, levels


def _devices_of(schedule: Schedule, stages: Sequence[StageSpec]) -> list[str]:
    if schedule.order is not None and schedule._devices is None:
        return list(dict.fromkeys(d for st in stages for d in st.devices))
    return list(schedule.devices)


def _describe(
    entry: tuple[int, int, int, int, int, int, int], devices: list[str], total_mb: int
) -> str:
    """An action's text form from its compiled entry (for deadlock messages)."""
    code, s, k, _, rkey, _, _ = entry
    if rkey >= 0:
        into, backward = divmod(rkey, 2)
        return f"{'RECV_B' if backward else 'RECV_F'}{into // total_mb}.{into % total_mb}"
    if code in (8, 9):
        return f"{_NAMES[code]}{s}"
    return f"{_NAMES[code]}{s}.{k}"


_Entry = tuple[int, int, int, int, int, int, int]
Program = list[_Entry]
# An action as _run_in_order reads it (see _Order).
_Step = tuple[int, int, int, int, int, int, int]
# Slots per stage in the duration tables: codes 0-3 (F, B, I, W), 8 (ALLREDUCE), 9 (STEP).
_SLOTS = 10
# Compiled generated orders, most recent last: the solver simulates many partitions of one
# shape, whose programs differ only in their durations (which live in separate tables).
_COMPILED: list[tuple[tuple[Any, ...], Any, _Shape]] = []
_COMPILED_KEEP = 2


class _Order(NamedTuple):
    """The actions of all devices in the order the reference run of :func:`_link_plan`
    executes them (which depends on the programs alone, not on any time).

    ``steps`` holds per action ``(device, recv, ref_slot, slot, send, way, index)``,
    ``index`` being its place in its device's program (``programs``). Only ints, so
    that the collector stops tracking them. Slots index the devices' duration tables laid
    end to end, followed by a 0 for an action that takes no time (``ref_slot``: the
    reference run times compute only, as :func:`_link_plan` does). ``recv`` is the
    received key or ``num_keys`` (a time that stays 0) for none; ``send`` the sent key
    or ``num_keys + 1`` (written, never read) for none. ``way`` encodes the ``(src,
    dst, cut)`` of a send as ``(src * devices + dst) * cuts + cut`` (``ways``: all of
    them).
    """

    steps: list[_Step]
    ways: set[int]
    programs: list[Program]


class _Shape:
    """Compiled programs and what depends on them alone (cached with them): per program
    the slots of its work (compute and optimizer steps) in program order, and the
    reference run's order of execution (see :func:`_run_in_order`)."""

    def __init__(self, programs: list[Program]) -> None:
        import numpy as np  # here, as in _program_totals

        self.programs = programs
        self.work = [
            np.array([e[3] for e in prog if e[0] <= 3 or e[0] == 9], dtype=np.intp)
            for prog in programs
        ]
        self._order: _Order | None = None
        self._no_order = False

    def order(self, num_keys: int, total_mb: int, num_stages: int) -> _Order | None:
        """The reference run's order, or None where the event loop is needed: for
        all-reduces (their barriers) and for schedules that deadlock (its message)."""
        if self._order is None and not self._no_order:
            self._order = _reference_order(self.programs, num_keys, total_mb, num_stages)
            self._no_order = self._order is None
        return self._order


def _reference_order(
    programs: list[Program], num_keys: int, total_mb: int, num_stages: int
) -> _Order | None:
    """Run the programs as :func:`_link_plan`'s reference run does (a device runs until a
    receive whose send has not run yet; the same stack of runnable devices), without
    times, and list the actions in the order they run."""
    if any(8 in {e[0] for e in prog} for prog in programs):
        return None
    n = len(programs)
    width = _SLOTS * num_stages
    zero = n * width
    no_recv, no_send = num_keys, num_keys + 1
    cuts = num_stages + 1
    # One int object per slot: a cached order holds hundreds of thousands of them.
    slots = list(range(zero + 1))
    per_device = [
        [
            (
                di,
                rkey if rkey >= 0 else no_recv,
                slots[di * width + slot] if kind <= 3 else zero,
                slots[di * width + slot] if kind <= 3 or kind == 9 else zero,
                skey if skey >= 0 else no_send,
                # The cut a send crosses: its receiving stage's input, or its gradient.
                (di * n + dst) * cuts + (skey >> 1) // total_mb + (skey & 1) if skey >= 0 else -1,
                at,
            )
            for at, (kind, _, _, slot, rkey, skey, dst) in enumerate(prog)
        ]
        for di, prog in enumerate(programs)
    ]
    steps: list[_Step] = []
    pos = [0] * n
    sent = bytearray(num_keys + 2)
    sent[no_recv] = 1
    waiting = [-1] * (num_keys + 2)
    runnable = list(range(n - 1, -1, -1))
    while runnable:
        di = runnable.pop()
        own, start = per_device[di], pos[di]
        p, size = start, len(own)
        while p < size:
            _, recv, _, _, send, _, _ = own[p]
            if not sent[recv]:
                waiting[recv] = di
                break
            sent[send] = 1
            w = waiting[send]
            if w >= 0:
                waiting[send] = -1
                runnable.append(w)
            p += 1
        pos[di] = p
        steps += own[start:p]
    if len(steps) != sum(map(len, programs)):
        return None
    return _Order(steps, {step[5] for step in steps if step[5] >= 0}, programs)


def _compiled(
    schedule: Schedule, stages: Sequence[StageSpec], devices: list[str], total_mb: int
) -> _Shape:
    """:func:`_compile`, cached for generated orders by their shape."""
    if schedule.order is None or schedule._devices is not None:
        return _Shape(_compile(schedule, stages, devices, total_mb))
    key = (
        id(schedule.order),
        schedule.num_microbatches,
        total_mb,
        tuple(devices),
        tuple(tuple(st.devices) for st in stages),
    )
    for i, (k, order, found) in enumerate(_COMPILED):
        # The entry holds its order, so the id cannot be reused while it is cached.
        if k == key and order is schedule.order:
            _COMPILED.append(_COMPILED.pop(i))
            return found
    shape = _Shape(_compile(schedule, stages, devices, total_mb))
    _COMPILED.append((key, schedule.order, shape))
    del _COMPILED[:-_COMPILED_KEEP]
    return shape


def _program_totals(
    work: Sequence[Any],
    durations: list[list[float]],
    grows: list[int],
    shrinks: list[int],
    static: list[int],
) -> tuple[list[int], list[float]]:
    """Per device the peak memory and the busy time, which follow from the program order
    alone: allocations happen in program order, and work is summed action by action in it
    (the same additions in the same order as an event loop would make, so the same floats).
    ``work`` holds per device the slots of its compute and steps, in program order.
    """
    import numpy as np  # here: commands that never simulate do not pay for the import

    longest = max(map(len, work), default=0)
    if max(map(abs, [*grows, *shrinks]), default=0) * 2 * longest >= 2**62:
        return _program_totals_exact(work, durations, grows, shrinks, static)
    up, down = np.array(grows, dtype=np.int64), np.array(shrinks, dtype=np.int64)
    moves = np.empty(2 * longest, dtype=np.int64)
    peaks, busy = [], []
    for slots, dtab, base in zip(work, durations, static, strict=True):
        if not len(slots):
            peaks.append(base)
            busy.append(0.0)
            continue
        at = np.asarray(slots, dtype=np.intp)
        size = 2 * len(slots)
        moves[:size:2], moves[1:size:2] = up[at], down[at]
        # Frees never exceed the level just before them: the peak follows an allocation.
        peaks.append(base + max(0, int(np.cumsum(moves[:size]).max())))
        # An accumulation adds one element at a time, in order (a sum would add pairwise).
        busy.append(float(np.cumsum(np.array(dtab)[at])[-1]))
    return peaks, busy


def _program_totals_exact(
    work: Sequence[Any],
    durations: list[list[float]],
    grows: list[int],
    shrinks: list[int],
    static: list[int],
) -> tuple[list[int], list[float]]:
    """:func:`_program_totals` in Python ints, for memory sizes too large for int64."""
    moves = [(g, x) for g, x in zip(grows, shrinks, strict=True)]
    peaks, busy = [], []
    for slots, dtab, base in zip(work, durations, static, strict=True):
        steps = accumulate(chain.from_iterable(map(moves.__getitem__, slots)), initial=base)
        peaks.append(max(steps))
        busy.append(reduce(add, map(dtab.__getitem__, slots), 0.0))
    return peaks, busy


def _compile(
    schedule: Schedule,
    stages: Sequence[StageSpec],
    devices: list[str],
    total_mb: int,
) -> list[Program]:
    """Flat per-device programs of ``(code, stage, mb, slot, recv_key, send_key, dst)``.

    ``slot`` (``stage * _SLOTS + code``) indexes the device's duration table and the
    memory deltas, so that programs depend only on the schedule's shape. Keys name a
    transfer: ``(stage * total_mb + mb) * 2`` for the activations entering
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
            tab = [s for s in range(len(stages)) if d in stages[s].devices]
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
            # Per stage, where neighbours are fixed: the receive and send key bases and
            # the peer of each compute kind (keys step by 2 per microbatch).
            fixed: dict[tuple[str, int], tuple[int, int, int, int]] = {}
            for s in tab:
                prev_away, next_away = fixed_prev[s], fixed_next[s]
                if prev_away is None or next_away is None:
                    continue
                after, before = single[s + 1] if next_away else None, single[s - 1] if s else None
                down = index[after] if after is not None else -1
                up = index[before] if prev_away and before is not None else -1
                fixed[("F", s)] = (
                    0,
                    s * t2 * 2 if prev_away else -1,
                    (s + 1) * t2 * 2 if next_away else -1,
                    down,
                )
                fixed[("W", s)] = (3, -1, -1, -1)
                for kind, code in (("B", 1), ("I", 2)):
                    fixed[(kind, s)] = (
                        code,
                        s * t2 * 2 + 1 if next_away else -1,
                        (s - 1) * t2 * 2 + 1 if prev_away else -1,
                        up,
                    )
            for i, (kind, s, k) in enumerate(ops):
                found = fixed.get((kind, s))
                if found is not None:
                    code, rbase, sbase, dst = found
                    append(
                        (
                            code,
                            s,
                            k,
                            s * _SLOTS + code,
                            rbase + 2 * k if rbase >= 0 else -1,
                            sbase + 2 * k if sbase >= 0 else -1,
                            dst,
                        )
                    )
                    if i in closers:
                        c = closers[i]
                        if len(stages[c].devices) > 1:
                            append((8, c, -1, c * _SLOTS + 8, -1, -1, -1))
                        append((9, c, -1, c * _SLOTS + 9, -1, -1, -1))
                    continue
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
                append((code, s, k, s * _SLOTS + code, rkey, skey, dst))
                if i in closers:
                    c = closers[i]
                    if len(stages[c].devices) > 1:
                        append((8, c, -1, c * _SLOTS + 8, -1, -1, -1))
                    append((9, c, -1, c * _SLOTS + 9, -1, -1, -1))
            programs.append(prog)
        return programs
    for d in devices:
        prog = []
        for a in schedule.devices[d]:
            code = _CODE[a.kind]
            s, k = a.stage, a.microbatch
            if code <= 3:
                prog.append((code, s, k, s * _SLOTS + code, -1, -1, -1))
            elif code == 4:  # SEND_F: activations into stage s+1
                peer = index[str(a.peer)]
                prog.append((4, s, k, 0, -1, ((s + 1) * t2 + k) * 2, peer))
            elif code == 5:
                prog.append((5, s, k, 0, (s * t2 + k) * 2, -1, -1))
            elif code == 6:  # SEND_B: gradient into stage s-1
                peer = index[str(a.peer)]
                prog.append((4, s, k, 0, -1, ((s - 1) * t2 + k) * 2 + 1, peer))
            elif code == 7:
                prog.append((5, s, k, 0, (s * t2 + k) * 2 + 1, -1, -1))
            elif code == 8:
                prog.append((8, s, -1, s * _SLOTS + 8, -1, -1, -1))
            else:
                prog.append((9, s, -1, s * _SLOTS + 9, -1, -1, -1))
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
    step_ms: float | Sequence[float] | None = None,
) -> float:
    """``max(total work / devices, busiest device's work, one microbatch's critical path)``.

    Work is forward + backward (with recompute) on the device that runs each microbatch,
    plus one optimizer step per stage the device holds (every replica steps once per
    iteration; ``step_ms`` as in :func:`simulate`, default the profile's); the critical
    path is forward through every stage, backward back, with the transfers between them
    (no contention; a hand-written order may put a STEP anywhere, so the path leaves it
    out). With ``split_backward`` (zb, optimized) only the input half of each
    backward is on the path, plus the weight half of the stage it ends on. Schedules
    without a flush (2bw) overlap iterations, so only the work terms bound them.

    Example::

        lower_bound_ms(profile, topology, stages, 8, 4)
    """
    times, cut = _stage_tables(profile, topology, stages, microbatch_size)
    steps = _step_table(profile, topology, stages, step_ms)
    work: dict[str, float] = {}
    for st in stages:
        r = len(st.devices)
        for j, dev in enumerate(st.devices):
            count = num_microbatches // r + (1 if j < num_microbatches % r else 0)
            f, b, _, _ = times[(st.id, dev)]
            work[dev] = work.get(dev, 0.0) + count * (f + b) + steps[(st.id, dev)]
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
