"""A lower bound on a plan's simulated iteration time that counts the all-reduce.

:func:`planner.simulate.lower_bound_ms` (the bound plans report) leaves data-parallel
all-reduces out. In the simulator a device is busy for the whole of every ``ALLREDUCE`` of
a stage it holds (the ring time :meth:`~planner.topology.Topology.allreduce_ms` of the
stage's gradients, tied ones excluded), after its compute for that stage and before its
``STEP``; actions on one device never overlap. So no device finishes an iteration before

    its microbatches' forward + backward + its stages' all-reduces + its stages' steps,

which is :func:`busy_bound_ms`. In a pipeline a device also cannot start before the first
microbatch has gone forward through the stages before its lowest stage ``k``, and after its
last backward that microbatch's gradient still goes back through them
(:func:`pipeline_bound_ms`):

    head_k + its compute + max(tail_k, all-reduce + step)

with ``head_k`` (``tail_k``) the fastest replica's forward (backward, or its input half
under zero-bubble) of each stage before ``k``. For equal stages under 1F1B that is exactly
``(m + p - 1)(f + b)``. A device holding several stages (interleaved) is bounded the same
way from its lowest stage: whichever backward it runs last (of a stage ``c >= k``), the
gradient still has stages ``c - 1 .. 0`` ahead of it, and the all-reduces of its other
stages, which the schedules run right after each stage's last backward there, come before
it; so for ``p`` equal devices of ``v`` equal chunks the bound is
``(m + (p - 1) / v)(f + b)``, the interleaved schedule's ideal.
The searches visit candidates in the order of the largest of these and the simulator's own
bound, and stop simulating once it cannot beat the best time found: with the all-reduce
and the fill and drain left out, almost every candidate would get through.

Example::

    busy_bound_ms(profile, topology, stages, num_microbatches=16, microbatch_size=4)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.cost import (
    StageTimes,
    stage_param_bytes,
    stage_static_bytes,
    stage_step_ms,
    stage_tied_parameters,
    stage_times,
)
from planner.plan import StageSpec
from planner.profile.schema import Profile
from planner.schedule.families import family
from planner.simulate import lower_bound_ms
from planner.simulate.group_comm import replica_sync_ms
from planner.simulate.shards import member_static_bytes
from planner.simulate.tables import compute_times, step_table

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "SHARE_MEMO_SIZE",
    "ShareMemo",
    "busy_bound_ms",
    "overflows_memory",
    "pipeline_bound_ms",
    "search_bound_ms",
]


@dataclass(frozen=True)
class _Share:
    """What one device of a stage does in an iteration: ``count`` microbatches of
    ``times`` each, then the stage's all-reduce (``reduce_ms``) and its step."""

    device: str
    count: int
    times: StageTimes
    reduce_ms: float
    step_ms: float


# How many shares (one per stage replica) a ShareMemo holds before it empties itself.
SHARE_MEMO_SIZE = 1_000_000


class ShareMemo:
    """Each stage's shares (:func:`_shares`) by (stage, microbatches, microbatch size), one
    memo per profile and topology (a search's); emptied once it holds more than ``limit``
    shares in all (a row holds a share per replica: hundreds on big clusters), so its
    memory stays bounded while a sweep meets its stages again soon after.

    Example::

        memo = ShareMemo()
        search_bound_ms(profile, topology, stages, "1f1b", 8, 1, memo)
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = SHARE_MEMO_SIZE if limit is None else limit
        self.rows: dict[tuple[StageSpec, int, int], list[_Share]] = {}
        self.held = 0

    def row(
        self,
        profile: Profile,
        topology: Topology | None,
        st: StageSpec,
        num_microbatches: int,
        microbatch_size: int,
    ) -> list[_Share]:
        """``st``'s row of :func:`_shares`, worked out once while kept."""
        key = (st, num_microbatches, microbatch_size)
        found = self.rows.get(key)
        if found is None:
            if self.held > self.limit:
                self.rows.clear()
                self.held = 0
            found = _stage_shares(profile, topology, st, num_microbatches, microbatch_size)
            self.rows[key] = found
            self.held += len(found)
        return found


