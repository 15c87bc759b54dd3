"""Compiled programs per schedule shape, and the bounded cache that keeps the last few.

The solver simulates many partitions of one shape (the same generated order, microbatches
and device lists, other layer ranges): their programs are the same, because entries name
slots in the duration tables rather than holding times, so only the tables are refilled.
Programs name devices by their index, so device lists of one pattern (each stage's devices
at the same indices: other devices, the same layout) share them too.

Example::

    shape = SHAPES.get(schedule, stages, devices, total_mb)
    shape.programs, shape.order(num_keys, total_mb, len(stages))
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

from planner.schedule import Schedule
from planner.simulate.deferred import defer_steps
from planner.simulate.fold import Fold, fold_programs
from planner.simulate.in_order import Order, reference_order
from planner.simulate.links import send_ways
from planner.simulate.program import (
    LAST_COMPUTE,
    STEP,
    Program,
    compile_programs,
    gather_first_forwards,
)
from planner.stages import StageSpec

__all__ = [
    "SHAPES",
    "SHAPE_CACHE_SIZE",
    "CacheInfo",
    "CompiledShape",
    "ShapeCache",
    "work_slots",
]

# How many compiled shapes the package keeps: the solver alternates between few shapes at
# a time, and a long stream's programs and order hold hundreds of thousands of tuples. GPT-3
# 175B on 1024 H100s (bench/scaling_on_paper.py's case): 2 kept, 558 compiles and 60.2 s of
# CPU; 6 kept, 522 and 56.0 s, peak memory 1036 -> 1080 MB (2026-11-28, the same plan).
SHAPE_CACHE_SIZE = 6


class CompiledShape:
    """Compiled programs and what depends on them alone: per program the slots of its work
    (compute and optimizer steps) in program order, and (computed on first use) each send's
    way and the reference run's order of execution for the fixed-order pass.

    Example::

        shape = CompiledShape(compile_programs(schedule, stages, devices, 8))
        shape.work[0]     # slots of device 0's compute and steps
    """

    def __init__(self, programs: list[Program]) -> None:
        self.programs = programs
        self.work = [work_slots(prog) for prog in programs]
        self._order: Order | None = None
        self._no_order = False
        self._ways: list[int] | None = None
        self._fold: Fold | None = None
        self._no_fold = False
        self._deferred: dict[tuple[frozenset[int], int], CompiledShape | None] = {}
        self._gathered: dict[tuple[tuple[int, ...], int], CompiledShape] = {}
        self._kept_work: dict[tuple[tuple[int, ...], tuple[int, ...], int], list[Any]] = {}

    def fold(self, stages: Sequence[StageSpec], devices: list[str]) -> Fold | None:
        """Replica 0's programs where every replica's are its own shifted
        (:func:`planner.simulate.fold.fold_programs`), worked out on first use; ``stages``
        and ``devices`` are the ones the programs were compiled for."""
        if self._fold is None and not self._no_fold:
            self._fold = fold_programs(self.programs, stages, devices)
            self._no_fold = self._fold is None
        return self._fold

    def deferred(self, holding: frozenset[int], num_microbatches: int) -> CompiledShape | None:
        """These programs with the STEPs of ``holding`` deferred
        (:func:`planner.simulate.deferred.defer_steps`; None where it refuses), made once
        per ``holding``; ``self`` where no STEP moves."""
        key = (holding, num_microbatches)
        if key not in self._deferred:
            moved = defer_steps(self.programs, holding, num_microbatches)
            same = moved is not None and moved == self.programs
            self._deferred[key] = self if same else None if moved is None else CompiledShape(moved)
        return self._deferred[key]

    def gathered(self, stages: Sequence[int], num_microbatches: int) -> CompiledShape:
        """These programs with the first forward of an iteration of each of ``stages``
        (FSDP stages) in its gather slot (:func:`planner.simulate.program.
        gather_first_forwards`). Made afresh each time for every device's programs (kept,
        they would double a cached shape's memory), once for a fold's replica 0
        (:meth:`gathered_once`).

        Example::

            shape.gathered([0], 8).programs[0][0][3]   # 6: F0.0 gathers first
        """
        return CompiledShape(gather_first_forwards(self.programs, stages, num_microbatches))

    def gathered_once(self, stages: Sequence[int], num_microbatches: int) -> CompiledShape:
        """:meth:`gathered`, made once per ``stages`` and microbatch count (for the small
        programs of a fold's replica 0).

        Example::

            once.gathered_once([0], 8) is once.gathered_once([0], 8)   # True
        """
        key = (tuple(stages), num_microbatches)
        if key not in self._gathered:
            self._gathered[key] = self.gathered(stages, num_microbatches)
        return self._gathered[key]

    def kept_work(
        self, kept: Sequence[int], gathering: Sequence[int], num_microbatches: int
    ) -> list[Any]:
        """:attr:`work` of the programs at ``kept``, each with the first forward of an
        iteration of every stage in ``gathering`` in its gather slot (as
        :meth:`gathered`'s, for those programs alone: the move is made program by
        program), made once per ``kept``, ``gathering`` and microbatch count.

        Example::

            shape.kept_work((0, 1), [0], 8)[0]   # device 0's slots, F0.0 gathering
        """
        if not gathering:
            return [self.work[i] for i in kept]
        key = (tuple(kept), tuple(gathering), num_microbatches)
        if key not in self._kept_work:
            mine = [self.programs[i] for i in kept]
            moved = gather_first_forwards(mine, gathering, num_microbatches)
            self._kept_work[key] = [work_slots(prog) for prog in moved]
        return self._kept_work[key]

    def ways(self, num_keys: int, total_mb: int, num_stages: int) -> list[int]:
        """Per transfer key the way of its send (:func:`planner.simulate.links.send_ways`),
        for the event engine's link queues."""
        if self._ways is None:
            self._ways = send_ways(self.programs, num_keys, total_mb, num_stages)
        return self._ways

    def order(self, num_keys: int, total_mb: int, num_stages: int) -> Order | None:
        """The reference run's order, or None where the event engine is needed: for
        all-reduces (their barriers) and for schedules that deadlock (its message)."""
        if self._order is None and not self._no_order:
            self._order = reference_order(self.programs, num_keys, total_mb, num_stages)
            self._no_order = self._order is None
        return self._order


def work_slots(prog: Program) -> Any:
    """The slots of ``prog``'s work (compute and optimizer steps) in program order, as a
    numpy array of indices (what :func:`planner.simulate.totals.program_totals` reads).

    Example::

        work_slots(shape.programs[0])   # array([0, 1, ...])
    """
    import numpy as np  # here, as in program_totals

    return np.array([e[3] for e in prog if e[0] <= LAST_COMPUTE or e[0] == STEP], dtype=np.intp)


class CacheInfo(NamedTuple):
    """A :class:`ShapeCache`'s counters, as ``functools.lru_cache``'s ``cache_info()``."""

    hits: int
    misses: int
    size: int
    maxsize: int


class ShapeCache:
    """The compiled shapes of the last ``maxsize`` generated orders, least recently used
    dropped first. A shape is keyed by its order's identity (orders are cached per name,
    microbatches and device pattern by :mod:`planner.schedule`; the entry holds the
    order, so its id cannot be reused while cached), the microbatch counts and where each
    stage's devices sit in the device list (:func:`_stage_pattern`).
    Written (expanded) schedules are compiled afresh each time.

    Example::

        cache = ShapeCache(2)
        cache.get(schedule, stages, devices, 8) is cache.get(schedule, stages, devices, 8)
        cache.info()     # CacheInfo(hits=1, misses=1, size=1, maxsize=2)
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._entries: OrderedDict[Hashable, tuple[Any, CompiledShape]] = OrderedDict()
        self._hits = self._misses = 0

    def get(
        self, schedule: Schedule, stages: Sequence[StageSpec], devices: list[str], total_mb: int
    ) -> CompiledShape:
        """The compiled shape of ``schedule`` on ``devices``, from the cache if there."""
        if schedule.order is None or schedule.is_expanded:
            return CompiledShape(compile_programs(schedule, stages, devices, total_mb))
        key = (
            id(schedule.order),
            schedule.num_microbatches,
            total_mb,
            len(devices),
            _stage_pattern(stages, devices),
        )
        found = self._entries.get(key)
        if found is not None and found[0] is schedule.order:
            self._entries.move_to_end(key)
            self._hits += 1
            return found[1]
        self._misses += 1
        shape = CompiledShape(compile_programs(schedule, stages, devices, total_mb))
        self._entries[key] = (schedule.order, shape)
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        return shape

    def info(self) -> CacheInfo:
        """Hits, misses and size, as ``functools.lru_cache`` reports them."""
        return CacheInfo(self._hits, self._misses, len(self._entries), self.maxsize)


def _stage_pattern(stages: Sequence[StageSpec], devices: list[str]) -> tuple[tuple[int, ...], ...]:
    """Each stage's devices as their indices in ``devices`` (-1: not there): a generated
    order compiles to the same programs for every ``stages`` and ``devices`` of one
    pattern, whatever the devices' names (a program names devices by index).

    Example::

        _stage_pattern(stages, ["gpu4", "gpu0"])   # ((0,), (1,)) for stages on gpu4, gpu0
    """
    index = {d: i for i, d in enumerate(devices)}
    return tuple(tuple(index.get(d, -1) for d in st.devices) for st in stages)


# The package's cache (the only state the simulator keeps between calls; bounded, and no
# result depends on it).
SHAPES = ShapeCache(SHAPE_CACHE_SIZE)
