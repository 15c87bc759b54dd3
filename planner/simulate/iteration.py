"""One training iteration of a partition: :func:`simulate`.

It reads its inputs (paths or objects), builds and checks the schedule, times it with
:func:`~planner.simulate.timing.simulate_schedule` (a no-flush schedule as the average
iteration of a stream), and adds the lower bound.

Example::

    result = simulate(profile, topology, stages, "1f1b", num_microbatches=8)
    result.iteration_ms, result.memory_bytes["gpu0"], result.bubble_fraction
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from planner.limits import check_schedule_size
from planner.precision import check_fp16_schedule
from planner.profile.schema import Profile, as_profile
from planner.schedule import (
    Schedule,
    as_stream,
    build_schedule,
    checked_virtual_stages,
    family,
    is_interleaved,
    validate_schedule,
)
from planner.shape import PlanShape
from planner.simulate.bounds import lower_bound_ms
from planner.simulate.order_search import optimized_schedule
from planner.simulate.result import SimResult, bubble
from planner.simulate.shards import forget_views
from planner.simulate.timing import Engine, pausing_gc, simulate_schedule
from planner.stages import StageSpec, as_stages, validate_stages
from planner.topology import Topology, load_topology

__all__ = ["STREAM_ITERATIONS", "simulate", "simulate_shape"]

# A no-flush schedule (2bw) is timed as the average iteration of a stream this long: the
# pipeline fills and drains once per stream. (Differences of two stream lengths estimate
# the steady state more closely but are not monotone in the durations.)
STREAM_ITERATIONS = 4


@pausing_gc
def simulate(
    profile: Profile | str | os.PathLike[str],
    topology: Topology | str | os.PathLike[str] | None,
    stages: Sequence[StageSpec] | str | Sequence[Any],
    schedule: str | Schedule = "1f1b",
    num_microbatches: int = 8,
    microbatch_size: int | None = None,
    *,
    virtual_stages: int = 1,
    step_ms: float | Sequence[float] | None = None,
    events: bool = True,
    validate: bool = True,
    memory_limits: Mapping[str, int] | None = None,
    engine: Engine = "auto",
    over_limit: bool = False,
    bound: bool = True,
) -> SimResult:
    """Simulate one iteration of ``stages`` under ``schedule``.

    ``profile`` and ``topology`` may be paths; ``stages`` anything :func:`planner.plan.as_stages`
    reads (StageSpecs, ``"0-2:gpu0;3-5:gpu1"``, the plan JSON's stage objects, tuples).
    ``topology=None`` means free communication (devices need only distinct names).
    Options: ``virtual_stages`` (interleaved), ``step_ms`` (optimizer step per stage, a
    number or one per stage; default None: the profile's ``optimizer_ms`` of the stage's
    layers over the device's speed), ``events=False`` (skip the event list, for solver
    loops), ``validate`` (check a given Schedule), ``memory_limits`` (per device, for the
    optimized schedule's search; default the topology's), ``engine`` (how the times are
    computed: :func:`~planner.simulate.timing.simulate_schedule`), ``bound=False`` (leave
    ``lower_bound_ms`` at 0: a solver loop that reads only the time and the memory; the
    result's ``schedule`` is then the one built, its deferred STEPs moved only where it is
    timed).

    Example::

        r = simulate(profile, None, parse_stages("0-1:a;2-3:b"), "gpipe", 8, 4)
        r.iteration_ms, r.memory_bytes
    """
    profile = as_profile(profile)
    forget_views()  # a profile changed in place since the last call is read as it is now
    if isinstance(topology, str | os.PathLike):
        topology = load_topology(topology)
    stages = as_stages(stages)
    mbs = _pick_microbatch_size(profile, microbatch_size)
    name = schedule if isinstance(schedule, str) else schedule.name
    shared = is_interleaved(name) or (not isinstance(schedule, str) and schedule.virtual_stages > 1)
    validate_stages(stages, profile.num_layers, topology, allow_shared_devices=shared)
    if isinstance(schedule, str):
        # Before the schedule is built: stages x microbatches bounds its size.
        check_schedule_size(len(stages), num_microbatches, field="num_microbatches")
        sched = _build(
            schedule,
            profile,
            topology,
            stages,
            num_microbatches,
            mbs,
            virtual_stages=int(virtual_stages),
            memory_limits=memory_limits,
            step_ms=step_ms,
        )
    else:
        sched = schedule
        if validate:
            validate_schedule(sched, stages)
    check_fp16_schedule(profile.precision, sched.name, sched.flush)
    result = _time(
        profile, topology, stages, sched, mbs, step_ms, events, engine, over_limit, lean=not bound
    )
    if bound:
        result.lower_bound_ms = lower_bound_ms(
            profile,
            topology,
            stages,
            sched.num_microbatches,
            mbs,
            flush=sched.flush,
            split_backward=sched.splits_backward,
            step_ms=step_ms,
        )
    if not sched.flush:
        result.staleness = [1] * len(stages)
    return result


def simulate_shape(
    profile: Profile,
    topology: Topology | None,
    shape: PlanShape,
    *,
    over_limit: bool = False,
    bound: bool = True,
) -> SimResult:
    """:func:`simulate` of a :class:`~planner.shape.PlanShape` without events: the inner
    loop of the solver and of the tuned peers. Raises InputError when the schedule cannot
    run that shape; with ``over_limit``, :class:`~planner.simulate.timing.OverLimit` (every
    device's peak memory) where a device's memory is exceeded, before any time is worked
    out; ``bound=False``: no ``lower_bound_ms`` (0), for a caller that reads only the time
    and the memory.

    Example::

        simulate_shape(profile, topology, shape).iteration_ms
        simulate_shape(profile, topology, shape, bound=False).memory_bytes
    """
    return simulate(
        profile,
        topology,
        list(shape.stages),
        schedule=shape.schedule,
        num_microbatches=shape.num_microbatches,
        microbatch_size=shape.microbatch_size,
        virtual_stages=shape.virtual_stages,
        events=False,
        over_limit=over_limit,
        bound=bound,
    )


def _pick_microbatch_size(profile: Profile, microbatch_size: int | None) -> int:
    if microbatch_size is None:
        return profile.microbatch_sizes[0]
    profile.measurement(microbatch_size)  # names the profiled sizes if it is missing
    return microbatch_size


def _build(
    name: str,
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    num_microbatches: int,
    microbatch_size: int,
    *,
    virtual_stages: int,
    memory_limits: Mapping[str, int] | None,
    step_ms: float | Sequence[float] | None,
) -> Schedule:
    """The named schedule (the optimized one searches by simulating)."""
    if not family(name).searched:
        return build_schedule(name, stages, num_microbatches, virtual_stages=virtual_stages)
    checked_virtual_stages(name, stages, num_microbatches, virtual_stages)
    return optimized_schedule(
        stages,
        num_microbatches,
        profile=profile,
        topology=topology,
        microbatch_size=microbatch_size,
        memory_limits=memory_limits,
        step_ms=step_ms,
    )


def _time(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    sched: Schedule,
    microbatch_size: int,
    step_ms: float | Sequence[float] | None,
    events: bool,
    engine: Engine,
    over_limit: bool = False,
    *,
    lean: bool = False,
) -> SimResult:
    """Time ``sched``; a no-flush schedule as the average iteration of a stream of
    :data:`STREAM_ITERATIONS` (one fill and drain), whose events show the whole stream.
    ``over_limit``: :class:`~planner.simulate.timing.OverLimit` instead where a device's
    memory is exceeded; ``lean``: only the time and the memory are read
    (:func:`~planner.simulate.timing.simulate_schedule`)."""
    timed = as_stream(sched, stages, STREAM_ITERATIONS)
    if timed is None:
        return simulate_schedule(
            profile,
            topology,
            stages,
            sched,
            microbatch_size,
            step_ms=step_ms,
            events=events,
            engine=engine,
            over_limit=over_limit,
            lean=lean,
        )
    result = simulate_schedule(
        profile,
        topology,
        stages,
        timed,
        microbatch_size,
        step_ms=step_ms,
        events=events,
        engine=engine,
        over_limit=over_limit,
        lean=lean,
    )
    k = STREAM_ITERATIONS
    result.iteration_ms = result.makespan_ms / k
    result.busy_ms = {d: b / k for d, b in result.busy_ms.items()}
    result.bubble_fraction = bubble(result.busy_ms, result.iteration_ms)
    result.schedule = sched
    return result
