"""Tied parameters at run time: one copy per stage, gradients summed before the step.

A parameter used by layers of several stages (tied embeddings) is held by each of them.
Every copy starts identical (all ranks build the model with one seed); to keep them
identical, the gradients of all copies are summed before any of them is stepped, as
Megatron-LM does for its embedding group:

* inside one process, two local stages never share a Parameter object (their optimizers
  would step it twice): :func:`own_copies` gives the later stage its own copy;
* per tied parameter, a process group of every rank that holds a stage using it (replicas
  included), created on every rank in a fixed order after the replica groups;
* :class:`TiedExchange` sums the local copies' gradients, all-reduces the sum over that
  group (no collective for a group of one rank) and gives every local copy the total. The
  executor runs it inside STEP: at the first STEP of a holding stage that each local
  device program reaches in an iteration, once every such program has arrived (the
  worker first moves such STEPs after the device's backward work on holding stages:
  :func:`planner.schedule.tied.defer_tied_steps`).
  Replicated stages' ALLREDUCE leaves the tied parameters out.

Example::

    claimed: set[int] = set()
    module = own_copies(split.stage(3, 5), claimed)       # fresh copies of claimed params
    tied = TiedExchange.create(ties, plan.stages, placement, rank, stage_names)
    rnd = tied.launch(runtimes, iteration=0, threaded=False)
    rnd.finish()                                          # every copy holds the sum
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from planner.runtime.comm import Pending

if TYPE_CHECKING:
    from planner.plan import StageSpec
    from planner.profile.tied import TiedParameter
    from planner.runtime.placement import Placement
    from planner.runtime.stage import StageRuntime

__all__ = ["TiedExchange", "TiedRound", "own_copies"]

_M = TypeVar("_M", bound=torch.nn.Module)


def own_copies(module: _M, claimed: set[int]) -> _M:
    """``module``, or a copy of it whose parameters in ``claimed`` (ids of parameters an
    earlier local stage holds) are fresh copies; everything else stays shared. Adds the
    module's original parameter ids to ``claimed``.

    Example::

        claimed: set[int] = set()
        first = own_copies(split.stage(0, 2), claimed)   # unchanged
        last = own_copies(split.stage(3, 5), claimed)    # its own embed.weight
    """
    params = list(module.parameters())
    shared = [p for p in params if id(p) in claimed]
    claimed.update(id(p) for p in params)
    if not shared:
        return module
    taken = {id(p) for p in shared}
    memo: dict[int, Any] = {
        id(t): t for t in [*params, *module.buffers()] if id(t) not in taken
    }  # deepcopy maps these to themselves: only the shared parameters are copied
    return copy.deepcopy(module, memo)


@dataclass(frozen=True)
class _Slot:
    """One tied parameter on this rank: its local copies and its group."""

    name: str
    copies: tuple[tuple[int, int], ...]  # (stage id, index in that stage's params)
    group: Any  # None: this rank holds every copy (the local sum is the total)


class TiedRound:
    """One exchange in flight: ``ready()`` polls, ``finish()`` hands out the totals."""

    def __init__(self, pending: Pending, copies: list[list[torch.Tensor]]):
        self.pending = pending
        self.copies = copies
        self.finished = False

    def ready(self) -> bool:
        return self.finished or self.pending.ready()

    def wait(self) -> None:
        self.pending.wait()

    def finish(self) -> None:
        """Wait for the all-reduces and copy each total into every local copy's gradient."""
        if self.finished:
            return
        self.pending.wait()
        for total, tensors in zip(self.pending.buffers, self.copies, strict=True):
            for t in tensors:
                t.grad.copy_(total)  # type: ignore[union-attr]
        self.finished = True


class TiedExchange:
    """The tied parameters this rank holds, and how their gradients are summed."""

    def __init__(self, slots: Sequence[_Slot], holding: frozenset[int]):
        self.slots = list(slots)
        self.holding = holding  # every stage (plan-wide) that uses a tied parameter
        self._excluded: dict[int, set[int]] = {}
        for slot in self.slots:
            for s, i in slot.copies:
                self._excluded.setdefault(s, set()).add(i)

    @classmethod
    def create(
        cls,
        ties: Sequence[TiedParameter],
        stages: Sequence[StageSpec],
        placement: Placement,
        rank: int,
        stage_names: Mapping[int, Sequence[str]],
    ) -> TiedExchange:
        """Create every tie's process group (on every rank, in tie order) and find this
        rank's copies; ``stage_names[s]`` names local stage ``s``'s trainable parameters.

        Example::

            tied = TiedExchange.create(find_tied_parameters(split), plan.stages,
                                       placement, rank, stage_names)
        """
        import torch.distributed as dist

        slots: list[_Slot] = []
        holding: set[int] = set()
        for tie in ties:
            holders = [st for st in stages if tie.held_by(st.first, st.last)]
            holding.update(st.id for st in holders)
            ranks = sorted({placement.rank_of[d] for st in holders for d in st.devices})
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            copies = tuple(
                (st.id, list(stage_names[st.id]).index(tie.name))
                for st in holders
                if st.id in stage_names and tie.name in stage_names[st.id]
            )
            if rank in ranks and copies:
                slots.append(_Slot(tie.name, copies, group))
        return cls(slots, frozenset(holding))

    def untied(self, stage: int, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``params`` of ``stage`` without its tied copies (what a replica ALLREDUCE sums).

        Example::

            flat = torch.cat([p.grad.reshape(-1) for p in tied.untied(s, params)])
        """
        out = self._excluded.get(stage)
        return list(params) if not out else [p for i, p in enumerate(params) if i not in out]

    def launch(
        self, runtimes: Mapping[int, StageRuntime], iteration: int, *, threaded: bool
    ) -> TiedRound:
        """Sum the local copies' gradients of ``iteration`` and start the all-reduces.

        Example::

            rnd = tied.launch(runtimes, 0, threaded=False)
            rnd.finish()
        """
        import torch.distributed as dist

        works, totals, copies = [], [], []
        for slot in self.slots:
            tensors = [runtimes[s].params_for(iteration)[i] for s, i in slot.copies]
            for t in tensors:
                if t.grad is None:
                    t.grad = torch.zeros_like(t)
            total = tensors[0].grad.detach().clone()  # type: ignore[union-attr]
            for t in tensors[1:]:
                total += t.grad  # type: ignore[operator]
            if slot.group is not None:
                works.append(dist.all_reduce(total, group=slot.group, async_op=True))
            totals.append(total)
            copies.append(tensors)
        return TiedRound(Pending(works, totals, threaded=threaded), copies)
