"""Per-stage tables: what each action costs on each device, in time and in memory.

Compute times (with recompute), optimizer steps (with the exchange of tied gradients and
fp16's overflow agreement), replicas' all-reduces, the bytes crossing each cut, and the
memory held (weights, gradients, optimizer state, a second weight version without a
flush) and taken and given back by each kind of action (stashed activations, rebuilt
ones under recompute, CUDA workspaces). :class:`StageTables` lays them out per device
and slot (``stage * SLOTS + code``) for the engines. A tensor-parallel group has one row,
its leader's (the members' are the same): its shard's compute at the group's slowest
device's speed plus its collectives (:mod:`planner.simulate.group_comm`); ZeRO-1 and FSDP
stages step on ``1 / r`` of the state, FSDP's first forward of an iteration gathers the
weights (slot ``GATHER``), ZeRO-1's step is followed by that gather
(:mod:`planner.simulate.shards`).

Example::

    tables = stage_tables(profile, topology, stages, schedule, 4)
    tables.durations[0][0 * SLOTS + Code.F]     # F of stage 0 on the first device, ms
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.cost import (
    StageTimes,
    boundary_bytes,
    stage_activation_bytes,
    stage_param_bytes,
    stage_rebuilt_bytes,
    stage_static_bytes,
    stage_step_ms,
    stage_step_workspace_bytes,
    stage_tied_parameters,
    stage_times,
    stage_workspace_bytes,
)
from planner.errors import InputError
from planner.profile.schema import Profile
from planner.schedule import ActionType, Schedule
from planner.schedule.groups import group_of_leader, is_grouped, leader_stages
from planner.simulate.group_comm import (
    gather_ms,
    groups_collective_ms,
    pass_collectives,
    replica_sync_ms,
)
from planner.simulate.program import ALLREDUCE, GATHER, SLOTS, STEP, devices_of
from planner.simulate.reshard import Groups, plan_reshard
from planner.simulate.shards import (
    FORGOTTEN,
    gathered_bytes,
    member_static_bytes,
    shard_view,
    step_workspace_bytes,
)
from planner.stages import StageSpec, boundary_pairs

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "StageTables",
    "compute_times",
    "device_static_bytes",
    "memory_deltas",
    "overflow_agreement_ms",
    "reference_durations",
    "stage_tables",
    "step_table",
    "tied_exchange_ms",
    "with_message_overheads",
]

# Per (stage, device): forward, backward, input-gradient and weight-gradient times, ms.
ComputeTimes = dict[tuple[int, str], tuple[float, float, float, float]]


@dataclass
class StageTables:
    """What the engines read, per device in program order and per slot.

    ``durations[i][slot]``: how long the action of ``slot`` takes on device ``i``;
    ``grows[slot]`` / ``shrinks[slot]``: the memory taken at its start and given back at
    its end (the same on every device); ``static``: the bytes each device holds
    throughout; ``cut[s]``: the bytes entering stage ``s`` from ``s - 1`` (activations
    forward, gradients backward); ``steps``: each (stage, device)'s STEP, as timed;
    ``replicas[s]``: how many devices run stage ``s`` (and meet at its all-reduces).
    Tensor parallelism: ``devices`` are the groups' leaders, ``groups`` each leader's
    group; ``reference`` the reference run's durations (device index, slot) that are not
    the duration times the device's speed (a group's compute without its collectives);
    ``gathering`` the FSDP stages, whose first forward of an iteration runs in slot
    ``GATHER``.

    Example::

        tables = stage_tables(profile, None, stages, schedule, 4, None)
        tables.durations[0][SLOTS * 1 + Code.B]     # B of stage 1 on the first device
    """

    devices: list[str]
    durations: list[list[float]]
    grows: list[int]
    shrinks: list[int]
    static: dict[str, int]
    cut: list[int]
    steps: dict[tuple[int, str], float]
    replicas: list[int]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    reference: dict[tuple[int, int], float] = field(default_factory=dict)
    gathering: list[int] = field(default_factory=list)


def speed(topology: Topology | None, device: str) -> float:
    """A device's speed (1 without a topology).

    Example::

        speed(None, "gpu0")     # 1.0
    """
    return 1.0 if topology is None else topology.device(device).speed


def compute_times(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    microbatch_size: int,
) -> tuple[ComputeTimes, list[int]]:
    """Per (stage, device) the compute times at the device's speed, and per stage the
    bytes that enter it from the previous one. A tensor-parallel stage has one entry per
    group, keyed by its leader: its shard's times at the group's slowest device's speed,
    plus its collectives on the group (forward ones in F, backward ones in B and I, again
    in B and I under recompute); its cut is one member's.

    Example::

        times, cut = compute_times(profile, None, stages, 4)
        times[(0, "gpu0")]     # (forward, backward, input grad, weight grad) ms
    """
    key = (id(profile), id(topology), tuple(stages), microbatch_size)
    found = _TIMES.get(key)
    if found is not None and found[0] is profile and found[1] is topology:
        return dict(found[2]), list(found[3])
    times, cut = _compute_times(profile, topology, stages, microbatch_size)
    _TIMES.clear()  # one entry: the tables and the lower bound of one simulation share it
    _TIMES[key] = (profile, topology, times, cut)
    return dict(times), list(cut)


# compute_times' last answer, until the next simulate() starts (shards.forget_views).
_TIMES: dict[tuple[Any, ...], tuple[Profile, Topology | None, ComputeTimes, list[int]]] = {}
FORGOTTEN.append(_TIMES.clear)


def _compute_times(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    microbatch_size: int,
) -> tuple[ComputeTimes, list[int]]:
    """:func:`compute_times`, worked out."""
    times = {}
    for st in stages:
        if st.tensor_parallel > 1:
            times.update(_group_times(profile, topology, st, microbatch_size))
            continue
        # Replicas of one speed share their times (many replicas: computed once).
        by_speed: dict[float, tuple[float, float, float, float]] = {}
        for dev in st.devices:
            v = speed(topology, dev)
            row = by_speed.get(v)
            if row is None:
                t = stage_times(
                    profile, st.first, st.last, microbatch_size, speed=v, recompute=st.recompute
                )
                row = (t.forward_ms, t.backward_ms, t.input_grad_ms, t.weight_grad_ms)
                by_speed[v] = row
            times[(st.id, dev)] = row
    # Bytes entering stage s from stage s-1 (activations forward, gradients backward).
    cut = [0] + [
        boundary_bytes(shard_view(profile, st), st.first - 1, microbatch_size) for st in stages[1:]
    ]
    return times, cut


def with_message_overheads(
    times: ComputeTimes, topology: Topology | None, stages: Sequence[StageSpec], cut: list[int]
) -> ComputeTimes:
    """``times`` with each device's ``message_overhead_ms`` (its topology entry) added once
    per message its action sends to or receives from another stage's device: ``F`` receives
    the stage's input and sends its output, ``B`` and ``I`` receive the output's gradient
    and send the input's (``W`` neither); a tensor-parallel group pays its members' largest.
    A neighbouring stage on the same device exchanges nothing (one process). Collectives
    (all-reduces, tensor-parallel and sharding collectives) are not charged here: their
    CPU side is in the topology's ``allreduce_efficiency`` and the collectives' times.
    Unchanged without a topology or where every overhead is 0 (the GPU topologies).

    Example::

        with_message_overheads(times, load_topology("topologies/cpu.yaml"), stages, cut)
    """
    if topology is None or not any(d.message_overhead_ms for d in topology.devices):
        return times
    last = len(stages) - 1
    out = dict(times)
    for (si, dev), (f, b, i, w) in times.items():
        # A tensor-parallel group (keyed by its leader) is as slow as its slowest member.
        group = next((g for g in stages[si].replica_groups if g[0] == dev), (dev,))
        cost = max(topology.device(d).message_overhead_ms for d in group)
        if not cost:
            continue
        before = si > 0 and cut[si] > 0 and dev not in stages[si - 1].devices
        after = si < last and cut[si + 1] > 0 and dev not in stages[si + 1].devices
        if _mixed_neighbours(stages, si):
            forward, backward = _mixed_overheads(topology, stages, si, group, before, after)
            out[(si, dev)] = (f + forward, b + backward, i + backward, w)
            continue
        messages = cost * (int(before) + int(after))
        out[(si, dev)] = (f + messages, b + messages, i + messages, w)
    return out


def _mixed_neighbours(stages: Sequence[StageSpec], si: int) -> bool:
    """Whether stage ``si``'s tensor-parallel degree differs from a neighbour's."""
    t = stages[si].tensor_parallel
    return any(0 <= n < len(stages) and stages[n].tensor_parallel != t for n in (si - 1, si + 1))


def _mixed_overheads(
    topology: Topology,
    stages: Sequence[StageSpec],
    si: int,
    group: tuple[str, ...],
    before: bool,
    after: bool,
) -> tuple[float, float]:
    """A group's message overheads per ``F`` and per ``B``/``I`` next to a stage of another
    degree: member ``i`` receives one message per input and sends one to each member of
    the peer group it serves (:func:`~planner.stages.boundary_peers`), or where sequence
    parallelism reshards the values (:func:`~planner.stages.boundary_pieces`) one per
    piece it receives or sends, so members differ; the group pays its slowest member's."""
    sp = stages[si].sequence_parallel
    prev = (_peer_group(stages, si - 1), stages[si - 1].sequence_parallel) if before else None
    nxt = (_peer_group(stages, si + 1), stages[si + 1].sequence_parallel) if after else None
    forward = backward = 0.0
    for dev in group:
        cost = topology.device(dev).message_overhead_ms
        f = _messages(prev, (group, sp), dev, 1) + _messages((group, sp), nxt, dev, 0)
        b = _messages(nxt, (group, sp), dev, 1) + _messages((group, sp), prev, dev, 0)
        forward = max(forward, cost * f)
        backward = max(backward, cost * b)
    return forward, backward