def _shares(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    num_microbatches: int,
    microbatch_size: int,
    memo: ShareMemo | None = None,
) -> list[list[_Share]]:
    """Per stage, per device in its order: its share of the iteration (microbatch ``k``
    of a stage with ``r`` replicas runs on replica ``k % r``). Replicas of one speed share
    one :func:`~planner.cost.stage_times`. A tensor-parallel or sharded stage's shares are
    the simulator's own tables' (per group leader). ``memo`` (one per profile and
    topology: a search's) keeps each stage's row by the stage and the microbatches: the
    candidates of a sweep share most of their stages."""
    if memo is None:
        return [
            _stage_shares(profile, topology, st, num_microbatches, microbatch_size) for st in stages
        ]
    return [memo.row(profile, topology, st, num_microbatches, microbatch_size) for st in stages]


def _stage_shares(
    profile: Profile,
    topology: Topology | None,
    st: StageSpec,
    num_microbatches: int,
    microbatch_size: int,
) -> list[_Share]:
    """One stage's row of :func:`_shares`."""
    if not st.is_plain:
        return _group_shares(profile, topology, st, num_microbatches, microbatch_size)
    r = len(st.devices)
    reduce_ms = _allreduce_ms(profile, topology, st)
    by_speed: dict[float, tuple[StageTimes, float]] = {}
    row = []
    for j, dev in enumerate(st.devices):
        speed = topology.device(dev).speed if topology is not None else 1.0
        hit = by_speed.get(speed)
        if hit is None:
            t = stage_times(
                profile, st.first, st.last, microbatch_size, speed=speed, recompute=st.recompute
            )
            hit = by_speed[speed] = (t, stage_step_ms(profile, st.first, st.last, speed=speed))
        count = num_microbatches // r + (1 if j < num_microbatches % r else 0)
        row.append(_Share(dev, count, hit[0], reduce_ms, hit[1]))
    return row


def _group_shares(
    profile: Profile,
    topology: Topology | None,
    st: StageSpec,
    num_microbatches: int,
    microbatch_size: int,
) -> list[_Share]:
    """:func:`_shares` of a tensor-parallel or sharded stage: per replica (its leader) the
    simulator's compute times (collectives included), replica sync and step (without
    ZeRO-1's gather after it and FSDP's at the first forward: a bound may leave work out)."""
    times, _ = compute_times(profile, topology, [st], microbatch_size)
    steps = step_table(profile, topology, [st], None)
    reduce_ms = replica_sync_ms(profile, topology, st)
    r = st.replicas
    row = []
    for j, dev in enumerate(st.leaders):
        f, b, bi, bw = times[(st.id, dev)]
        count = num_microbatches // r + (1 if j < num_microbatches % r else 0)
        row.append(_Share(dev, count, StageTimes(f, b, bi, bw), reduce_ms, steps[(st.id, dev)]))
    return row


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
    return _busy(_shares(profile, topology, stages, num_microbatches, microbatch_size))


