"""Resharding the values that cross a boundary between groups laid out differently along the
sequence (issue #22): sequence parallelism next to another degree, or next to a stage of
one device per replica.

Which values are split: under sequence parallelism a group's members each hold a part of
the activations (the values computed from the model's weights: the hidden states), and
every member holds the rest whole (masks, position ids, rotary tables: computed from the
inputs alone). :func:`~planner.runtime.shards.sharded_cut_specs` tells them apart in its
pass through the pipeline: a value is split where it depends on a weight or on a split
value of the stage's input (autograd's ``requires_grad``). The dimension is the sequence
dimension of the model's ``tp_plan`` (:func:`sequence_dim`: its ``SequenceParallel``
styles', 1 without one).

Who sends what: :func:`~planner.stages.boundary_pieces`. A piece holds, for each tensor in
order, the sender's slice of a split one, and a whole one only where it is the receiver's
first piece; the receiver joins the split ones in sequence order (:meth:`Reshard.join`).
Gradients go the other way, as the members of the later stage hold them.

Example::

    reshard = Reshard(plan.stages, placement, rank, dim=1)
    reshard.learn(1, handed, flags)          # cut 1 in the spec pass: flags per value
    tensors = reshard.piece("F", 1, piece, [hidden, mask])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import torch

from planner.errors import InputError
from planner.runtime.comm import ValueSpec, value_spec
from planner.stages import Piece, StageSpec, boundary_pieces, reshards

if TYPE_CHECKING:
    from planner.runtime.placement import Placement

__all__ = ["Reshard", "sequence_dim"]


def sequence_dim(styles: Mapping[str, Any]) -> int:
    """The dimension sequence parallelism splits, as the plan's ``SequenceParallel``
    styles say (torch's default, 1, without one).

    Example::

        sequence_dim({"blocks.*.ln1": SequenceParallel()})   # 1
    """
    for style in styles.values():
        for placement in getattr(style, "sequence_sharding", ()) or ():
            dim = getattr(placement, "dim", None)
            if isinstance(dim, int):
                return dim
    return 1


@dataclass
class _Cut:
    """One resharded cut (into stage ``c``): which value positions are split."""

    flags: tuple[bool, ...]
    tensors: tuple[bool, ...]  # per tensor among the values (forward messages)
    grads: tuple[bool, ...]  # per floating-point tensor (gradient messages)


@dataclass
class Reshard:
    """The plan's resharded cuts at run time (module docstring): ``learn`` each in the
    spec pass, then ``piece`` a sender's tensors for one receiver and ``join`` a
    receiver's pieces."""

    stages: Sequence[StageSpec]
    placement: Placement
    rank: int
    dim: int = 1
    cuts: dict[int, _Cut] = field(default_factory=dict)
    specs: dict[tuple[str, int, int], list[ValueSpec]] = field(default_factory=dict)

    def resharded(self, c: int) -> bool:
        """Whether cut ``c`` (into stage ``c``) is resharded.

        Example::

            reshard.resharded(1)
        """
        return 0 < c < len(self.stages) and reshards(self.stages[c - 1], self.stages[c])

    def any_cut(self) -> bool:
        """Whether any cut of the plan is resharded.

        Example::

            Reshard(plan.stages, placement, 0).any_cut()   # False without SP
        """
        return any(self.resharded(c) for c in range(1, len(self.stages)))

    def pieces(
        self, kind: str, c: int, senders: Sequence[str], receivers: Sequence[str]
    ) -> list[Piece]:
        """The pieces between two groups at cut ``c``: ``kind`` ``"F"`` (``senders`` of
        stage ``c - 1``) or ``"B"`` (gradients: ``senders`` of stage ``c``).

        Example::

            reshard.pieces("F", 1, ("cpu0", "cpu1"), ("cpu2",))   # a half from each
        """
        before, after = self.stages[c - 1].sequence_parallel, self.stages[c].sequence_parallel
        split = (before, after) if kind == "F" else (after, before)
        return boundary_pieces(senders, receivers, split=split)

    def piece(
        self, kind: str, c: int, piece: Piece, tensors: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """The sender's tensors of ``piece`` (at cut ``c``): its slice of each split one,
        each whole one where the piece is its receiver's first.

        Example::

            reshard.piece("F", 1, piece, [hidden, mask])
        """
        cut = self.cuts[c]
        layout = cut.tensors if kind == "F" else cut.grads
        st = self.stages[c - 1] if kind == "F" else self.stages[c]
        lo = _held(st, piece.sender)
        out: list[torch.Tensor] = []
        for split, t in zip(layout, tensors, strict=True):
            if split:
                whole = t.shape[self.dim] / (_held(st, piece.sender, 1) - lo)
                a, b = int((piece.start - lo) * whole), int((piece.stop - lo) * whole)
                out.append(t.narrow(self.dim, a, b - a))
            elif piece.first:
                out.append(t)
        return out

    def join(
        self, kind: str, c: int, pieces: Sequence[Sequence[torch.Tensor]]
    ) -> list[torch.Tensor]:
        """A receiver's tensors from its pieces at cut ``c`` (in sequence order): each split
        one joined along the sequence, each whole one from the first piece.

        Example::

            hidden, mask = reshard.join("F", 1, [[h0, mask], [h1]])
        """
        cut = self.cuts[c]
        layout = cut.tensors if kind == "F" else cut.grads
        first, rest = iter(pieces[0]), [iter(p) for p in pieces[1:]]
        out: list[torch.Tensor] = []
        for split in layout:
            t = next(first)
            out.append(torch.cat([t, *(next(r) for r in rest)], dim=self.dim) if split else t)
        return out

    def learn(self, c: int, handed: Sequence[Sequence[Any]], flags: Sequence[bool]) -> None:
        """Cut ``c`` from the spec pass: ``handed[i]`` what member ``i`` of stage ``c - 1``'s
        first group hands on, ``flags`` which values are split (module docstring). Checks
        the sequence divides into the pieces (one line naming both stages and its length
        where not) and works out this rank's messages' shapes (:attr:`specs`).

        Example::

            reshard.learn(1, handed, (True, False, False))
        """
        values = list(handed[0])
        tensors = tuple(f for f, v in zip(flags, values, strict=True) if torch.is_tensor(v))
        grads = tuple(
            f
            for f, v in zip(flags, values, strict=True)
            if torch.is_tensor(v) and v.is_floating_point()
        )
        self.cuts[c] = _Cut(tuple(flags), tensors, grads)
        self._check_lengths(c, handed, flags)
        before, after = self.stages[c - 1], self.stages[c]
        out = self.pieces("F", c, before.replica_groups[0], after.replica_groups[0])
        sent = {
            (p.sender, p.receiver): self.piece(
                "F", c, p, _tensors(handed[before.devices.index(p.sender)])
            )
            for p in out
        }
        received = {
            r: self.join("F", c, [sent[(p.sender, r)] for p in out if p.receiver == r])
            for r in after.replica_groups[0]
        }
        back = self.pieces("B", c, after.replica_groups[0], before.replica_groups[0])
        grads_of = {r: [t for t in ts if t.is_floating_point()] for r, ts in received.items()}
        returned = {(p.sender, p.receiver): self.piece("B", c, p, grads_of[p.sender]) for p in back}
        self._learn_specs(c, sent, returned)

    def received(self, c: int, handed: Sequence[Sequence[Any]], place: int) -> tuple[Any, ...]:
        """What member ``place`` of stage ``c`` takes in (the spec pass's values): its
        pieces joined, the values that are not tensors as member 0 handed them.

        Example::

            values = reshard.received(1, handed, 0)
        """
        before, after = self.stages[c - 1], self.stages[c]
        receiver = after.replica_groups[0][place]
        out = self.pieces("F", c, before.replica_groups[0], after.replica_groups[0])
        mine = [
            self.piece("F", c, p, _tensors(handed[before.devices.index(p.sender)]))
            for p in out
            if p.receiver == receiver
        ]
        joined = iter(self.join("F", c, mine))
        return tuple(next(joined) if torch.is_tensor(v) else v for v in handed[0])

    def _check_lengths(
        self, c: int, handed: Sequence[Sequence[Any]], flags: Sequence[bool]
    ) -> None:
        """The split values share one sequence length, which each split side's degree
        divides (one line naming both stages and the length otherwise)."""
        before, after = self.stages[c - 1], self.stages[c]
        lengths = set()
        for f, v in zip(flags, handed[0], strict=True):
            if f and torch.is_tensor(v):
                if v.dim() <= self.dim:
                    raise InputError(
                        f"stage {before.id} hands stage {after.id} a value of shape "
                        f"{tuple(v.shape)} that sequence parallelism splits, with no "
                        f"dimension {self.dim} (the tp_plan's sequence dimension)",
                        field=f"stages[{after.id}]",
                    )
                lengths.add(
                    v.shape[self.dim] * (before.tensor_parallel if before.sequence_parallel else 1)
                )
        parts = [st.tensor_parallel for st in (before, after) if st.sequence_parallel]
        for length in lengths:
            if len(lengths) > 1 or any(length % t for t in parts):
                raise InputError(
                    f"stage {before.id} ({before.describe()}) and stage {after.id} "
                    f"({after.describe()}): the sequence length {length} does not divide "
                    f"into the {' and '.join(map(str, parts))} parts their boundary needs"
                    if len(lengths) == 1
                    else f"stage {before.id} and stage {after.id}: the values sequence "
                    f"parallelism splits have different sequence lengths {sorted(lengths)}",
                    field=f"stages[{after.id}]",
                )

    def _learn_specs(
        self,
        c: int,
        sent: Mapping[tuple[str, str], list[torch.Tensor]],
        returned: Mapping[tuple[str, str], list[torch.Tensor]],
    ) -> None:
        """This rank's messages at cut ``c``, per (kind, stage, peer rank): every replica's
        groups pair as the first ones do (by place)."""
        before, after = self.stages[c - 1], self.stages[c]
        first_b, first_a = before.replica_groups[0], after.replica_groups[0]
        for gb in before.replica_groups:
            for ga in after.replica_groups:
                for (s, r), ts in sent.items():
                    i, j = first_b.index(s), first_a.index(r)
                    self._spec(("F", c), gb[i], ga[j], ts)
                for (s, r), ts in returned.items():
                    j, i = first_a.index(s), first_b.index(r)
                    self._spec(("B", c - 1), ga[j], gb[i], ts)

    def _spec(
        self, key: tuple[str, int], sender: str, receiver: str, ts: Sequence[torch.Tensor]
    ) -> None:
        rank_of = self.placement.rank_of
        me = self.rank
        specs = [value_spec(t) for t in ts]
        if rank_of[sender] == me:
            self.specs[(*key, rank_of[receiver])] = specs
        if rank_of[receiver] == me:
            self.specs[(*key, rank_of[sender])] = specs


def _held(stage: StageSpec, device: str, end: int = 0) -> Fraction:
    """Where the sequence range ``device`` holds starts (``end``: 1, where it stops)."""
    if not stage.sequence_parallel:
        return Fraction(end)
    t = stage.tensor_parallel
    return Fraction(stage.devices.index(device) % t + end, t)


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    return [v for v in values if torch.is_tensor(v)]