_Side = tuple[tuple[str, ...], bool]  # a group and whether it splits the sequence


def _messages(senders: _Side | None, receivers: _Side | None, dev: str, side: int) -> int:
    """How many of a boundary's transfers ``dev`` takes part in as sender (``side`` 0) or
    receiver (1); none where there is no such neighbour."""
    if senders is None or receivers is None:
        return 0
    pairs = boundary_pairs(senders[0], receivers[0], split=(senders[1], receivers[1]))
    return sum(1 for pair in pairs if pair[side] == dev)


def _peer_group(stages: Sequence[StageSpec], n: int) -> tuple[str, ...]:
    """The first replica group of stage ``n`` (groups of one stage have one size)."""
    st = stages[n]
    return tuple(st.devices[: st.tensor_parallel])


def _group_times(
    profile: Profile, topology: Topology | None, st: StageSpec, microbatch_size: int
) -> ComputeTimes:
    """A tensor-parallel stage's compute times per group (see :func:`compute_times`)."""
    view = shard_view(profile, st)
    out: ComputeTimes = {}
    groups = st.replica_groups
    passes = groups_collective_ms(topology, groups, pass_collectives(profile, st, microbatch_size))
    by_speed: dict[float, StageTimes] = {}  # groups of one speed share their shard's times
    for group, (fwd, bwd) in zip(groups, passes, strict=True):
        v = min(speed(topology, d) for d in group)
        t = by_speed.get(v)
        if t is None:
            t = by_speed[v] = stage_times(
                view, st.first, st.last, microbatch_size, speed=v, recompute=st.recompute
            )
        redo = fwd if st.recompute else 0.0
        out[(st.id, group[0])] = (
            t.forward_ms + fwd,
            t.backward_ms + bwd + redo,
            t.input_grad_ms + bwd + redo,
            t.weight_grad_ms,
        )
    return out


