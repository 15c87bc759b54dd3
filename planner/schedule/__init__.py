"""Microbatch schedules: generators, the action data types and validation.

Example::

    from planner.schedule import build_schedule
    sched = build_schedule("1f1b", stages, num_microbatches=8)
    print(sched.text())
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from planner.errors import InputError
from planner.schedule.actions import COMPUTE, Action, ActionType, Schedule
from planner.schedule.expand import ComputeOp
from planner.schedule.families import (
    FAMILIES,
    PLACEMENTS,
    Family,
    device_groups,
    family,
    is_interleaved,
)
from planner.schedule.validate import validate_order, validate_schedule
from planner.stages import StageSpec

__all__ = [
    "COMPUTE",
    "FAMILIES",
    "PLACEMENTS",
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
    "schedule_from_order",
    "validate_order",
    "validate_schedule",
]

SCHEDULES = tuple(FAMILIES)  # gpipe, 1f1b, interleaved, zb, 2bw, optimized


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
    fam = family(name)
    groups = tuple(st.leaders for st in stages)  # a tensor-parallel group runs as its leader
    order = _validated_order(name, m, v, iterations, groups)  # refuses a searched family
    return Schedule(
        name,
        len(stages),
        m,
        virtual_stages=v,
        flush=fam.flush,
        iterations=iterations,
        order=order,
        stages=stages,
        generated=True,
    )


def checked_virtual_stages(
    name: str, stages: Sequence[StageSpec], num_microbatches: int, virtual_stages: int = 1
) -> int:
    """Check a schedule's name, microbatch count and replicas; the virtual stages it uses.

    Example::

        checked_virtual_stages("interleaved", stages, 8, 2)   # 2
        checked_virtual_stages("1f1b", stages, 8)             # 1
    """
    fam = family(name)  # one message naming the known schedules
    m = num_microbatches
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise InputError(
            f"expected a positive number of microbatches, got {m!r}", field="num_microbatches"
        )
    for stage in stages:
        if stage.replicas > m:
            raise InputError(
                f"stage {stage.id} has {stage.replicas} replicas but there are only {m} "
                "microbatches; every replica needs at least one",
                field="num_microbatches",
            )
    v = 1
    if fam.interleaved:
        v = fam.virtual_stages_of(stages, virtual_stages)
    elif virtual_stages > 1:
        raise InputError(
            f"virtual stages are only used by the interleaved schedule, not {name!r}",
            field="virtual_stages",
        )
    return v


def _validated_order(
    name: str, num_microbatches: int, v: int, iterations: int, groups: tuple[tuple[str, ...], ...]
) -> dict[int, list[ComputeOp]]:
    """The family's order for these device groups (one per stage), validated; cached
    because the solver simulates many partitions of the same shape (the order depends
    only on which stages share devices, not on the layers or the devices' names: the
    same object for every ``groups`` of one pattern, :func:`device_pattern`). Where it
    is invalid, validated again on ``groups`` themselves for a message naming them.

    Example::

        _validated_order("1f1b", 8, 1, 1, (("gpu0",), ("gpu1",)))
    """
    try:
        return _pattern_order(name, num_microbatches, v, iterations, device_pattern(groups))
    except InputError:
        order = family(name).order([len(g) for g in groups], num_microbatches, v, iterations)
        shape = [StageSpec(i, (i, i), devs) for i, devs in enumerate(groups)]
        validate_order(order, shape, num_microbatches * iterations)
        raise


def device_pattern(groups: Sequence[Sequence[str]]) -> tuple[tuple[int, ...], ...]:
    """``groups`` with each device named by the order it first appears in: two lists of
    device groups of one pattern differ only in the devices' names.

    Example::

        device_pattern([("gpu4", "gpu5"), ("gpu0", "gpu4")])   # ((0, 1), (2, 0))
    """
    index: dict[str, int] = {}
    return tuple(tuple(index.setdefault(d, len(index)) for d in g) for g in groups)


# How many orders _pattern_order keeps, and how many compute ops in all: an order of
# thousands of microbatches on a hundred stages is half a million ops (~50 MB), and 64 of
# them outgrew a solve's memory (PTD-P 529.6B on 2,520 GPUs), so the cache also stops at
# ORDER_CACHE_OPS ops (the newest order always kept), least recently used dropped first.
ORDER_CACHE_SIZE = 64
ORDER_CACHE_OPS = 3_000_000


class _OrderCache:
    """:func:`_pattern_order`'s cache: at most ``maxsize`` orders and ``max_ops`` compute ops
    in all (the newest kept whatever its size), least recently used dropped first; with
    ``functools.lru_cache``'s ``cache_info`` and ``cache_clear``."""

    def __init__(self, maxsize: int, max_ops: int) -> None:
        self.maxsize, self.max_ops = maxsize, max_ops
        self.entries: OrderedDict[tuple[Any, ...], tuple[dict[int, list[ComputeOp]], int]] = (
            OrderedDict()
        )
        self.ops = self.hits = self.misses = 0

    def get(self, key: tuple[Any, ...]) -> dict[int, list[ComputeOp]] | None:
        found = self.entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(key)
        return found[0]

    def put(self, key: tuple[Any, ...], order: dict[int, list[ComputeOp]]) -> None:
        size = sum(map(len, order.values()))
        self.entries[key] = (order, size)
        self.ops += size
        while len(self.entries) > 1 and (
            len(self.entries) > self.maxsize or self.ops > self.max_ops
        ):
            _, (_, dropped) = self.entries.popitem(last=False)
            self.ops -= dropped

    def cache_info(self) -> functools._CacheInfo:
        return functools._CacheInfo(self.hits, self.misses, self.maxsize, len(self.entries))

    def cache_clear(self) -> None:
        self.entries.clear()
        self.ops = self.hits = self.misses = 0


