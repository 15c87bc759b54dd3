"""Checks that a schedule is executable: right devices, complete, ordered, deadlock free.

Every generator runs :func:`validate_schedule` on its output, and plans read from disk
are checked the same way, so ``run`` never starts a schedule that cannot finish.

Example::

    validate_schedule(schedule, stages)      # InputError naming the first problem
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.errors import InputError
from planner.schedule.actions import Action, ActionType, Schedule
from planner.schedule.groups import is_grouped, leader_stages, unmirror

if TYPE_CHECKING:
    from planner.stages import StageSpec

__all__ = ["validate_order", "validate_schedule"]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
_SF, _RF, _SB, _RB = (
    ActionType.SEND_ACT,
    ActionType.RECV_ACT,
    ActionType.SEND_GRAD,
    ActionType.RECV_GRAD,
)
_AR, _STEP = ActionType.ALLREDUCE, ActionType.OPTIMIZER_STEP


def validate_order(
    order: dict[int, list[tuple[str, int, int]]],
    stages: Sequence[StageSpec],
    total_microbatches: int,
) -> None:
    """Check a generator's per-rank compute order before it becomes a schedule.

    Every microbatch goes forward once and backward once (B, or I then W) per stage, on
    one rank, forward before backward; and the ranks can run their lists to the end
    (cross-rank dependencies: F after the previous stage's F, the backward after the
    next stage's backward). Sends and receives are then added by construction.

    Example::

        validate_order({0: [("F", 0, 0), ("B", 0, 0)]}, stages, 1)
    """
    num_stages, total = len(stages), total_microbatches
    size = num_stages * total
    f_done, b_done, i_done, w_done = (bytearray(size) for _ in range(4))
    device_rank: dict[str, int] = {}

    def fail(message: str) -> None:
        raise InputError(f"generated schedule is invalid: {message}", field="schedule")

    for rank, ops in order.items():
        placed: set[int] = set()  # stages whose devices are known to be on this rank
        for kind, s, k in ops:
            if not (0 <= s < num_stages and 0 <= k < total):
                fail(f"{kind}{s}.{k} names a stage or microbatch that does not exist")
            if s not in placed:
                for dev in stages[s].devices:
                    if device_rank.setdefault(dev, rank) != rank:
                        fail(f"device {dev} appears on ranks {device_rank[dev]} and {rank}")
                placed.add(s)
            at = s * total + k
            if kind == "F":
                if f_done[at]:
                    fail(f"F{s}.{k} appears twice")
                f_done[at] = 1
            elif kind in ("B", "I"):
                if not f_done[at]:
                    fail(f"{kind}{s}.{k} comes before F{s}.{k}")
                if b_done[at]:
                    fail(f"stage {s} microbatch {k} goes backward twice")
                b_done[at] = 1
                if kind == "I":
                    i_done[at] = 1
                else:
                    w_done[at] = 1
            elif kind == "W":
                if not i_done[at] or w_done[at]:
                    fail(f"W{s}.{k} needs exactly one I{s}.{k} before it")
                w_done[at] = 1
            else:
                fail(f"unknown compute kind {kind!r}")
    if sum(f_done) != size or sum(w_done) != size:
        missing = next(i for i in range(size) if not (f_done[i] and w_done[i]))
        s, k = divmod(missing, total)
        fail(f"stage {s} microbatch {k} does not go forward and backward exactly once")
    # Deadlock check: run every rank as far as the cross-rank dependencies allow.
    f_ok, b_ok = bytearray(size), bytearray(size)
    lists = list(order.values())
    pos = [0] * len(lists)
    last = num_stages - 1
    progress = True
    while progress:
        progress = False
        for r, ops in enumerate(lists):
            p, n = pos[r], len(ops)
            while p < n:
                kind, s, k = ops[p]
                at = s * total + k
                if kind == "F":
                    if s and not f_ok[at - total]:
                        break
                    f_ok[at] = 1
                elif kind != "W":
                    if s < last and not b_ok[at + total]:
                        break
                    b_ok[at] = 1
                p += 1
            if p != pos[r]:
                pos[r] = p
                progress = True
    stuck = [f"rank {r} at {lists[r][pos[r]]}" for r in range(len(lists)) if pos[r] < len(lists[r])]
    if stuck:
        fail("it deadlocks: " + ", ".join(stuck[:4]))


def validate_schedule(
    schedule: Schedule, stages: Sequence[StageSpec], *, source: str | None = None
) -> None:
    """Raise an InputError naming the first problem of ``schedule`` for ``stages``.

    Checks: every action names an existing stage and microbatch and sits on the device
    that runs it; each microbatch goes forward and backward (B, or I then W) exactly once
    per stage; forward before backward on each device; a forward after the step that made
    its weights (iteration ``t`` after STEP of ``t - 1``, under 2bw of ``t - 2``); every
    needed transfer has one send after its producer and one receive before its consumer;
    each stage's devices step once per iteration; and the lists do not deadlock. The
    members of a tensor-parallel group run their leader's list, mirrored
    (:func:`planner.schedule.groups.unmirror`); the leaders' lists are checked as above.

    Example::

        validate_schedule(build_schedule("1f1b", stages, 8), stages)
    """
    if is_grouped(stages):
        lists = unmirror(schedule.devices, stages, source=source)
        leaders = Schedule(
            schedule.name,
            schedule.num_stages,
            schedule.num_microbatches,
            lists,
            virtual_stages=schedule.virtual_stages,
            flush=schedule.flush,
            iterations=schedule.iterations,
        )
        validate_schedule(leaders, leader_stages(stages), source=source)
        return
    num_stages = len(stages)
    total = schedule.num_microbatches * schedule.iterations

    def fail(dev: str | None, index: int | None, message: str) -> None:
        where = "schedule" if dev is None else f"schedule.devices.{dev}"
        if index is not None:
            where += f"[{index}]"
        raise InputError(message, file=source, field=where)

    known = {d for s in stages for d in s.devices}
    for dev in schedule.devices:
        if dev not in known:
            fail(dev, None, f"device {dev!r} runs no stage of this partition")
    seen: dict[tuple[ActionType, int, int], str] = {}
    comms: dict[tuple[ActionType, int, int], tuple[str, str | None]] = {}
    steps: dict[tuple[str, int], int] = {}
    for dev, acts in schedule.devices.items():
        done: set[tuple[ActionType, int, int]] = set()
        for i, a in enumerate(acts):
            kind, s, k = a.kind, a.stage, a.microbatch
            if not 0 <= s < num_stages:
                fail(dev, i, f"{a}: stage {s} does not exist (stages 0..{num_stages - 1})")
            if kind in (_AR, _STEP):
                if dev not in stages[s].devices:
                    fail(dev, i, f"{a}: stage {s} does not run on {dev}")
                if kind == _STEP:
                    steps[(dev, s)] = steps.get((dev, s), 0) + 1
                continue
            if not 0 <= k < total:
                fail(dev, i, f"{a}: microbatch {k} does not exist (0..{total - 1})")
            key = (kind, s, k)
            if kind in (_F, _B, _I, _W):
                owner = stages[s].replica(k)
                if owner != dev:
                    fail(dev, i, f"{a}: microbatch {k} of stage {s} runs on {owner}, not {dev}")
                if key in seen:
                    fail(dev, i, f"{a} appears twice")
                seen[key] = dev
                if kind == _F:
                    _check_weights(schedule, a, steps.get((dev, s), 0), dev, i, fail)
                if kind in (_B, _I) and (_F, s, k) not in done:
                    fail(dev, i, f"{a} comes before its forward F{s}.{k}")
                if kind == _W and (_I, s, k) not in done:
                    fail(dev, i, f"{a} comes before its input-gradient half I{s}.{k}")
                done.add(key)
            else:
                if key in comms:
                    fail(dev, i, f"{a} appears twice")
                comms[key] = (dev, a.peer)
                _check_comm_order(a, done, dev, i, fail)
    for s in range(num_stages):
        for k in range(total):
            if (_F, s, k) not in seen:
                fail(None, None, f"F{s}.{k} is missing: every microbatch goes forward once")
            has_b = (_B, s, k) in seen
            has_iw = ((_I, s, k) in seen, (_W, s, k) in seen)
            if has_b == any(has_iw) or (not has_b and not all(has_iw)):
                fail(
                    None,
                    None,
                    f"stage {s} microbatch {k}: expected one backward, either B{s}.{k} or "
                    f"both I{s}.{k} and W{s}.{k}",
                )
        for dev in stages[s].devices:
            if steps.get((dev, s), 0) != schedule.iterations:
                fail(dev, None, f"expected {schedule.iterations} STEP{s} on {dev}")
    _check_transfers(schedule, stages, comms, fail)
    _check_deadlock(schedule, stages, fail)


def _check_weights(schedule: Schedule, a: Action, steps_done: int, dev, i, fail) -> None:  # type: ignore[no-untyped-def]
    """A forward of iteration ``t`` needs the weights STEP of iteration ``t - versions``
    made: with one version the previous iteration's step, under 2bw (two versions) the one
    before it (:class:`~planner.runtime.optimizer.StreamedTwoBW`)."""
    iteration = a.microbatch // schedule.num_microbatches
    needed = iteration - schedule.weight_versions + 1
    if steps_done < needed:
        fail(
            dev,
            i,
            f"{a} (iteration {iteration}) comes before STEP{a.stage} of iteration "
            f"{needed - 1} made its weights ({schedule.weight_versions} weight versions)",
        )


def _check_comm_order(a: Action, done: set[tuple[ActionType, int, int]], dev, i, fail) -> None:  # type: ignore[no-untyped-def]
    s, k = a.stage, a.microbatch
    if a.kind == _SF and (_F, s, k) not in done:
        fail(dev, i, f"{a} comes before F{s}.{k} produced what it sends")
    if a.kind == _SB and (_B, s, k) not in done and (_I, s, k) not in done:
        fail(dev, i, f"{a} comes before the backward of stage {s} produced what it sends")
    if a.kind == _RF and (_F, s, k) in done:
        fail(dev, i, f"{a} comes after F{s}.{k}, which needs it")
    if a.kind == _RB and ((_B, s, k) in done or (_I, s, k) in done):
        fail(dev, i, f"{a} comes after the backward of stage {s}, which needs it")


def _check_transfers(schedule, stages, comms, fail) -> None:  # type: ignore[no-untyped-def]
    num_stages = len(stages)
    total = schedule.num_microbatches * schedule.iterations
    expected = 0
    for s in range(num_stages):
        for k in range(total):
            here = stages[s].replica(k)
            if s + 1 < num_stages:
                there = stages[s + 1].replica(k)
                if there != here:
                    expected += 2
                    _expect(comms, (_SF, s, k), here, there, fail)
                    _expect(comms, (_RF, s + 1, k), there, here, fail)
                    _expect(comms, (_SB, s + 1, k), there, here, fail)
                    _expect(comms, (_RB, s, k), here, there, fail)
    if len(comms) != 2 * expected:
        fail(None, None, "the schedule has sends or receives that no stage boundary needs")


def _expect(comms, key, dev: str, peer: str, fail) -> None:  # type: ignore[no-untyped-def]
    kind, s, k = key
    name = f"{kind.value}{s}.{k}"
    got = comms.get(key)
    if got is None:
        fail(dev, None, f"{name} is missing: microbatch {k} crosses from one device to another")
    if got != (dev, peer):
        fail(got[0], None, f"{name} should be on {dev} with peer {peer}, not on {got[0]}")


def _check_deadlock(schedule: Schedule, stages: Sequence[StageSpec], fail) -> None:  # type: ignore[no-untyped-def]
    """Advance every device as far as its receives and all-reduces allow."""
    devices = list(schedule.devices)
    lists = [schedule.devices[d] for d in devices]
    pos = [0] * len(devices)
    sent: set[tuple[int, int, int]] = set()
    passed: set[tuple[int, int]] = set()
    occurrences = [dict[int, int]() for _ in devices]
    progress = True
    while progress:
        progress = False
        for di, acts in enumerate(lists):
            n = len(acts)
            p = pos[di]
            while p < n:
                a = acts[p]
                kind = a.kind
                if kind is _SF:
                    sent.add((0, a.stage + 1, a.microbatch))
                elif kind is _SB:
                    sent.add((1, a.stage - 1, a.microbatch))
                elif kind is _RF:
                    if (0, a.stage, a.microbatch) not in sent:
                        break
                elif kind is _RB:
                    if (1, a.stage, a.microbatch) not in sent:
                        break
                elif kind is _AR:
                    occ = occurrences[di].get(a.stage, 0)
                    if (a.stage, occ) not in passed:
                        break
                    occurrences[di][a.stage] = occ + 1
                p += 1
            if p != pos[di]:
                progress = True
                pos[di] = p
        # An all-reduce passes once every replica of its stage waits at it.
        waiting: dict[tuple[int, int], int] = {}
        for di, acts in enumerate(lists):
            if pos[di] < len(acts) and acts[pos[di]].kind is _AR:
                s = acts[pos[di]].stage
                key = (s, occurrences[di].get(s, 0))
                waiting[key] = waiting.get(key, 0) + 1
                if waiting[key] == len(stages[s].devices):
                    passed.add(key)
                    progress = True
    stuck = [
        f"{devices[di]} waits at {lists[di][pos[di]]}"
        for di in range(len(devices))
        if pos[di] < len(lists[di])
    ]
    if stuck:
        fail(None, None, "the schedule deadlocks: " + ", ".join(stuck[:4]))