def step_table(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    step_ms: float | Sequence[float] | None,
) -> dict[tuple[int, str], float]:
    """The STEP duration of each stage on each of its devices.

    ``None``: the profile's optimizer step of the stage's layers at the device's speed (a
    tensor-parallel group's: its shard's at its slowest device's speed, under ZeRO-1 and
    FSDP on ``1 / r`` of the state); a number (or one per stage) given explicitly is taken
    as it is, on every device. Keys are each replica's (leader) device.

    Example::

        step_table(profile, topology, stages, None)    # {(0, 'gpu0'): 0.8, (1, 'gpu1'): 0.7}
    """
    if step_ms is None:
        out: dict[tuple[int, str], float] = {}
        for st in stages:
            if not st.is_plain:
                out.update(_group_steps(profile, topology, st))
                continue
            by_speed: dict[float, float] = {}  # replicas of one speed: computed once
            for d in st.devices:
                v = speed(topology, d)
                if v not in by_speed:
                    by_speed[v] = stage_step_ms(profile, st.first, st.last, speed=v)
                out[(st.id, d)] = by_speed[v]
        return out
    if isinstance(step_ms, int | float):
        given = [float(step_ms)] * len(stages)
    else:
        given = [float(x) for x in step_ms]
        if len(given) != len(stages):
            raise InputError(
                f"expected one step time per stage ({len(stages)}), got {len(given)}",
                field="step_ms",
            )
    return {(st.id, d): given[st.id] for st in stages for d in st.leaders}


