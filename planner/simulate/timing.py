"""Time an explicit schedule: its tables, its compiled shape, an engine, the result.

Two engines give the same numbers, bit for bit (``tests/test_simulate_engines.py``):

* ``"events"``: the event engine (:mod:`planner.simulate.events`), the definition; it runs
  everything, and reports deadlocks;
* ``"in_order"``: the fixed-order pass (:mod:`planner.simulate.in_order`), several times
  faster for long no-flush streams; it needs a topology and a schedule without all-reduces
  that does not deadlock;
* ``"auto"`` (the default) takes the fixed-order pass where it applies, else the events.

Example::

    simulate_schedule(profile, topology, stages, build_schedule("1f1b", stages, 8), 4)
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple, ParamSpec, TypeVar, get_args

from planner.errors import InputError
from planner.profile.schema import Profile
from planner.schedule import Schedule
from planner.schedule.groups import is_grouped, leader_stages
from planner.schedule.tied import defer_tied_steps
from planner.simulate.events import EventEngine
from planner.simulate.fold import has_cross_ties, symmetric
from planner.simulate.grouped import leader_schedule, with_members
from planner.simulate.in_order import run_in_order
from planner.simulate.links import LinkQueues, link_queues
from planner.simulate.program import STEP, devices_of
from planner.simulate.result import EngineOutput, SimResult, bubble
from planner.simulate.shapes import SHAPES, CompiledShape
from planner.simulate.shards import check_parallel_stages
from planner.simulate.tables import StageTables, reference_durations, stage_tables
from planner.simulate.totals import program_totals
from planner.stages import StageSpec

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["ENGINES", "Engine", "OverLimit", "check_memory", "pausing_gc", "simulate_schedule"]

Engine = Literal["auto", "events", "in_order"]
ENGINES: tuple[str, ...] = get_args(Engine)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def pausing_gc(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` with the cyclic garbage collector paused (as it was before, after).

    A long stream allocates hundreds of thousands of small tuples that form no cycles;
    the collector would walk them again and again during the run, and paused it walks
    them once, at its first collection afterwards (warm 64 x 512 2bw runs with events
    measured about 0.04 s of collection per run instead of 0.15 s).

    Example::

        @pausing_gc
        def simulate_many() -> None: ...
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


@pausing_gc
def simulate_schedule(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    microbatch_size: int,
    *,
    step_ms: float | Sequence[float] | None = None,
    events: bool = True,
    engine: Engine = "auto",
    over_limit: bool = False,
    lean: bool = False,
) -> SimResult:
    """Time an explicit schedule (no validation, no lower bound).

    ``over_limit``: where a device's peak memory (which follows from the program order
    alone) exceeds its memory in ``topology``, raise :class:`OverLimit` with every
    device's peak instead of timing it (the solver's plans that cannot fit).

    ``events=False`` skips the event lists and memory curves (for solver loops);
    ``engine`` picks how the times are computed (see the module's description). A
    schedule that deadlocks raises an InputError naming where each device waits.
    Tensor-parallel groups run as their leaders (:mod:`planner.simulate.grouped`).
    ``lean``: the caller reads only the time and the memory, so a generated schedule whose
    STEPs are deferred (fp16, tied parameters) is not expanded: the STEPs move in its
    compiled programs (:mod:`planner.simulate.deferred`; the same entries, the same
    numbers), and the result's ``schedule`` is the one given.

    Example::

        simulate_schedule(profile, None, stages, build_schedule("1f1b", stages, 8), 4)
    """
    if engine not in ENGINES:
        raise InputError(
            f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}", field="engine"
        )
    holding = frozenset[int]()
    if profile.tied_parameters or profile.precision == "fp16":
        if lean and schedule.order is not None and not schedule.is_expanded:
            holding = holding_stages(profile, stages)  # deferred on the compiled programs
        else:
            schedule = with_deferred_steps(profile, stages, schedule)
    plain = all(st.is_plain for st in stages)
    run_stages, run_schedule = stages, schedule
    if not plain:
        check_parallel_stages(profile, stages, flush=schedule.flush)
        if is_grouped(stages):
            run_stages = leader_stages(stages)
            run_schedule = leader_schedule(schedule, stages)
    total_mb = schedule.num_microbatches * schedule.iterations
    if holding:
        devices = devices_of(run_schedule, run_stages)
        shape = _deferred_shape(profile, stages, schedule, run_stages, run_schedule, holding)
        order = {
            d: [e[1] for e in prog if e[0] == STEP]
            for d, prog in zip(devices, shape.programs, strict=True)
        }
        tables = stage_tables(
            profile, topology, stages, run_schedule, microbatch_size, step_ms, order
        )
    else:
        tables = stage_tables(profile, topology, stages, run_schedule, microbatch_size, step_ms)
        shape = SHAPES.get(run_schedule, run_stages, tables.devices, total_mb)
    if over_limit and topology is not None:
        check_memory(shape, tables, topology, schedule.num_microbatches, run_stages)
    if not events and engine != "in_order":
        once = _run_folded(shape, run_stages, tables, topology, schedule.num_microbatches, total_mb)
        if once is not None:
            result = _result(*once, topology, stages, schedule, microbatch_size, events)
            return result if run_stages is stages else with_members(result, stages, topology)
    if tables.gathering:
        shape = shape.gathered(tables.gathering, schedule.num_microbatches)
    run = _run_engine(engine, shape, tables, topology, total_mb, record=events)
    static = [tables.static[d] for d in tables.devices]
    peaks, busy = program_totals(shape.work, tables.durations, tables.grows, tables.shrinks, static)
    result = _result(run, peaks, busy, tables, topology, stages, schedule, microbatch_size, events)
    return result if run_stages is stages else with_members(result, stages, topology)


def _deferred_shape(
    profile: Profile,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    run_stages: Sequence[StageSpec],
    run_schedule: Schedule,
    holding: frozenset[int],
) -> CompiledShape:
    """The compiled programs of the generated ``run_schedule`` with the STEPs of
    ``holding`` deferred (:mod:`planner.simulate.deferred`); a move it refuses raises the
    expanded lists' error (:func:`with_deferred_steps`).

    Example::

        shape = _deferred_shape(profile, stages, sched, stages, sched, frozenset({0, 1}))
    """
    devices = devices_of(run_schedule, run_stages)
    total_mb = schedule.num_microbatches * schedule.iterations
    shape = SHAPES.get(run_schedule, run_stages, devices, total_mb)
    moved = shape.deferred(holding, schedule.num_microbatches)
    if moved is None:
        with_deferred_steps(profile, stages, schedule)  # raises, naming the move
        raise InputError("a STEP cannot be deferred past its stage's work", field="schedule")
    return moved


class OverLimit(Exception):  # noqa: N818 (an outcome the solver asks for, not an error)
    """A device's peak memory exceeds its memory (:func:`simulate_schedule`'s
    ``over_limit``): ``memory`` holds every device's peak, as the result would.

    Example::

        try:
            simulate_shape(profile, topology, shape, over_limit=True)
        except OverLimit as over:
            over.memory["gpu0"]
    """

    def __init__(self, memory: dict[str, int]) -> None:
        super().__init__("a device's memory is exceeded")
        self.memory = memory


def check_memory(
    shape: CompiledShape,
    tables: StageTables,
    topology: Topology,
    num_microbatches: int,
    stages: Sequence[StageSpec] | None = None,
) -> None:
    """Raise :class:`OverLimit` where a device's peak memory exceeds its memory (every
    member of a tensor-parallel group holds its leader's), unless a duration is not finite
    (then the time could be infinite: the caller simulates it all). ``stages`` (those the
    programs were compiled for): where the replicas' programs are replica 0's shifted
    (:func:`planner.simulate.fold.fold_programs`), each device's peak is its static
    memory plus its counterpart's rise, summed once.

    Example::

        check_memory(shape, tables, topology, 8)
    """
    peaks = _peaks(shape, tables, stages, num_microbatches)
    members = tables.groups
    memory = {
        m: int(peak)
        for d, peak in zip(tables.devices, peaks, strict=True)
        for m in members.get(d, (d,))
    }
    device = topology.device
    if all(b <= device(d).memory_bytes for d, b in memory.items()):
        return
    if not _all_finite(tables.durations):
        return
    raise OverLimit(memory)


def _peaks(
    shape: CompiledShape,
    tables: StageTables,
    stages: Sequence[StageSpec] | None,
    num_microbatches: int,
) -> list[int]:
    """Every device's peak memory (:func:`~planner.simulate.totals.program_totals`), FSDP
    stages' first forwards in their gather slots: a device whose program is its
    counterpart's in replica 0 shifted has the same allocations in the same order (its
    first forward of a stage in an iteration is at the same place in its program, so the
    gather moves with it), so its peak is its static memory plus the counterpart's rise
    above its own."""
    static = [tables.static[d] for d in tables.devices]
    fold = None if stages is None else shape.fold(stages, tables.devices)
    if fold is None:
        whole = shape.gathered(tables.gathering, num_microbatches) if tables.gathering else shape
        peaks, _ = program_totals(
            whole.work, tables.durations, tables.grows, tables.shrinks, static
        )
        return peaks
    kept = fold.kept
    work = shape.kept_work(kept, tables.gathering, num_microbatches)
    rises, _ = program_totals(
        work, [tables.durations[i] for i in kept], tables.grows, tables.shrinks, [0] * len(kept)
    )
    return [base + rises[b] for base, b in zip(static, fold.base, strict=True)]


def _all_finite(rows: Sequence[Sequence[float]]) -> bool:
    """Whether every number in ``rows`` is finite: their sum is, unless one is infinite or
    NaN (a sum that overflows on finite numbers alone is checked number by number).

    Example::

        _all_finite([[1.0, 2.0], [math.inf]])   # False
    """
    if math.isfinite(sum(map(sum, rows))):
        return True
    return all(math.isfinite(x) for row in rows for x in row)


def holding_stages(profile: Profile, stages: Sequence[StageSpec]) -> frozenset[int]:
    """The stages whose STEPs wait for the device's backward work: every stage in fp16
    (all ranks agree on overflows at the first), else those holding a tied parameter.

    Example::

        holding_stages(fp16_profile, stages)   # frozenset({0, 1})
    """
    return frozenset(
        st.id
        for st in stages
        if profile.precision == "fp16"
        or any(t.held_by(st.first, st.last) for t in profile.tied_parameters)
    )


def with_deferred_steps(
    profile: Profile, stages: Sequence[StageSpec], schedule: Schedule
) -> Schedule:
    """The order the runtime runs: STEPs of tie-holding stages (of every stage in fp16,
    where all ranks agree on overflows at the first) after the device's backward work on
    such stages (:func:`planner.schedule.tied.defer_tied_steps`).

    Example::

        with_deferred_steps(tied_profile, stages, build_schedule("1f1b", stages, 8))
    """
    holding = holding_stages(profile, stages)
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


def _run_engine(
    engine: Engine,
    shape: CompiledShape,
    tables: StageTables,
    topology: Topology | None,
    total_mb: int,
    *,
    record: bool,
) -> EngineOutput:
    """The times by the chosen engine (``auto``: the fixed-order pass where it applies)."""
    num_stages = len(tables.replicas)
    num_keys = 2 * num_stages * total_mb
    if engine != "events" and topology is not None:
        order = shape.order(num_keys, total_mb, num_stages)
        if order is not None:
            return run_in_order(order, topology, tables, num_keys, record=record)
    if engine == "in_order":
        raise InputError(
            "the in_order engine needs a topology and a schedule without all-reduces that "
            "does not deadlock; use engine 'events' or 'auto'",
            field="engine",
        )
    return run_events(shape, tables, topology, total_mb, record=record)


def run_events(
    shape: CompiledShape,
    tables: StageTables,
    topology: Topology | None,
    total_mb: int,
    *,
    record: bool,
    start_at_send: bool = True,
) -> EngineOutput:
    """The times by the event engine; over a topology, the links' queues come first from
    the reference run (the same engine with free communication over the reference
    durations). ``start_at_send`` as in :class:`~planner.simulate.events.EventEngine`.

    Example::

        run_events(shape, tables, None, 8, record=True).clock
    """
    links = None
    if topology is not None:
        links, _ = reference_links(shape, tables, topology, total_mb)
    return _run_linked(shape, tables, links, total_mb, record=record, start_at_send=start_at_send)


class Reference(NamedTuple):
    """The reference run (free communication over the reference durations): its sends in
    the order they ran, when each key's data was ready, and how many sends had run when a
    device first reached an all-reduce (-1: none did).

    Example::

        ref = reference_run(shape, tables, topology, 8)
        ref.sends[:3], ref.ready[ref.sends[0]]
    """

    sends: list[int]
    ready: list[float]
    before_allreduce: int


def reference_run(
    shape: CompiledShape, tables: StageTables, topology: Topology, total_mb: int
) -> Reference:
    """The reference run of ``shape`` (:class:`Reference`).

    Example::

        reference_run(shape, tables, topology, 8).sends
    """
    num_keys = 2 * len(tables.replicas) * total_mb
    ref_durations = reference_durations(tables, topology)
    ref = EventEngine(shape.programs, ref_durations, tables, num_keys, links=None, record=False)
    sends: list[int] = []
    ref.sends = sends  # the reference run lists its sends in the order they run
    ref.run()
    return Reference(sends, ref.arrival, ref.sends_before_allreduce)


def reference_links(
    shape: CompiledShape, tables: StageTables, topology: Topology, total_mb: int
) -> tuple[LinkQueues, list[float]]:
    """The links' queues from the reference run (the event engine with free communication
    over the reference durations), and when each transfer's data was ready there.

    Example::

        links, ready = reference_links(shape, tables, topology, 8)
    """
    ref = reference_run(shape, tables, topology, total_mb)
    return _queues(shape, tables, topology, total_mb, ref.sends, ref.ready), ref.ready


def _queues(
    shape: CompiledShape,
    tables: StageTables,
    topology: Topology,
    total_mb: int,
    sends: list[int],
    ready: list[float],
) -> LinkQueues:
    """The links' queues of ``shape``'s sends, served in the order of ``sends`` by
    ``ready`` (:func:`planner.simulate.links.link_queues`)."""
    num_keys = len(ready)
    ways = shape.ways(num_keys, total_mb, len(tables.replicas))
    return link_queues(topology, tables.devices, tables.cut, ways, sends, ready, tables.groups)


def _run_linked(
    shape: CompiledShape,
    tables: StageTables,
    links: LinkQueues | None,
    total_mb: int,
    *,
    record: bool,
    start_at_send: bool = True,
) -> EngineOutput:
    """The event engine's run over ``links`` (None: free communication); an InputError
    naming where each device waits if it deadlocks."""
    num_keys = 2 * len(tables.replicas) * total_mb
    programs = shape.programs
    engine = EventEngine(
        programs,
        tables.durations,
        tables,
        num_keys,
        links=links,
        record=record,
        start_at_send=start_at_send,
    )
    engine.run()
    stuck = engine.stuck(tables.devices, total_mb)
    if stuck:
        raise InputError("the schedule deadlocks: " + ", ".join(stuck[:4]), field="schedule")
    return engine.output()


def _run_folded(
    shape: CompiledShape,
    run_stages: Sequence[StageSpec],
    tables: StageTables,
    topology: Topology | None,
    num_microbatches: int,
    total_mb: int,
) -> tuple[EngineOutput, list[int], list[float], StageTables] | None:
    """The event engine's run of replica 0 alone where the replicas are identical
    (:mod:`planner.simulate.fold`), with every device's peak and busy time (its
    counterpart's); None where they are not, or where replica 0's link queues would need
    the order of every replica's gathered programs (:func:`_folded_links`).

    Example::

        run, peaks, busy, tables = _run_folded(shape, stages, tables, topology, 8, 8)
    """
    fold = shape.fold(run_stages, tables.devices)
    if fold is None or not symmetric(fold, tables, topology, shape.programs, total_mb):
        return None
    kept = fold.kept
    position = {i: p for p, i in enumerate(kept)}
    small = dataclasses.replace(
        tables,
        devices=[tables.devices[i] for i in kept],
        durations=[tables.durations[i] for i in kept],
        replicas=[1] * len(tables.replicas),  # each all-reduce's replicas are alike
        reference={
            (position[i], slot): ms for (i, slot), ms in tables.reference.items() if i in position
        },
    )
    once = CompiledShape(fold.programs) if fold.compiled is None else fold.compiled
    fold.compiled = once
    if tables.gathering:
        once = once.gathered_once(tables.gathering, num_microbatches)
    links = None
    if topology is not None:
        whole = shape if not tables.gathering else None
        links = _folded_links(once, small, topology, total_mb, fold.late_sends, whole, tables)
        if links is None:
            return None
    run = _run_linked(once, small, links, total_mb, record=False)
    static = [small.static[d] for d in small.devices]
    peaks, busy = program_totals(once.work, small.durations, small.grows, small.shrinks, static)
    return run, fold.spread(peaks), fold.spread(busy), tables


def _folded_links(
    once: CompiledShape,
    small: StageTables,
    topology: Topology,
    total_mb: int,
    late_sends: bool,
    whole: CompiledShape | None,
    tables: StageTables,
) -> LinkQueues | None:
    """The links' queues of replica 0's run (``once`` over ``small``), as the full run
    orders them (:mod:`planner.simulate.fold`): from replica 0's reference run, unless its
    queues hold a tie the other replicas could order (:func:`has_cross_ties` of the sends
    after the first all-reduce); then from the reference run of every replica (``whole``
    over ``tables``: free communication, cheaper than the timed run), its sends of
    replica 0's keys in the order they ran. None where ``whole`` is None (gathered
    programs: the caller runs everything).

    Example::

        links = _folded_links(once, small, topology, 8, True, shape, tables)
    """
    ref = reference_run(once, small, topology, total_mb)
    links = _queues(once, small, topology, total_mb, ref.sends, ref.ready)
    if not late_sends or ref.before_allreduce < 0:
        return links
    late = bytearray(len(ref.ready))
    for key in ref.sends[ref.before_allreduce :]:
        late[key] = 1
    if not has_cross_ties(links, ref.ready, late):
        return links
    if whole is None:
        return None
    full = reference_run(whole, tables, topology, total_mb)
    ours = bytearray(len(ref.ready))
    for key in ref.sends:
        ours[key] = 1
    sends = [key for key in full.sends if ours[key]]
    return _queues(once, small, topology, total_mb, sends, full.ready)


def _result(
    run: EngineOutput,
    peak_list: list[int],
    busy: list[float],
    tables: StageTables,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    microbatch_size: int,
    record: bool,
) -> SimResult:
    """The :class:`SimResult` of an engine's run (no lower bound yet), with each device's
    peak memory and busy time (:func:`~planner.simulate.totals.program_totals`)."""
    devices = tables.devices
    makespan = max(run.clock, default=0.0)
    makespan = max(makespan, max(run.link_free, default=0.0))
    timeline: dict[str, list[tuple[float, int]]] = {}
    if record:
        for i, d in enumerate(devices):
            timeline[d] = [*run.mem[i], (makespan, run.levels[i])]
    busy_ms = dict(zip(devices, busy, strict=True))
    limits = {d: topology.device(d).memory_bytes for d in devices} if topology is not None else {}
    return SimResult(
        iteration_ms=makespan,
        memory_bytes=dict(zip(devices, peak_list, strict=True)),
        busy_ms=busy_ms,
        bubble_fraction=bubble(busy_ms, makespan),
        lower_bound_ms=0.0,
        staleness=None,
        raw_events=run.raw_events,
        device_names=devices,
        schedule=schedule,
        raw_transfers=run.raw_transfers,
        memory_timeline=timeline,
        memory_limit_bytes=limits,
        static_bytes=tables.static,
        makespan_ms=makespan,
        microbatch_size=microbatch_size,
        num_microbatches=schedule.num_microbatches,
        iterations=schedule.iterations,
        step_ms=[max(tables.steps[(st.id, d)] for d in st.leaders) for st in stages],
    )
