"""The compiled program: per device, the flat list of entries that the engines run.

An entry is ``(code, stage, microbatch, slot, recv_key, send_key, dst)``:

* ``code`` names the action (:class:`Code`); compute entries carry their receive and their
  send fused in, so a generated schedule compiles to one entry per compute action;
* ``slot`` (``stage * SLOTS + code``) indexes the device's duration table and the memory
  deltas, so that a program depends only on the schedule's shape, not on any time;
* keys name a transfer: ``(stage * total_mb + mb) * 2`` for the activations entering
  ``stage``, ``+ 1`` for the gradient entering it from the next stage; ``-1`` for none;
  ``dst`` is the index of the device a send goes to.

Example::

    programs = compile_programs(build_schedule("1f1b", stages, 8), stages, ["gpu0", "gpu1"], 8)
    programs[0][0]     # (0, 0, 0, 0, -1, 16, 1): F0.0 (code 0), sends its output to gpu1
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Final

from planner.schedule import ActionType, Schedule
from planner.schedule.expand import closings
from planner.stages import StageSpec

__all__ = [
    "ALLREDUCE",
    "GATHER",
    "LAST_COMPUTE",
    "SLOTS",
    "STEP",
    "KIND_NAMES",
    "Code",
    "Entry",
    "Program",
    "compile_programs",
    "describe_entry",
    "devices_of",
    "gather_first_forwards",
]


class Code(IntEnum):
    """What a program entry does; also the ``code`` of ``SimResult.raw_events``, whose
    name is the event's kind. Sends of gradients compile to ``SEND`` with an odd key (and
    their receives to ``RECV``), so 6 and 7 are free; the slots keep the all-reduce at 8 and
    the step at 9.

    Example::

        Code(8).name    # 'ALLREDUCE'
    """

    F = 0
    B = 1
    I = 2  # noqa: E741 - the standard name of the input-gradient half
    W = 3
    SEND = 4
    RECV = 5
    ALLREDUCE = 8
    STEP = 9


# Plain ints for the programs and the engines' loops (an IntEnum member is slower to load
# and to compare): codes up to LAST_COMPUTE are compute (F, B, I, W).
LAST_COMPUTE: Final = int(Code.W)
SEND: Final = int(Code.SEND)
RECV: Final = int(Code.RECV)
ALLREDUCE: Final = int(Code.ALLREDUCE)
STEP: Final = int(Code.STEP)
# Each code's name (the kind of a SimEvent), for lookups faster than Code(code).name.
KIND_NAMES: Final = {int(c): c.name for c in Code}
# Slots per stage in the duration tables: codes 0-3 (F, B, I, W), 8 (ALLREDUCE), 9 (STEP),
# and 6: an FSDP stage's first forward of an iteration, which gathers its weights first
# (an F entry with this slot: gather_first_forwards).
SLOTS: Final = 10
GATHER: Final = 6
_COMPUTE = {"F": int(Code.F), "B": int(Code.B), "I": int(Code.I), "W": int(Code.W)}

Entry = tuple[int, int, int, int, int, int, int]
Program = list[Entry]


def devices_of(schedule: Schedule, stages: Sequence[StageSpec]) -> list[str]:
    """The devices that run a program, in program order.

    Example::

        devices_of(build_schedule("1f1b", stages, 8), stages)    # ['gpu0', 'gpu1']
    """
    if schedule.order is not None and not schedule.is_expanded:
        return list(dict.fromkeys(d for st in stages for d in st.devices))
    return list(schedule.devices)


def describe_entry(entry: Entry, devices: list[str], total_mb: int) -> str:
    """An action's text form from its compiled entry (for deadlock messages).

    Example::

        describe_entry((5, 1, 0, 0, 16, -1, -1), ["gpu0", "gpu1"], 8)    # 'RECV_F1.0'
    """
    code, s, k, _, rkey, _, _ = entry
    if rkey >= 0:
        into, backward = divmod(rkey, 2)
        return f"{'RECV_B' if backward else 'RECV_F'}{into // total_mb}.{into % total_mb}"
    if code in (ALLREDUCE, STEP):
        return f"{KIND_NAMES[code]}{s}"
    return f"{KIND_NAMES[code]}{s}.{k}"


def compile_programs(
    schedule: Schedule,
    stages: Sequence[StageSpec],
    devices: list[str],
    total_mb: int,
) -> list[Program]:
    """Flat per-device programs of ``(code, stage, mb, slot, recv_key, send_key, dst)``.

    Generated schedules compile straight from their compute order (each receive fused into
    its consumer, each send into its producer): the same semantics as the expanded lists,
    without building them; written (expanded) schedules compile action by action.

    Example::

        compile_programs(build_schedule("gpipe", stages, 4), stages, ["a", "b"], 4)
    """
    if schedule.order is not None and not schedule.is_expanded:
        return _compile_order(schedule, stages, devices, total_mb)
    return _compile_actions(schedule, devices, total_mb)


def _compile_actions(schedule: Schedule, devices: list[str], total_mb: int) -> list[Program]:
    """Programs of expanded action lists: sends and receives stay entries of their own."""
    index = {d: i for i, d in enumerate(devices)}
    t2 = total_mb
    programs: list[Program] = []
    for d in devices:
        prog: Program = []
        for a in schedule.devices[d]:
            s, k = a.stage, a.microbatch
            kind = a.kind
            if kind.value in _COMPUTE:
                code = _COMPUTE[kind.value]
                prog.append((code, s, k, s * SLOTS + code, -1, -1, -1))
            elif kind is ActionType.SEND_ACT:  # activations into stage s+1
                prog.append((SEND, s, k, 0, -1, ((s + 1) * t2 + k) * 2, index[str(a.peer)]))
            elif kind is ActionType.RECV_ACT:
                prog.append((RECV, s, k, 0, (s * t2 + k) * 2, -1, -1))
            elif kind is ActionType.SEND_GRAD:  # gradient into stage s-1
                prog.append((SEND, s, k, 0, -1, ((s - 1) * t2 + k) * 2 + 1, index[str(a.peer)]))
            elif kind is ActionType.RECV_GRAD:
                prog.append((RECV, s, k, 0, (s * t2 + k) * 2 + 1, -1, -1))
            elif kind is ActionType.ALLREDUCE:
                prog.append((ALLREDUCE, s, -1, s * SLOTS + ALLREDUCE, -1, -1, -1))
            else:
                prog.append((STEP, s, -1, s * SLOTS + STEP, -1, -1, -1))
        programs.append(prog)
    return programs


def _compile_order(
    schedule: Schedule,
    stages: Sequence[StageSpec],
    devices: list[str],
    total_mb: int,
) -> list[Program]:
    """Programs of a generated compute order: one entry per compute action, with its
    receive and send fused in, and after the last backward work of a stage in an
    iteration its ALLREDUCE (replicated stages) and STEP."""
    assert schedule.order is not None
    per_device: dict[str, list[tuple[str, int, int]]] = {d: [] for d in devices}
    m = schedule.num_microbatches
    for rank in sorted(schedule.order):
        ops = schedule.order[rank]
        closes = closings(ops, m)
        for i, op in enumerate(ops):
            only = stages[op[1]].devices
            per_device[only[0] if len(only) == 1 else only[op[2] % len(only)]].append(op)
            if i in closes:  # every replica closes the stage's iteration at this point
                for d in stages[closes[i]].devices:
                    per_device[d].append(("C", closes[i], -1))
    index = {d: i for i, d in enumerate(devices)}
    return [_device_program(per_device[d], d, stages, index, total_mb) for d in devices]


def _device_program(
    ops: list[tuple[str, int, int]],
    d: str,
    stages: Sequence[StageSpec],
    index: dict[str, int],
    total_mb: int,
) -> Program:
    """One device's program from its compute ops and closing marks ``("C", stage, -1)``
    (see :func:`_compile_order`)."""
    single = [st.devices[0] if len(st.devices) == 1 else None for st in stages]
    fixed = _fixed_entries(d, stages, single, index, total_mb)
    prog: Program = []
    append = prog.append
    for kind, s, k in ops:
        if kind == "C":
            if len(stages[s].devices) > 1:
                append((ALLREDUCE, s, -1, s * SLOTS + ALLREDUCE, -1, -1, -1))
            append((STEP, s, -1, s * SLOTS + STEP, -1, -1, -1))
            continue
        found = fixed.get((kind, s))
        if found is not None:
            code, rbase, sbase, dst = found
            append(
                (
                    code,
                    s,
                    k,
                    s * SLOTS + code,
                    rbase + 2 * k if rbase >= 0 else -1,
                    sbase + 2 * k if sbase >= 0 else -1,
                    dst,
                )
            )
        else:
            append(_replica_entry(kind, s, k, d, stages, single, index, total_mb))
    return prog


def _neighbours_away(
    d: str, s: int, stages: Sequence[StageSpec], single: list[str | None]
) -> tuple[bool | None, bool | None]:
    """Do stage ``s``'s previous and next stages sit on another device than ``d`` for every
    microbatch (True), never (False), or does it depend on the replica (None)?"""
    last = len(stages) - 1
    prev_away = None if s and single[s - 1] is None else (bool(s) and single[s - 1] != d)
    next_away = None if s < last and single[s + 1] is None else (s < last and single[s + 1] != d)
    return prev_away, next_away


def _fixed_entries(
    d: str,
    stages: Sequence[StageSpec],
    single: list[str | None],
    index: dict[str, int],
    total_mb: int,
) -> dict[tuple[str, int], tuple[int, int, int, int]]:
    """Per (kind, stage) of ``d``'s stages whose neighbours sit on fixed devices: the code,
    the receive and send key bases (keys step by 2 per microbatch) and the peer a send goes
    to."""
    t2 = total_mb
    fixed: dict[tuple[str, int], tuple[int, int, int, int]] = {}
    for s in (s for s in range(len(stages)) if d in stages[s].devices):
        prev_away, next_away = _neighbours_away(d, s, stages, single)
        if prev_away is None or next_away is None:
            continue
        after, before = single[s + 1] if next_away else None, single[s - 1] if s else None
        down = index[after] if after is not None else -1
        up = index[before] if prev_away and before is not None else -1
        fixed[("F", s)] = (
            int(Code.F),
            s * t2 * 2 if prev_away else -1,
            (s + 1) * t2 * 2 if next_away else -1,
            down,
        )
        fixed[("W", s)] = (int(Code.W), -1, -1, -1)
        for kind in ("B", "I"):
            fixed[(kind, s)] = (
                _COMPUTE[kind],
                s * t2 * 2 + 1 if next_away else -1,
                (s - 1) * t2 * 2 + 1 if prev_away else -1,
                up,
            )
    return fixed


def _replica_entry(
    kind: str,
    s: int,
    k: int,
    d: str,
    stages: Sequence[StageSpec],
    single: list[str | None],
    index: dict[str, int],
    total_mb: int,
) -> Entry:
    """The entry of a compute op next to a replicated stage: whether its neighbour is on
    another device depends on the microbatch's replica."""
    t2 = total_mb
    rkey = skey = dst = -1
    prev_away, next_away = _neighbours_away(d, s, stages, single)
    before = single[s - 1] or stages[s - 1].replica(k) if s else None
    after = single[s + 1] or stages[s + 1].replica(k) if s + 1 < len(stages) else None
    if prev_away is None:
        prev_away = before != d
    if next_away is None:
        next_away = after != d
    code = _COMPUTE[kind]
    if kind == "F":
        if prev_away:
            rkey = (s * t2 + k) * 2
        if next_away and after is not None:
            skey, dst = ((s + 1) * t2 + k) * 2, index[after]
    elif kind != "W":
        if next_away:
            rkey = (s * t2 + k) * 2 + 1
        if prev_away and before is not None:
            skey, dst = ((s - 1) * t2 + k) * 2 + 1, index[before]
    return (code, s, k, s * SLOTS + code, rkey, skey, dst)


def gather_first_forwards(
    programs: list[Program], stages: Sequence[int], num_microbatches: int
) -> list[Program]:
    """``programs`` with each device's first forward of an iteration of each of ``stages``
    (FSDP stages: the weights are gathered there) in slot ``stage * SLOTS + GATHER``; still
    an F (its events are forwards), timed and sized by that slot.

    Example::

        gather_first_forwards(shape.programs, [0], 8)[0][0][3]   # 6: F0.0 gathers first
    """
    wanted = set(stages)
    out: list[Program] = []
    for prog in programs:
        seen: set[tuple[int, int]] = set()
        new = list(prog)
        for p, (code, s, k, _, rkey, skey, dst) in enumerate(prog):
            if code == Code.F and s in wanted and (s, k // num_microbatches) not in seen:
                seen.add((s, k // num_microbatches))
                new[p] = (code, s, k, s * SLOTS + GATHER, rkey, skey, dst)
        out.append(new)
    return out