def _group_steps(
    profile: Profile, topology: Topology | None, st: StageSpec
) -> dict[tuple[int, str], float]:
    """A tensor-parallel or sharded stage's STEP per group (its leader): its shard's step
    at the group's slowest speed (groups of one speed share it), ``1 / r`` of it sharded."""
    view = shard_view(profile, st)
    by_speed: dict[float, float] = {}
    out: dict[tuple[int, str], float] = {}
    for group in st.replica_groups:
        v = min(speed(topology, d) for d in group)
        ms = by_speed.get(v)
        if ms is None:
            ms = by_speed[v] = stage_step_ms(view, st.first, st.last, speed=v)
        out[(st.id, group[0])] = ms if st.sharding == "none" else ms / st.replicas
    return out


def tied_exchange_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    step_order: Mapping[str, Sequence[int]] | None = None,
) -> dict[tuple[int, str], float]:
    """The time each device spends exchanging tied gradients, keyed by the STEP that pays it.

    Per tied parameter: a ring all-reduce of its ``param_bytes`` (the topology's
    ``allreduce_ms``) among every device of every stage that uses it. A device pays the
    exchanges of all the tied parameters it holds in its first ``STEP`` of a stage that
    holds any (where the runtime exchanges them). Nothing without a topology (free
    communication) or when one device holds all copies of a parameter. ``step_order``:
    per device the stages of its STEPs in order, where the caller has them (default: read
    from ``schedule.devices``, which expands a generated schedule).

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
        steps = _steps_of(schedule, step_order, d)
        first = next((s for s in steps if s in holding), None)
        if first is not None:  # a hand-made list without a STEP: nothing to pay there
            out[(first, d)] = ms
    return out


def overflow_agreement_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    step_order: Mapping[str, Sequence[int]] | None = None,
) -> dict[tuple[int, str], float]:
    """fp16: the all-reduce (MAX) of one overflow flag among every device, keyed by each
    device's first STEP, where the runtime agrees on it (:mod:`planner.runtime.loss_scale`).
    Nothing for another precision, without a topology, or on one device. The wait for the
    slowest device that this agreement also is, is not modelled. ``step_order`` as in
    :func:`tied_exchange_ms`.

    Example::

        overflow_agreement_ms(fp16_profile, topology, stages, schedule)
        # {(0, 'gpu0'): 0.011, (1, 'gpu1'): 0.011}
    """
    if profile.precision != "fp16" or topology is None:
        return {}
    devices = devices_of(schedule, stages)
    if is_grouped(stages):  # every member agrees; the leaders' lists stand for them
        devices = devices_of(schedule, leader_stages(stages))
        ring = list(dict.fromkeys(d for st in stages for d in st.devices))
        ms = topology.allreduce_ms(ring, 4)
    elif len(devices) < 2:
        return {}
    else:
        ms = topology.allreduce_ms(devices, 4)
    out: dict[tuple[int, str], float] = {}
    for d in devices:
        first = next(iter(_steps_of(schedule, step_order, d)), None)
        if first is not None:
            out[(first, d)] = ms
    return out


def _steps_of(
    schedule: Schedule, step_order: Mapping[str, Sequence[int]] | None, device: str
) -> Iterable[int]:
    """The stages of ``device``'s STEPs in order: from ``step_order`` where given, else
    from ``schedule``'s lists."""
    if step_order is not None:
        return step_order.get(device, ())
    return (a.stage for a in schedule.devices[device] if a.kind is ActionType.OPTIMIZER_STEP)


