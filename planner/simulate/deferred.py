"""Deferred STEPs on compiled programs: :func:`planner.schedule.tied.defer_tied_steps`
without expanding the schedule into action lists.

A generated schedule compiles straight from its compute order (receives and sends fused
into the compute entries: :mod:`planner.simulate.program`). Where steps are deferred
(fp16, tied parameters), :func:`~planner.simulate.timing.with_deferred_steps` expanded
the order into every device's action list to move the STEPs, and the lists then compiled
action by action: at a thousand devices and a thousand microbatches that costs more than
the simulation itself. :func:`defer_steps` moves the same STEPs in the compiled programs
instead. On a program compiled from an order, the action list's sends right after a
backward are fused into its entry, so "after the device's last B, I, W or ALLREDUCE of the
iteration and the sends that follow it" is "after that entry", and each moved STEP lands
between the same two compute actions as in the expanded list: the engines run the same
entries in the same order. A move that would cross the stage's own compute or all-reduce
(which :func:`~planner.schedule.tied.defer_tied_steps` refuses, naming it) gives None; the
caller then takes the expanded path for its message.

Example::

    moved = defer_steps(shape.programs, frozenset({0, 1}), 8)   # None: a refused move
"""

from __future__ import annotations

from planner.simulate.program import ALLREDUCE, LAST_COMPUTE, STEP, Code, Entry, Program

__all__ = ["defer_steps"]

_GRADS = frozenset((int(Code.B), int(Code.I), int(Code.W)))


def defer_steps(
    programs: list[Program], holding: frozenset[int], num_microbatches: int
) -> list[Program] | None:
    """``programs`` (compiled from a generated order) with every STEP of a stage in
    ``holding`` after the device's last backward entry or all-reduce of the same
    iteration (``num_microbatches`` each); None where such a move would cross the stage's
    own compute or all-reduce.

    Example::

        defer_steps([[(1, 0, 0, 1, -1, -1, -1), (9, 2, -1, 29, -1, -1, -1),
                      (1, 2, 0, 21, -1, -1, -1)]], frozenset({2}), 1)
        # [[B0.0, B2.0, STEP2]] as entries
    """
    out: list[Program] = []
    for prog in programs:
        moved = _defer(prog, holding, num_microbatches)
        if moved is None:
            return None
        out.append(moved)
    return out


def _defer(prog: Program, holding: frozenset[int], num_microbatches: int) -> Program | None:
    """One program with its STEPs of ``holding`` deferred (see :func:`defer_steps`)."""
    last = _iteration_ends(prog, num_microbatches)
    moved: dict[int, list[Entry]] = {}  # position -> STEPs to run right after it
    out: Program = []
    steps: dict[int, int] = {}
    for pos, e in enumerate(prog):
        if e[0] == STEP and e[1] in holding:
            s = e[1]
            iteration = steps.get(s, 0)
            steps[s] = iteration + 1
            target = last.get(iteration, -1)
            if target > pos:
                if any(
                    b[1] == s and (b[0] <= LAST_COMPUTE or b[0] == ALLREDUCE)
                    for b in prog[pos + 1 : target + 1]
                ):
                    return None
                moved.setdefault(target, []).append(e)
                continue
        out.append(e)
        after = moved.pop(pos, None)
        if after:
            out.extend(after)
    return out


def _iteration_ends(prog: Program, num_microbatches: int) -> dict[int, int]:
    """Per iteration, the position of the program's last B, I, W or ALLREDUCE entry of it
    (its sends are fused in)."""
    last: dict[int, int] = {}
    reduces: dict[int, int] = {}
    for pos, e in enumerate(prog):
        code = e[0]
        if code in _GRADS:
            last[e[2] // num_microbatches] = pos
        elif code == ALLREDUCE:
            iteration = reduces.get(e[1], 0)
            reduces[e[1]] = iteration + 1
            last[iteration] = pos
    return last
