"""From a compute order per pipeline rank to per-device action lists with communication.

Generators only decide the order of F/B/I/W on each pipeline rank; :func:`expand` puts
each compute action on the replica that runs it (microbatch ``k`` of stage ``s`` runs on
``stages[s].devices[k % len(devices)]``), adds the sends right after the producing
compute and the receives right before the consuming compute, and closes each stage's
iteration with ``ALLREDUCE`` (replicated stages only) and ``STEP``.

Example::

    order = {0: [("F", 0, 0), ("B", 0, 0)], 1: [("F", 1, 0), ("B", 1, 0)]}
    devices = expand(stages, order, num_microbatches=1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from planner.schedule.action import Action, ActionType

if TYPE_CHECKING:
    from planner.stages import StageSpec

__all__ = ["ComputeOp", "expand"]

ComputeOp = tuple[str, int, int]
"""``(kind, stage, microbatch)`` with kind one of ``"F" "B" "I" "W"``."""

_KIND = {"F": ActionType.F, "B": ActionType.B, "I": ActionType.I, "W": ActionType.W}


def expand(
    stages: Sequence[StageSpec],
    order: Mapping[int, Sequence[ComputeOp]],
    *,
    num_microbatches: int,
) -> dict[str, list[Action]]:
    """Per-device action lists for a per-rank compute ``order``.

    ``num_microbatches`` is the microbatches of one iteration: with more microbatches in
    the order (several iterations, as 2bw simulates) each iteration ends in its own
    ALLREDUCE/STEP.

    Example::

        expand(stages, {0: [("F", 0, 0), ("B", 0, 0)]}, num_microbatches=1)
    """
    num_stages = len(stages)
    per_device: dict[str, list[ComputeOp]] = {}
    for stage in stages:
        for dev in stage.devices:
            per_device.setdefault(dev, [])
    for rank in sorted(order):
        for op in order[rank]:
            per_device[stages[op[1]].replica(op[2])].append(op)

    out: dict[str, list[Action]] = {}
    for dev, ops in per_device.items():
        # The last backward-side op of each (stage, iteration) on this device closes it.
        closing: dict[tuple[int, int], int] = {}
        for i, (kind, s, k) in enumerate(ops):
            if kind != "F":
                closing[(s, k // num_microbatches)] = i
        closers = {i: key for key, i in closing.items()}
        acts: list[Action] = []
        for i, (kind, s, k) in enumerate(ops):
            if kind == "F":
                if s > 0:
                    src = stages[s - 1].replica(k)
                    if src != dev:
                        acts.append(Action(ActionType.RECV_ACT, s, k, src))
                acts.append(Action(ActionType.F, s, k))
                if s + 1 < num_stages:
                    dst = stages[s + 1].replica(k)
                    if dst != dev:
                        acts.append(Action(ActionType.SEND_ACT, s, k, dst))
            elif kind in ("B", "I"):
                if s + 1 < num_stages:
                    src = stages[s + 1].replica(k)
                    if src != dev:
                        acts.append(Action(ActionType.RECV_GRAD, s, k, src))
                acts.append(Action(_KIND[kind], s, k))
                if s > 0:
                    dst = stages[s - 1].replica(k)
                    if dst != dev:
                        acts.append(Action(ActionType.SEND_GRAD, s, k, dst))
            else:
                acts.append(Action(_KIND[kind], s, k))
            if i in closers:
                stage_id = closers[i][0]
                if len(stages[stage_id].devices) > 1:
                    acts.append(Action(ActionType.ALLREDUCE, stage_id))
                acts.append(Action(ActionType.OPTIMIZER_STEP, stage_id))
        out[dev] = acts
    return out