def _replica_allreduce_bytes(profile: Profile, spec: StageSpec) -> int:
    """What a replicated stage's ALLREDUCE sums: its gradients less the tied ones."""
    total = stage_param_bytes(profile, spec.first, spec.last)
    if not profile.tied_parameters:
        return total
    return total - sum(t.param_bytes for t in stage_tied_parameters(profile, spec.first, spec.last))


def device_static_bytes(
    profile: Profile, stages: Sequence[StageSpec], devices: list[str], weight_versions: int
) -> dict[str, int]:
    """Per device (a tensor-parallel group's leader stands for it): the weights, gradients
    and optimizer state of its stages, as the simulator holds them throughout
    (:attr:`StageTables.static`).

    Example::

        device_static_bytes(profile, stages, ["gpu0", "gpu1"], 1)["gpu0"]
    """
    return _static_bytes(profile, stages, devices, weight_versions)


def memory_deltas(
    profile: Profile, stages: Sequence[StageSpec], microbatch_size: int
) -> tuple[list[int], list[int]]:
    """Per slot (``stage * SLOTS + code``) the memory an action takes at its start and
    gives back at its end, as the simulator counts them (:attr:`StageTables.grows` and
    :attr:`StageTables.shrinks`).

    Example::

        grows, shrinks = memory_deltas(profile, stages, 4)
    """
    return _memory_deltas(profile, stages, microbatch_size)


def _static_bytes(
    profile: Profile, stages: Sequence[StageSpec], devices: list[str], weight_versions: int
) -> dict[str, int]:
    """Per device: weights, gradients and optimizer state of its stages (and the extra
    weight versions of a schedule without a flush)."""
    static = dict.fromkeys(devices, 0)
    for spec in stages:
        if not spec.is_plain:
            held = member_static_bytes(profile, spec, weight_versions=weight_versions)
            for d in spec.leaders:
                if d in static:
                    static[d] += held
            continue
        per_dev = stage_static_bytes(profile, spec.first, spec.last, replicas=len(spec.devices))
        per_dev += (weight_versions - 1) * stage_param_bytes(profile, spec.first, spec.last)
        for d in spec.devices:
            if d in static:
                static[d] += per_dev
    return static


