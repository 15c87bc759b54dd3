"""Microbatch schedules: generators, the action data types and validation.

Example::

    from planner.schedule import build_schedule
    sched = build_schedule("1f1b", stages, num_microbatches=8)
    print(sched.text())
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from planner.errors import InputError
from planner.schedule.actions import COMPUTE, Action, ActionType, Schedule
from planner.schedule.expand import ComputeOp
from planner.schedule.families import FAMILIES, Family, family, is_interleaved
from planner.schedule.gpipe import gpipe_order
from planner.schedule.interleaved import interleaved_order
from planner.schedule.onef1b import onef1b_order
from planner.schedule.replicas import per_replica_order, replica_round
from planner.schedule.validate import validate_order, validate_schedule
from planner.schedule.zerobubble import zb_order
from planner.stages import StageSpec, refuse_tensor_parallel

__all__ = [
    "COMPUTE",
    "FAMILIES",
    "SCHEDULES",
    "Family",
    "Action",
    "ActionType",
    "Schedule",
    "as_stream",
    "build_schedule",
    "checked_virtual_stages",
    "device_groups",
    "family",
    "is_interleaved",
    "in_flight_microbatches",
    "schedule_from_order",
    "validate_order",
    "validate_schedule",
]

SCHEDULES = tuple(FAMILIES)  # gpipe, 1f1b, interleaved, zb, 2bw, optimized


def device_groups(stages: Sequence[StageSpec]) -> list[tuple[str, ...]]:
    """The pipeline ranks: distinct device lists in stage order.

    Example::

        device_groups(parse_stages("0-1:gpu0;2-3:gpu1;4-5:gpu0;6-7:gpu1"))  # 2 ranks
    """
    groups: list[tuple[str, ...]] = []
    for stage in stages:
        group = tuple(stage.devices)
        if group not in groups:
            groups.append(group)
    return groups


def _virtual_stages(stages: Sequence[StageSpec], requested: int) -> int:
    groups = device_groups(stages)
    p = len(groups)
    v = len(stages) // p
    if p * v != len(stages) or any(tuple(s.devices) != groups[i % p] for i, s in enumerate(stages)):
        raise InputError(
            "the interleaved schedule needs stage s on the same devices as stage s mod p "
            f"(p = {p} device groups, {len(stages)} stages); e.g. "
            "'0-1:gpu0;2-3:gpu1;4-5:gpu0;6-7:gpu1'",
            field="stages",
        )
    if requested > 1 and requested != v:
        raise InputError(
            f"--virtual-stages {requested} does not match the partition: {len(stages)} "
            f"stages on {p} device groups give {v} virtual stages per device",
            field="virtual_stages",
        )
    return v


def schedule_from_order(
    name: str,
    stages: Sequence[StageSpec],
    order: dict[int, list[ComputeOp]],
    num_microbatches: int,
    *,
    virtual_stages: int = 1,
    iterations: int = 1,
    flush: bool = True,
    meta: dict[str, Any] | None = None,
) -> Schedule:
    """A :class:`Schedule` from a per-rank compute order, which is validated first.

    Example::

        schedule_from_order("mine", stages, {0: [("F", 0, 0), ("B", 0, 0)]}, 1)
    """
    validate_order(order, stages, num_microbatches * iterations)
    return Schedule(
        name,
        len(stages),
        num_microbatches,
        virtual_stages=virtual_stages,
        flush=flush,
        iterations=iterations,
        meta=meta,
        order=order,
        stages=stages,
    )


def build_schedule(
    name: str,
    stages: Sequence[StageSpec],
    num_microbatches: int,
    *,
    virtual_stages: int = 1,
    iterations: int = 1,
) -> Schedule:
    """Generate and validate the named schedule for a partition.

    ``iterations > 1`` concatenates iterations (2bw: without a flush). ``"optimized"`` is
    searched by simulating candidates, which this layer cannot do: it is
    :func:`planner.simulate.order_search.optimized_schedule`'s (and ``simulate(...,
    "optimized")``'s).

    Example::

        build_schedule("zb", stages, 8)
        build_schedule("interleaved", stages, 8)   # stages: p*v chunks, s on group s % p
    """
    m = num_microbatches
    v = checked_virtual_stages(name, stages, m, virtual_stages)
    p = len(stages)
    if family(name).searched:
        raise InputError(
            f"the {name} schedule is searched by simulating; build it with "
            "planner.simulate.order_search.optimized_schedule",
            field="schedule",
        )
    groups = tuple(tuple(st.devices) for st in stages)
    order = _validated_order(name, m, v, iterations, groups)
    return Schedule(
        name,
        p,
        m,
        virtual_stages=v,
        flush=family(name).flush,
        iterations=iterations,
        order=order,
        stages=stages,
    )


def checked_virtual_stages(
    name: str, stages: Sequence[StageSpec], num_microbatches: int, virtual_stages: int = 1
) -> int:
    """Check a schedule's name, microbatch count and replicas; the virtual stages it uses.

    Example::

        checked_virtual_stages("interleaved", stages, 8, 2)   # 2
        checked_virtual_stages("1f1b", stages, 8)             # 1
    """
    if name not in SCHEDULES:
        raise InputError(
            f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}", field="schedule"
        )
    m = num_microbatches
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise InputError(
            f"expected a positive number of microbatches, got {m!r}", field="num_microbatches"
        )
    for stage in stages:
        refuse_tensor_parallel(stage)
        if len(stage.devices) > m:
            raise InputError(
                f"stage {stage.id} has {len(stage.devices)} replicas but there are only {m} "
                "microbatches; every replica needs at least one",
                field="num_microbatches",
            )
    v = 1
    if family(name).interleaved:
        v = _virtual_stages(stages, virtual_stages)
    elif virtual_stages > 1:
        raise InputError(
            f"virtual stages are only used by the interleaved schedule, not {name!r}",
            field="virtual_stages",
        )
    return v


@functools.lru_cache(maxsize=64)
def _validated_order(
    name: str, m: int, v: int, iterations: int, groups: tuple[tuple[str, ...], ...]
) -> dict[int, list[ComputeOp]]:
    """Generate and validate a named order; cached because the solver simulates many
    partitions of the same shape (the order depends only on the devices, not the layers)."""
    p = len(groups)
    # Replicated stages: one schedule per pipeline replica (see planner.schedule.replicas);
    # without a flush one stream runs through every replica.
    flush = family(name).flush
    rounds = replica_round([len(g) for g in groups], m) if flush else 1
    if family(name).interleaved and v > 1 and (m // rounds) % (p // v):
        rounds = 1
    if family(name).interleaved:
        base = onef1b_order(p, m // rounds) if v == 1 else interleaved_order(p // v, v, m // rounds)
        order = per_replica_order(base, rounds)
    elif not flush:  # 2bw: the 1F1B order as one continuous stream of iterations
        order = onef1b_order(p, m, iterations=iterations)
    else:
        flushed = {"gpipe": gpipe_order, "1f1b": onef1b_order, "zb": zb_order}
        order = _repeat(per_replica_order(flushed[name](p, m // rounds), rounds), m, iterations)
    shape = [StageSpec(i, (i, i), devs) for i, devs in enumerate(groups)]
    validate_order(order, shape, m * iterations)
    return order


def _repeat(
    order: dict[int, list[ComputeOp]], m: int, iterations: int
) -> dict[int, list[ComputeOp]]:
    """The same order ``iterations`` times (with a flush between), microbatches renumbered."""
    if iterations == 1:
        return order
    return {
        rank: [(kind, s, k + i * m) for i in range(iterations) for kind, s, k in ops]
        for rank, ops in order.items()
    }


def in_flight_microbatches(
    name: str,
    num_stages: int,
    stage_index: int,
    num_microbatches: int,
    *,
    virtual_stages: int = 1,
    rounds: int = 1,
) -> int:
    """Microbatches whose activations a stage holds at its peak under a schedule, over
    all its replicas.

    For ``interleaved`` ``num_stages`` is the number of devices ``p``, ``stage_index``
    the device rank, and the count is chunk-microbatches over all ``v`` chunks of that
    device (each chunk's activations are ``1/v`` of the device's share). ``optimized``
    returns 1F1B's count, the depth its search starts from. ``rounds``: microbatches per
    round where replicated stages run one schedule per replica
    (:func:`planner.schedule.replicas.replica_round`): each replica then holds what one
    pipeline over ``M / rounds`` microbatches holds.

    Example::

        in_flight_microbatches("1f1b", 4, 0, 8)             # 4
        in_flight_microbatches("1f1b", 4, 0, 8, rounds=2)   # 8: 4 on each of 2 replicas
    """
    p, s, m = num_stages, stage_index, num_microbatches
    if not family(name).flush:
        # No flush: the next iteration's microbatches keep the pipeline full.
        return p - s
    if family(name).searched:
        return min(p - s, m)
    r = rounds if rounds > 1 and m % rounds == 0 else 1
    if family(name).interleaved and virtual_stages > 1 and (m // r) % p:
        r = 1  # as build_schedule: the interleaved order needs M / rounds divisible by p
    m //= r
    if name == "gpipe":
        return m * r
    if name == "1f1b":
        return min(p - s, m) * r
    if name == "zb":
        return min(p, m) * r
    if name == "interleaved":
        v = virtual_stages
        if v == 1:
            return min(p - s, m) * r
        return min(2 * (p - s - 1) + (v - 1) * p + 1, m * v) * r
    raise InputError(
        f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}", field="schedule"
    )


def as_stream(schedule: Schedule, stages: Sequence[StageSpec], iterations: int) -> Schedule | None:
    """A schedule without a flush, as the continuous stream of ``iterations`` iterations its
    generator makes (iteration i + 1 starts while i drains); None for a flushing schedule,
    one that already lists several iterations, or lists that are not the generator's (a
    hand-made order runs, and is timed, as given, one iteration at a time).

    Example::

        stream = as_stream(plan.schedule, plan.stages, 10)   # 2bw: 10 overlapping iterations
    """
    if schedule.flush or schedule.iterations != 1 or schedule.name not in FAMILIES:
        return None
    if family(schedule.name).searched:
        return None
    again = build_schedule(schedule.name, stages, schedule.num_microbatches)
    if schedule.order is not None:
        same = schedule.order == again.order
    else:
        same = _lists(schedule) == _lists(again)
    if not same:
        return None
    return build_schedule(schedule.name, stages, schedule.num_microbatches, iterations=iterations)


def _lists(schedule: Schedule) -> dict[str, list[str]]:
    return {d: [str(a) for a in acts] for d, acts in schedule.devices.items()}