def _busy(shares: Sequence[Sequence[_Share]]) -> float:
    busy: dict[str, float] = {}
    for row in shares:
        for sh in row:
            t = sh.times
            busy[sh.device] = busy.get(sh.device, 0.0) + sh.count * (t.forward_ms + t.backward_ms)
            busy[sh.device] += sh.reduce_ms + sh.step_ms
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
    module docstring), devices holding several stages (interleaved) included.

    Example::

        pipeline_bound_ms(profile, topology, parse_stages("0-3:gpu0;4-7:gpu1"), 8, 4)
    """
    shares = _shares(profile, topology, stages, num_microbatches, microbatch_size)
    return _piped(shares, split_backward)


def _piped(shares: Sequence[Sequence[_Share]], split_backward: bool) -> float:
    heads, tails = _heads_and_tails(shares, split_backward)
    held: dict[str, list[tuple[int, _Share]]] = {}
    for k, row in enumerate(shares):
        for sh in row:
            held.setdefault(sh.device, []).append((k, sh))
    bound = 0.0
    for mine in held.values():
        bound = max(bound, _device_bound(mine, heads, tails, split_backward))
    return bound


def _heads_and_tails(
    shares: Sequence[Sequence[_Share]], split_backward: bool
) -> tuple[list[float], list[float]]:
    """Per stage ``k``: the fastest forward through stages ``0 .. k-1`` (``heads[k]``) and
    the fastest backward (input half under ``split_backward``) back through them."""
    heads, tails = [0.0], [0.0]
    for row in shares:
        fastest_f = min(sh.times.forward_ms for sh in row)
        if split_backward:
            fastest_back = min(sh.times.input_grad_ms for sh in row)
        else:
            fastest_back = min(sh.times.backward_ms for sh in row)
        heads.append(heads[-1] + fastest_f)
        tails.append(tails[-1] + fastest_back)
    return heads, tails


def _device_bound(
    mine: Sequence[tuple[int, _Share]],
    heads: Sequence[float],
    tails: Sequence[float],
    split_backward: bool,
) -> float:
    """One device's end, at the earliest: ``mine`` are its (stage index, share) pairs in
    stage order. Nothing starts before its lowest stage's head; its last backward (of any
    of its stages ``c``) still has ``c``'s tail ahead; each stage's all-reduce follows
    its last backward there, and its step that."""
    lowest = mine[0][0]
    head, tail = heads[lowest], tails[lowest]
    if len(mine) == 1:
        # One stage (the sums in this order, as bounds computed them before the general
        # case existed: the same numbers to the bit).
        sh = mine[0][1]
        t = sh.times
        if split_backward:
            through = sh.count * (t.forward_ms + t.input_grad_ms)
            done = max(
                through + tail, through + sh.count * t.weight_grad_ms + sh.reduce_ms + sh.step_ms
            )
        else:
            work = sh.count * (t.forward_ms + t.backward_ms)
            done = work + max(tail, sh.reduce_ms + sh.step_ms)
        return head + done
    through = total = reduces = 0.0
    for _, sh in mine:
        t = sh.times
        if split_backward:
            through += sh.count * (t.forward_ms + t.input_grad_ms)
            work = t.forward_ms + t.input_grad_ms + t.weight_grad_ms
        else:
            through += sh.count * (t.forward_ms + t.backward_ms)
            work = t.forward_ms + t.backward_ms
        total += sh.count * work + sh.reduce_ms + sh.step_ms
        reduces += sh.reduce_ms
    if split_backward:
        return head + max(through + tail, total)
    # A stage's all-reduce runs right after its last backward on the device (as
    # build_schedule orders it): all but that of the stage ``c`` whose backward comes last
    # run before it, and after it come that all-reduce and step, and ``c``'s tail.
    last = min(max(tails[k] - sh.reduce_ms, sh.step_ms) for k, sh in mine)
    return head + max(through + reduces + last, total)


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
    memo: ShareMemo | None = None,
) -> float:
    """A lower bound of the simulated iteration for a named schedule: the larger of
    :func:`busy_bound_ms` and :func:`pipeline_bound_ms` (flushing schedules), and where a
    device holds several stages (interleaved) of :func:`planner.simulate.lower_bound_ms`
    too (one microbatch's critical path, transfers included); 2bw (no flush):
    :func:`busy_bound_ms` and the simulator's bound. ``memo``: each stage's share of the
    work kept for the next call (one dict per profile and topology, a search's).

    Example::

        search_bound_ms(profile, topology, stages, "1f1b", 8, 4)
    """
    shares = _shares(profile, topology, stages, num_microbatches, microbatch_size, memo)
    busy = _busy(shares)
    flush = family(schedule).flush
    shared = len({d for st in stages for d in st.devices}) < sum(len(st.devices) for st in stages)
    if flush:
        piped = _piped(shares, split_backward=family(schedule).split_backward)
        if not shared and piped > 0.0:
            return max(busy, piped)
        busy = max(busy, piped)
    plain = lower_bound_ms(
        profile,
        topology,
        stages,
        num_microbatches,
        microbatch_size,
        flush=flush,
        split_backward=family(schedule).split_backward,
    )
    return max(plain, busy)


def overflows_memory(
    profile: Profile, topology: Topology, stages: Sequence[StageSpec], schedule: str
) -> bool:
    """Whether some device's weights, gradients and optimizer state (with 2bw's second
    weight version) alone exceed its memory. The simulator holds them throughout, so its
    peak is never below them, and recompute does not shrink them: no recompute makes such
    a plan fit, and simulating it can only say so.

    Example::

        overflows_memory(profile, topology, parse_stages("0-3:gpu0;4-7:gpu1"), "1f1b")
    """
    versions = family(schedule).weight_versions
    held: dict[str, int] = {}
    for st in stages:
        if not st.is_plain:
            member = member_static_bytes(profile, st, weight_versions=versions)
            for d in st.devices:
                held[d] = held.get(d, 0) + member
            continue
        per_device = stage_static_bytes(profile, st.first, st.last, replicas=len(st.devices))
        per_device += (versions - 1) * stage_param_bytes(profile, st.first, st.last)
        for d in st.devices:
            held[d] = held.get(d, 0) + per_device
    return any(b > topology.device(d).memory_bytes for d, b in held.items())
