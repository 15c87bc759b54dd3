"""From a compute order per pipeline rank to per-device action lists with communication.

Generators only decide the order of F/B/I/W on each pipeline rank; :func:`expand` puts
each compute action on the replica that runs it (microbatch ``k`` of stage ``s`` runs on
``stages[s].devices[k % len(devices)]``), adds the sends right after the producing
compute and the receives right before the consuming compute, and closes each stage's
iteration with ``ALLREDUCE`` (replicated stages only) and ``STEP``. Tensor-parallel
stages are expanded for their groups' leaders and mirrored to the other members
(:mod:`planner.schedule.groups`).

Example::

    order = {0: [("F", 0, 0), ("B", 0, 0)], 1: [("F", 1, 0), ("B", 1, 0)]}
    devices = expand(stages, order, num_microbatches=1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from planner.schedule.action import Action, ActionType
from planner.schedule.groups import is_grouped, leader_stages, mirror

if TYPE_CHECKING:
    from planner.stages import StageSpec

__all__ = ["ComputeOp", "closings", "expand"]

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
    if is_grouped(stages):
        lead = expand(leader_stages(stages), order, num_microbatches=num_microbatches)
        return mirror(lead, stages)
    out: dict[str, list[Action]] = {dev: [] for stage in stages for dev in stage.devices}
    for rank in sorted(order):
        ops = order[rank]
        closes = closings(ops, num_microbatches)
        for i, (kind, s, k) in enumerate(ops):
            _compute(out[stages[s].replica(k)], stages, kind, s, k)
            key = closes.get(i)
            if key is not None:
                stage = stages[key]
                for dev in stage.devices:
                    if len(stage.devices) > 1:
                        out[dev].append(Action(ActionType.ALLREDUCE, key))
                    out[dev].append(Action(ActionType.OPTIMIZER_STEP, key))
    return out


def closings(ops: Sequence[ComputeOp], num_microbatches: int) -> dict[int, int]:
    """Where a rank's order closes a stage's iteration: ``{index: stage}`` for the rank's
    last backward-side op of each stage and iteration.

    Every replica of the stage all-reduces and steps at that point of the *rank's* order
    (after its own ops before it, before its ops after it), so the replicas meet where the
    one order would have them and the lists cannot deadlock if the order does not. Each
    replica's own last backward would not do: under 2bw a replica's next forwards, which
    a later stage needs before the other replicas' last backwards can run, would wait
    behind its all-reduce. The simulator's compiled programs use the same points.

    Example::

        closings([("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("B", 0, 1)], 2)   # {3: 0}
    """
    closing: dict[tuple[int, int], int] = {}
    for i, (kind, s, k) in enumerate(ops):
        if kind != "F":
            closing[(s, k // num_microbatches)] = i
    return {i: key[0] for key, i in closing.items()}


def _compute(acts: list[Action], stages: Sequence[StageSpec], kind: str, s: int, k: int) -> None:
    """Append one compute op to its device's list with the receive before it and the send
    after it where a neighbouring stage's microbatch runs on another device."""
    dev = stages[s].replica(k)
    last = len(stages) - 1
    if kind == "F":
        if s > 0 and (src := stages[s - 1].replica(k)) != dev:
            acts.append(Action(ActionType.RECV_ACT, s, k, src))
        acts.append(Action(ActionType.F, s, k))
        if s < last and (dst := stages[s + 1].replica(k)) != dev:
            acts.append(Action(ActionType.SEND_ACT, s, k, dst))
    elif kind in ("B", "I"):
        if s < last and (src := stages[s + 1].replica(k)) != dev:
            acts.append(Action(ActionType.RECV_GRAD, s, k, src))
        acts.append(Action(_KIND[kind], s, k))
        if s > 0 and (dst := stages[s - 1].replica(k)) != dev:
            acts.append(Action(ActionType.SEND_GRAD, s, k, dst))
    else:
        acts.append(Action(_KIND[kind], s, k))