_ORDERS = _OrderCache(ORDER_CACHE_SIZE, ORDER_CACHE_OPS)


def _pattern_order(
    name: str, num_microbatches: int, v: int, iterations: int, pattern: tuple[tuple[int, ...], ...]
) -> dict[int, list[ComputeOp]]:
    """The family's order for device groups of ``pattern`` (:func:`device_pattern`),
    validated on devices named by their numbers; cached (:data:`ORDER_CACHE_SIZE` orders,
    :data:`ORDER_CACHE_OPS` ops)."""
    key = (name, num_microbatches, v, iterations, pattern)
    order = _ORDERS.get(key)
    if order is not None:
        return order
    order = family(name).order([len(g) for g in pattern], num_microbatches, v, iterations)
    shape = [StageSpec(i, (i, i), tuple(f"d{x}" for x in g)) for i, g in enumerate(pattern)]
    validate_order(order, shape, num_microbatches * iterations)
    _ORDERS.put(key, order)
    return order


_pattern_order.cache_info = _ORDERS.cache_info  # type: ignore[attr-defined]
_pattern_order.cache_clear = _ORDERS.cache_clear  # type: ignore[attr-defined]


def as_stream(schedule: Schedule, stages: Sequence[StageSpec], iterations: int) -> Schedule | None:
    """A schedule of a family that streams (:attr:`Family.streams`: no flush), as the
    continuous stream of ``iterations`` iterations its generator makes (iteration i + 1
    starts while i drains); None for a family that does not stream, a schedule that
    already lists several iterations, or lists that are not the generator's (a hand-made
    order runs, and is timed, as given, one iteration at a time). Lists
    :func:`build_schedule` made are the generator's; others (read from a file) are
    compared with it once.

    Example::

        stream = as_stream(plan.schedule, plan.stages, 10)   # 2bw: 10 overlapping iterations
    """
    fam = FAMILIES.get(schedule.name)
    if fam is None or not fam.streams or schedule.flush or schedule.iterations != 1:
        return None
    if not schedule.generated and not _generated(schedule, stages):
        return None
    return build_schedule(schedule.name, stages, schedule.num_microbatches, iterations=iterations)


def _generated(schedule: Schedule, stages: Sequence[StageSpec]) -> bool:
    """Whether ``schedule``'s lists are what its family's generator makes for ``stages``."""
    again = build_schedule(schedule.name, stages, schedule.num_microbatches)
    if schedule.order is not None:
        return schedule.order == again.order
    return _lists(schedule) == _lists(again)


def _lists(schedule: Schedule) -> dict[str, list[str]]:
    return {d: [str(a) for a in acts] for d, acts in schedule.devices.items()}
