"""Where tied gradients are exchanged: a device's STEPs of tie-holding stages wait for all
of its backward work (and all-reduces) of that iteration.

A device's first STEP (in an iteration) of a stage that holds a tied parameter is where the
runtime sums the tied gradients of all copies, with the other devices that hold copies.
Every copy must have its gradient by then, and no device may wait there while another
still needs its backward work: generated orders may step a stage as soon as its own
backward is done (interleaved 1F1B steps stage 2 before the device's last backwards of
stage 0, whose input gradients come from another device that may be waiting in the
exchange). So such a STEP moves to just after the device's last B, I, W or ALLREDUCE of
that iteration and the sends that follow it. Moving a STEP past actions of other stages
changes no result; a move past the stage's own compute would, and is refused. The
simulator times the same order.

Example::

    devices = defer_tied_steps(schedule.devices, holding=frozenset({0, 2, 3}), num_microbatches=4)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.errors import InputError
from planner.schedule.actions import Action, ActionType

__all__ = ["defer_tied_steps"]

_GRADS = (ActionType.B, ActionType.I, ActionType.W)


def defer_tied_steps(
    devices: Mapping[str, Sequence[Action]], holding: frozenset[int], num_microbatches: int
) -> dict[str, list[Action]]:
    """Each device's actions with every STEP of a stage in ``holding`` after the device's
    last backward action or all-reduce of the same iteration (``num_microbatches`` each).

    Example::

        defer_tied_steps({"d": [B0.0, STEP2, B2.0]}, frozenset({0, 2}), 1)  # B0.0 B2.0 STEP2
    """
    return {
        dev: _defer(dev, list(actions), holding, num_microbatches)
        for dev, actions in devices.items()
    }


def _defer(
    dev: str, actions: list[Action], holding: frozenset[int], num_microbatches: int
) -> list[Action]:
    last = _iteration_ends(actions, num_microbatches)
    moved: dict[int, list[Action]] = {}  # position -> STEPs to run right after it
    out: list[Action] = []
    steps: dict[int, int] = {}
    for pos, a in enumerate(actions):
        if a.kind is ActionType.OPTIMIZER_STEP and a.stage in holding:
            iteration = steps.get(a.stage, 0)
            steps[a.stage] = iteration + 1
            target = last.get(iteration, -1)
            if target > pos:
                crossed = [b for b in actions[pos + 1 : target + 1] if b.stage == a.stage]
                if any(b.is_compute or b.kind is ActionType.ALLREDUCE for b in crossed):
                    raise InputError(
                        f"{dev} runs {a} before the rest of its backward work of that "
                        f"iteration (up to {actions[target]}) and works on stage {a.stage} "
                        "in between; a stage holding a tied parameter steps after the "
                        "exchange, which needs all of it: put every backward first",
                        field="schedule",
                    )
                moved.setdefault(target, []).append(a)
                continue
        out.append(a)
        out.extend(moved.pop(pos, []))
    return out


def _iteration_ends(actions: list[Action], num_microbatches: int) -> dict[int, int]:
    """Per iteration, the position of the device's last B, I, W or ALLREDUCE of it, or of
    the sends that directly follow it (the gradient it sends on)."""
    last: dict[int, int] = {}
    reduces: dict[int, int] = {}
    for pos, a in enumerate(actions):
        if a.kind in _GRADS:
            last[a.microbatch // num_microbatches] = pos
        elif a.kind is ActionType.ALLREDUCE:
            iteration = reduces.get(a.stage, 0)
            reduces[a.stage] = iteration + 1
            last[iteration] = pos
    sends = (ActionType.SEND_ACT, ActionType.SEND_GRAD)
    for iteration, pos in last.items():  # ... and the sends right after it (others wait)
        while pos + 1 < len(actions) and actions[pos + 1].kind in sends:
            pos += 1
        last[iteration] = pos
    return last
