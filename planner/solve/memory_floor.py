"""A lower bound on a plan's simulated peak memory per device, worked out without simulating.

The simulator's peak memory follows from each device's program order alone
(:func:`planner.simulate.totals.program_totals`): a device starts at its static memory
(weights, gradients and optimizer state by its stages' sharding:
:func:`planner.simulate.tables.device_static_bytes`), each action takes its bytes at its
start and gives some back at its end (:func:`planner.simulate.tables.memory_deltas`: a
forward keeps its microbatch's stash; a backward, or its input half, rebuilds what
recompute dropped; FSDP's first forward of an iteration gathers the whole weights), and
the peak is the highest level reached. So any one moment of that walk is a lower bound of
the peak. :func:`memory_floor` takes two such moments per device:

- the start of its first backward (``B`` or ``I``) in the schedule's order
  (:func:`planner.schedule.build_schedule`: the order the simulator runs), with every
  forward before it still stashed: under 1F1B the first of ``p`` stages holds
  ``min(p, m)`` microbatches there, under GPipe all of its replica's, with recompute only
  each layer's (or the stage's) input, plus the microbatch rebuilt for that backward;
- the start of its optimizer step (the step's temporaries on top of the static memory).

No time is worked out and no device's whole program is built: only each rank's order up
to its devices' first backwards, so a plan whose floor exceeds a device's memory is known
not to fit for a few milliseconds where simulating it takes a compiled schedule of every
device. :func:`overflowing` is what the search asks (:meth:`planner.solve.search.Search.
refuse`): the devices whose floor exceeds their memory, None where the floor proves
nothing (a searched or non-flushing schedule, or a shape the simulator refuses as input:
the simulation then says so itself). One refusal the simulator makes before its memory
check is not made here: an fp16 or tied STEP the compiled programs cannot defer
(:func:`planner.simulate.timing.simulate_schedule`); such a shape over a device's memory
is scored not fitting where the simulation would score it unable to run: not a plan either
way.

Example::

    floor = memory_floor(profile, topology, shape)   # {device: bytes} or None
    over = overflowing(profile, topology, shape)     # {device: bytes} over its memory
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.limits import check_schedule_size
from planner.precision import check_fp16_schedule
from planner.profile.schema import Profile
from planner.schedule import build_schedule, device_pattern
from planner.schedule.expand import ComputeOp
from planner.schedule.families import family
from planner.shape import PlanShape
from planner.simulate.program import GATHER, SLOTS, STEP, Code
from planner.simulate.shards import check_parallel_stages
from planner.simulate.tables import device_static_bytes, memory_deltas
from planner.stages import StageSpec, validate_stages

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "PREFIX_MEMO_OPS",
    "first_backward_rises",
    "memory_floor",
    "order_prefix",
    "overflowing",
]

_F, _B, _I = int(Code.F), int(Code.B), int(Code.I)


def _runs(profile: Profile, topology: Topology | None, shape: PlanShape) -> bool:
    """Whether the simulator gets as far as the memory with ``shape`` (the checks
    :func:`planner.simulate.simulate` makes before it: stages, schedule size, the order,
    fp16, tensor parallelism and sharding); only a generated schedule with a flush."""
    fam = family(shape.schedule)
    if fam.searched or not fam.flush:
        return False
    stages = list(shape.stages)
    try:
        profile.measurement(shape.microbatch_size)
        validate_stages(stages, profile.num_layers, topology, allow_shared_devices=fam.interleaved)
        check_schedule_size(len(stages), shape.num_microbatches, field="num_microbatches")
        check_fp16_schedule(profile.precision, shape.schedule, fam.flush)
        if not all(st.is_plain for st in stages):
            check_parallel_stages(profile, stages, flush=fam.flush)
    except InputError:
        return False
    return True


# Orders cut after each rank's first backwards (:func:`order_prefix`) by what they depend
# on, least recently used dropped first past PREFIX_MEMO_OPS compute ops in all (a cut is
# the first few rounds of an order of thousands of microbatches, so a sweep does not make
# whole orders again for its floors once the schedule's own cache has dropped them).
PREFIX_MEMO_OPS = 1_500_000
_PREFIXES: OrderedDict[tuple[Any, ...], tuple[dict[int, list[ComputeOp]] | None, int]] = (
    OrderedDict()
)
_held = [0]  # the ops _PREFIXES holds


def order_prefix(
    schedule: str, stages: Sequence[StageSpec], num_microbatches: int, virtual_stages: int
) -> dict[int, list[ComputeOp]] | None:
    """The schedule's order for ``stages`` (:func:`planner.schedule.build_schedule`), each
    rank's ops up to the first backward (``B`` or ``I``) of the last of its devices to
    start one; None where the schedule refuses the stages or is not generated. Kept by
    (schedule, microbatches, chunks, the stages' device pattern and degrees), which decide
    both, up to :data:`PREFIX_MEMO_OPS` ops in all.

    Example::

        order_prefix("1f1b", stages, 8, 1)[0]   # [('F', 0, 0), ..., ('B', 0, 0)]
    """
    pattern = device_pattern(tuple(st.devices for st in stages))
    degrees = tuple(st.tensor_parallel for st in stages)
    key = (schedule, num_microbatches, virtual_stages, pattern, degrees)
    found = _PREFIXES.get(key)
    if found is not None:
        _PREFIXES.move_to_end(key)
        return found[0]
    try:
        sched = build_schedule(schedule, stages, num_microbatches, virtual_stages=virtual_stages)
        order = sched.order
        prefix = None if order is None else {r: _cut(stages, ops) for r, ops in order.items()}
    except InputError:
        prefix = None
    size = 1 if prefix is None else sum(map(len, prefix.values()))
    _PREFIXES[key] = (prefix, size)
    _held[0] += size
    while len(_PREFIXES) > 1 and _held[0] > PREFIX_MEMO_OPS:
        _, (_, dropped) = _PREFIXES.popitem(last=False)
        _held[0] -= dropped
    return prefix


def _cut(stages: Sequence[StageSpec], ops: Sequence[ComputeOp]) -> list[ComputeOp]:
    """``ops`` up to the first backward of the last of their devices to start one."""
    if not ops:
        return []
    devices = set(stages[ops[0][1]].leaders)
    started: set[str] = set()
    for i, (kind, s, k) in enumerate(ops):
        if kind in ("B", "I"):
            started.add(stages[s].replica(k))
            if started >= devices:
                return list(ops[: i + 1])
    return list(ops)


def first_backward_rises(
    stages: Sequence[StageSpec],
    order: dict[int, list[tuple[str, int, int]]],
    grows: Sequence[int],
    shrinks: Sequence[int],
) -> dict[str, int]:
    """Per device (a replica's leader), the most memory above its static memory that the
    simulator's walk of ``order`` reaches up to and including the start of the device's
    first backward (``B`` or ``I``): forwards take ``grows`` at their start and give back
    ``shrinks`` at their end (an FSDP stage's first forward in its gather slot).

    Example::

        first_backward_rises(stages, schedule.order, *memory_deltas(profile, stages, 4))
    """
    rises: dict[str, int] = {}
    for ops in order.values():
        if ops:
            rises.update(_rank_rises(stages, ops, grows, shrinks))
    return rises


def _rank_rises(
    stages: Sequence[StageSpec],
    ops: Sequence[tuple[str, int, int]],
    grows: Sequence[int],
    shrinks: Sequence[int],
) -> dict[str, int]:
    """:func:`first_backward_rises` of one rank's devices (the replicas' leaders of its
    stages), walking its order until each has started a backward."""
    devices = stages[ops[0][1]].leaders
    level = dict.fromkeys(devices, 0)
    top = dict.fromkeys(devices, 0)
    gathered: set[tuple[str, int]] = set()
    rises: dict[str, int] = {}
    for kind, s, k in ops:
        dev = stages[s].replica(k)
        if dev in rises:
            continue
        if dev not in level:  # not expected: a rank's stages share its devices
            level[dev] = top[dev] = 0
        if kind == "F":
            slot = s * SLOTS + _F
            if stages[s].sharding == "fsdp" and (dev, s) not in gathered:
                gathered.add((dev, s))  # its first forward of the iteration gathers
                slot = s * SLOTS + GATHER
            top[dev] = max(top[dev], level[dev] + grows[slot])
            level[dev] += grows[slot] + shrinks[slot]
        elif kind in ("B", "I"):
            slot = s * SLOTS + (_B if kind == "B" else _I)
            rises[dev] = max(top[dev], level[dev] + grows[slot])
            if len(rises) == len(level):
                break
    return rises


def memory_floor(
    profile: Profile, topology: Topology | None, shape: PlanShape
) -> dict[str, int] | None:
    """A lower bound of every device's simulated peak memory (each member of a
    tensor-parallel group its leader's): its static memory plus the larger of the rise at
    its first backward (:func:`first_backward_rises`) and its largest optimizer step's
    temporaries. None where the simulator would not get as far as the memory (see the
    module docstring) or the schedule is searched or does not flush.

    Example::

        memory_floor(profile, topology, shape)["gpu0"] <= simulate_shape(
            profile, topology, shape).memory_bytes["gpu0"]   # True
    """
    if not _runs(profile, topology, shape):
        return None
    stages = list(shape.stages)
    prefix = order_prefix(shape.schedule, stages, shape.num_microbatches, shape.virtual_stages)
    if prefix is None:
        return None
    leaders = [d for st in stages for d in st.leaders]
    static = device_static_bytes(profile, stages, list(dict.fromkeys(leaders)), 1)
    grows, shrinks = memory_deltas(profile, stages, shape.microbatch_size)
    rises = first_backward_rises(stages, prefix, grows, shrinks)
    floor: dict[str, int] = {}
    for si, st in enumerate(stages):
        step = max(0, grows[si * SLOTS + STEP])
        for group in st.replica_groups:
            lead = group[0]
            top = static[lead] + max(rises.get(lead, 0), step)
            for d in group:
                floor[d] = max(floor.get(d, 0), top)
    return floor


def overflowing(profile: Profile, topology: Topology, shape: PlanShape) -> dict[str, int] | None:
    """The devices whose :func:`memory_floor` exceeds their memory, with that floor; None
    where none does or the floor proves nothing: ``shape`` cannot fit where this is not
    None, with or without simulating it.

    Example::

        if overflowing(profile, topology, shape):
            ...  # the simulation would find it over a device's memory too
    """
    floor = memory_floor(profile, topology, shape)
    if floor is None:
        return None
    device = topology.device
    over = {d: b for d, b in floor.items() if b > device(d).memory_bytes}
    return over or None