def _memory_deltas(
    profile: Profile, stages: Sequence[StageSpec], microbatch_size: int
) -> tuple[list[int], list[int]]:
    """Per slot the memory taken at the action's start and given back at its end.

    The stash is taken when a forward starts and freed when B (or W) ends; with recompute
    the rebuilt activations (a whole microbatch's, or the largest layer's under
    ``recompute_layers``) exist from the start of B (or I) until it (or W) ends; the
    workspace exists while each runs; the optimizer step's temporaries while STEP runs.
    FSDP's whole weights and gradients come with the first forward of an iteration (slot
    ``GATHER``) and go when its STEP starts (after the reduce-scatter).
    """
    grows = [0] * (SLOTS * len(stages))
    shrinks = [0] * (SLOTS * len(stages))
    for si, s in enumerate(stages):
        if not s.is_plain:
            _member_deltas(profile, s, si, microbatch_size, grows, shrinks)
            continue
        stash, rebuilt = _recompute_bytes(profile, s, microbatch_size)
        scratch = stage_workspace_bytes(profile, s.first, s.last, microbatch_size)
        deltas = (
            (stash + scratch, -scratch),
            (rebuilt + scratch, -stash - rebuilt - scratch),
            (rebuilt + scratch, -scratch),
            (scratch, -stash - rebuilt - scratch),
        )
        for code in range(4):
            grows[si * SLOTS + code], shrinks[si * SLOTS + code] = deltas[code]
        step_work = stage_step_workspace_bytes(profile, s.first, s.last)
        grows[si * SLOTS + STEP], shrinks[si * SLOTS + STEP] = step_work, -step_work
    return grows, shrinks


def _recompute_bytes(profile: Profile, s: StageSpec, microbatch_size: int) -> tuple[int, int]:
    """What one in-flight microbatch stashes on the stage, and what its backward rebuilds
    at once (0 without recompute): :func:`planner.cost.stage_memory_bytes`'s terms."""
    each = s.recompute_layers
    stash = stage_activation_bytes(
        profile, s.first, s.last, microbatch_size, recompute=s.recompute, each_layer=each
    )
    if not s.recompute:
        return stash, 0
    return stash, stage_rebuilt_bytes(profile, s.first, s.last, microbatch_size, each_layer=each)


def _member_deltas(
    profile: Profile,
    s: StageSpec,
    si: int,
    microbatch_size: int,
    grows: list[int],
    shrinks: list[int],
) -> None:
    """:func:`_memory_deltas` of a tensor-parallel or sharded stage, for one member."""
    view = shard_view(profile, s)
    stash, rebuilt = _recompute_bytes(view, s, microbatch_size)
    scratch = stage_workspace_bytes(view, s.first, s.last, microbatch_size)
    deltas = (
        (stash + scratch, -scratch),
        (rebuilt + scratch, -stash - rebuilt - scratch),
        (rebuilt + scratch, -scratch),
        (scratch, -stash - rebuilt - scratch),
    )
    for code in range(4):
        grows[si * SLOTS + code], shrinks[si * SLOTS + code] = deltas[code]
    gathered = gathered_bytes(profile, s)
    grows[si * SLOTS + GATHER] = deltas[0][0] + gathered
    shrinks[si * SLOTS + GATHER] = deltas[0][1]
    step_work = step_workspace_bytes(profile, s)
    grows[si * SLOTS + STEP], shrinks[si * SLOTS + STEP] = step_work - gathered, -step_work


def _step_times(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    step_ms: float | Sequence[float] | None,
    step_order: Mapping[str, Sequence[int]] | None = None,
) -> dict[tuple[int, str], float]:
    """Each STEP as timed: the optimizer step, plus the tied and overflow exchanges the
    device pays in it (``step_order``: see :func:`tied_exchange_ms`)."""
    steps = step_table(profile, topology, stages, step_ms)
    for st in stages:
        if st.sharding == "zero1":  # the updated weights' all-gather follows the step
            ms = gather_ms(profile, topology, st)
            for d in st.leaders:
                steps[(st.id, d)] += ms
    for key, ms in tied_exchange_ms(profile, topology, stages, schedule, step_order).items():
        steps[key] += ms
    for key, ms in overflow_agreement_ms(profile, topology, stages, schedule, step_order).items():
        steps[key] += ms
    return steps


