"""A lower bound on a plan's simulated iteration time that counts the all-reduce.

:func:`planner.simulate.lower_bound_ms` (the bound plans report) leaves data-parallel
all-reduces out. In the simulator a device is busy for the whole of every ``ALLREDUCE`` of
a stage it holds (the ring time :meth:`~planner.topology.Topology.allreduce_ms` of the
stage's gradients, tied ones excluded), after its compute for that stage and before its
``STEP``; actions on one device never overlap. So no device finishes an iteration before

    its microbatches' forward + backward + its stages' all-reduces + its stages' steps,

which is :func:`busy_bound_ms`. In a pipeline a device of stage ``k`` also cannot start
before the first microbatch has gone forward through stages ``0 .. k-1``, and after its
last backward that microbatch's gradient still goes back through them
(:func:`pipeline_bound_ms`):

    head_k + its compute + max(tail_k, its all-reduce + step)

with ``head_k`` (``tail_k``) the fastest replica's forward (backward, or its input half
under zero-bubble) of each earlier stage. For equal stages under 1F1B that is exactly
``(m + p - 1)(f + b)``. The searches visit candidates in the order of the largest of these
and the simulator's own bound, and stop simulating once it cannot beat the best time
found: with the all-reduce and the fill and drain left out, almost every candidate would
get through.

Example::

    busy_bound_ms(profile, topology, stages, num_microbatches=16, microbatch_size=4)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.cost import stage_param_bytes, stage_step_ms, stage_tied_parameters, stage_times
from planner.plan import StageSpec
from planner.profile.schema import Profile
from planner.schedule.families import family

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["busy_bound_ms", "pipeline_bound_ms", "search_bound_ms"]


def busy_bound_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    num_microbatches: int,
    microbatch_size: int,
) -> float:
    """The busiest device's compute, all-reduce and optimizer-step time in one iteration.

    Microbatch ``k`` of a stage with ``r`` replicas runs on replica ``k % r``. Without a
    topology communication is free (no all-reduce time).

    Example::

        busy_bound_ms(profile, topology, parse_stages("0-3:gpu0,gpu1;4-7:gpu2"), 8, 4)
    """
    busy: dict[str, float] = {}
    for st in stages:
        r = len(st.devices)
        reduce_ms = _allreduce_ms(profile, topology, st)
        for j, dev in enumerate(st.devices):
            speed = topology.device(dev).speed if topology is not None else 1.0
            t = stage_times(
                profile, st.first, st.last, microbatch_size, speed=speed, recompute=st.recompute
            )
            count = num_microbatches // r + (1 if j < num_microbatches % r else 0)
            step = stage_step_ms(profile, st.first, st.last, speed=speed)
            busy[dev] = busy.get(dev, 0.0) + count * (t.forward_ms + t.backward_ms)
            busy[dev] += reduce_ms + step
    return max(busy.values(), default=0.0)


def pipeline_bound_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    num_microbatches: int,
    microbatch_size: int,
    *,
    split_backward: bool = False,
) -> float:
    """The fill and drain of a flushing pipeline around each device's own work (see the
    module docstring); 0.0 where a device holds several stages (interleaved).

    Example::

        pipeline_bound_ms(profile, topology, parse_stages("0-3:gpu0;4-7:gpu1"), 8, 4)
    """
    devices = [d for st in stages for d in st.devices]
    if len(set(devices)) != len(devices):
        return 0.0
    head = tail = 0.0
    bound = 0.0
    for st in stages:
        r = len(st.devices)
        reduce_ms = _allreduce_ms(profile, topology, st)
        fastest_f = fastest_back = float("inf")
        for j, dev in enumerate(st.devices):
            speed = topology.device(dev).speed if topology is not None else 1.0
            t = stage_times(
                profile, st.first, st.last, microbatch_size, speed=speed, recompute=st.recompute
            )
            count = num_microbatches // r + (1 if j < num_microbatches % r else 0)
            step = stage_step_ms(profile, st.first, st.last, speed=speed)
            if split_backward:
                through = count * (t.forward_ms + t.input_grad_ms)
                done = max(through + tail, through + count * t.weight_grad_ms + reduce_ms + step)
                back = t.input_grad_ms
            else:
                work = count * (t.forward_ms + t.backward_ms)
                done = work + max(tail, reduce_ms + step)
                back = t.backward_ms
            bound = max(bound, head + done)
            fastest_f = min(fastest_f, t.forward_ms)
            fastest_back = min(fastest_back, back)
        head += fastest_f
        tail += fastest_back
    return bound


def _allreduce_ms(profile: Profile, topology: Topology | None, st: StageSpec) -> float:
    """The simulator's ALLREDUCE of a replicated stage: its gradients less the tied ones."""
    if topology is None or len(st.devices) < 2:
        return 0.0
    tied = sum(t.param_bytes for t in stage_tied_parameters(profile, st.first, st.last))
    grads = stage_param_bytes(profile, st.first, st.last) - tied
    return _ring_ms(topology, tuple(st.devices), grads)


@functools.lru_cache(maxsize=1024)
def _ring_ms(topology: Topology, devices: tuple[str, ...], nbytes: int) -> float:
    # Searches bound many candidates that share stage groups; the ring's routes are the
    # costly part. (Topologies compare by identity, so a cached entry never outlives use.)
    return topology.allreduce_ms(list(devices), nbytes)


def search_bound_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: str,
    num_microbatches: int,
    microbatch_size: int,
) -> float:
    """A lower bound of the simulated iteration for a named schedule: the larger of
    :func:`busy_bound_ms` and :func:`pipeline_bound_ms` (flushing schedules, a device per
    stage), else of :func:`busy_bound_ms` and :func:`planner.simulate.lower_bound_ms`
    (interleaved or 2bw, whose critical path that bound follows).

    Example::

        search_bound_ms(profile, topology, stages, "1f1b", 8, 4)
    """
    busy = busy_bound_ms(profile, topology, stages, num_microbatches, microbatch_size)
    flush = family(schedule).flush
    if flush:
        piped = pipeline_bound_ms(
            profile,
            topology,
            stages,
            num_microbatches,
            microbatch_size,
            split_backward=schedule == "zb",
        )
        if piped > 0.0:
            return max(busy, piped)
    from planner.simulate import lower_bound_ms

    plain = lower_bound_ms(
        profile,
        topology,
        stages,
        num_microbatches,
        microbatch_size,
        flush=flush,
        split_backward=schedule == "zb",
    )
    return max(plain, busy)