def stage_tables(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    schedule: Schedule,
    microbatch_size: int,
    step_ms: float | Sequence[float] | None,
    step_order: Mapping[str, Sequence[int]] | None = None,
) -> StageTables:
    """The tables for timing ``schedule`` (see :class:`StageTables`); ``step_order``: per
    device the stages of its STEPs in order, where the caller has them (see
    :func:`tied_exchange_ms`).

    Example::

        stage_tables(profile, None, stages, build_schedule("1f1b", stages, 8), 4, None)
    """
    times, cut = compute_times(profile, topology, stages, microbatch_size)
    times = with_message_overheads(times, topology, stages, cut)
    grouped = is_grouped(stages)
    devices = devices_of(schedule, leader_stages(stages) if grouped else stages)
    steps = _step_times(profile, topology, stages, schedule, step_ms, step_order)
    static = _static_bytes(profile, stages, devices, 1 if schedule.flush else 2)
    allreduce_ms = [
        (
            topology.allreduce_ms(s.devices, _replica_allreduce_bytes(profile, s))
            if topology is not None and len(s.devices) > 1
            else 0.0
        )
        if s.is_plain
        else replica_sync_ms(profile, topology, s)
        for s in stages
    ]
    gathering = [si for si, s in enumerate(stages) if s.sharding == "fsdp"]
    gather = {si: gather_ms(profile, topology, stages[si]) for si in gathering}
    durations: list[list[float]] = []
    for d in devices:
        table = [0.0] * (SLOTS * len(stages))
        for si in range(len(stages)):
            if (si, d) in times:
                table[si * SLOTS : si * SLOTS + 4] = times[(si, d)]
                table[si * SLOTS + ALLREDUCE] = allreduce_ms[si]
                table[si * SLOTS + STEP] = steps[(si, d)]
                if si in gather:
                    table[si * SLOTS + GATHER] = table[si * SLOTS] + gather[si]
        durations.append(table)
    grows, shrinks = _memory_deltas(profile, stages, microbatch_size)
    replicas = [st.replicas for st in stages]
    tables = StageTables(devices, durations, grows, shrinks, static, cut, steps, replicas)
    if grouped:
        tables.groups = Groups(group_of_leader(stages))
        tables.groups.reshard = plan_reshard(profile, stages, microbatch_size)
        tables.reference = _group_reference(profile, stages, devices, microbatch_size)
    tables.gathering = gathering
    return tables


def _group_reference(
    profile: Profile, stages: Sequence[StageSpec], devices: list[str], microbatch_size: int
) -> dict[tuple[int, int], float]:
    """The reference run's compute of each tensor-parallel group: its shard's times on a
    speed-1 device, without the collectives (whose times depend on the links)."""
    index = {d: i for i, d in enumerate(devices)}
    out: dict[tuple[int, int], float] = {}
    for si, st in enumerate(stages):
        if st.tensor_parallel == 1:
            continue
        t = stage_times(
            shard_view(profile, st), st.first, st.last, microbatch_size, recompute=st.recompute
        )
        row = (t.forward_ms, t.backward_ms, t.input_grad_ms, t.weight_grad_ms)
        for d in st.leaders:
            if d in index:
                for code in range(4):
                    out[(index[d], si * SLOTS + code)] = row[code]
    return out


def reference_durations(tables: StageTables, topology: Topology) -> list[list[float]]:
    """The durations of the reference run that fixes the links' order: the profile's compute
    times (on speed-1 devices: each device's times times its speed; a tensor-parallel
    group's shard without its collectives, FSDP's first forward without its gather), and
    no time for all-reduces and steps.

    Example::

        reference_durations(tables, topology)[0][0]   # F of stage 0, as profiled
    """
    out = []
    for dtab, d in zip(tables.durations, tables.devices, strict=True):
        sp = topology.device(d).speed
        ref = [x * sp for x in dtab]
        ref[ALLREDUCE::SLOTS] = ref[STEP::SLOTS] = [0.0] * (len(ref) // SLOTS)
        out.append(ref)
    for (i, slot), ms in tables.reference.items():
        out[i][slot] = ms
    for si in tables.gathering:
        for ref in out:
            ref[si * SLOTS + GATHER] = ref[si * SLOTS]
    return out
