"""Transfers between groups whose layouts differ along the sequence (issue #22).

Next to a sequence-parallel stage of another degree (or a stage without groups), what
crosses the boundary is resharded (:func:`~planner.stages.boundary_pieces`): each
receiving member gets the sequence range it needs from the members holding it. The
values crossing are of two kinds: those split along the sequence under sequence
parallelism (the hidden states), and those every member holds whole (a mask, rotary
tables). The profile gives their bytes: a cut's whole bytes ``W`` (the plain profile)
and one member's ``C`` at degree ``t`` with sequence parallelism, so the split part is
``X = (W - C) t / (t - 1)`` and the rest ``R = W - X`` (:func:`split_parts`). A piece
of range ``f`` carries ``X f`` bytes, and ``R`` more where it is its receiver's first.

The simulator times a boundary's pieces together, as it times a group's member-to-member
transfers (:func:`~planner.simulate.group_comm.group_transfer`): every link any of them
uses, held for the longest latency plus the busiest link's bytes over its bandwidth
(:func:`reshard_transfer`). :class:`Groups` carries what the routes need beside each
leader's group.

Example::

    parts = split_parts(profile, stages[0], stages[1], 4)     # (X, R) bytes
    links, latency_ms, wire_ms = reshard_transfer(topology, ("gpu0", "gpu1"), ("gpu2",),
                                                  (True, False), parts)
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.cost import boundary_bytes
from planner.profile.schema import Profile
from planner.simulate.shards import shard_view
from planner.stages import StageSpec, boundary_pieces, reshards

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "Groups",
    "Reshard",
    "piece_bytes",
    "plan_reshard",
    "reshard_transfer",
    "split_parts",
]


@dataclass(frozen=True)
class Reshard:
    """The resharded boundaries of a plan: ``split`` the devices of sequence-parallel
    stages, ``parts[c]`` the ``(split, rest)`` bytes of cut ``c`` (into stage ``c``)
    where it is resharded (:func:`split_parts`)."""

    split: frozenset[str]
    parts: tuple[tuple[int, tuple[int, int]], ...]

    def of_cut(self, c: int) -> tuple[int, int] | None:
        """Cut ``c``'s parts, None where it is not resharded."""
        return next((p for k, p in self.parts if k == c), None)


class Groups(dict[str, tuple[str, ...]]):
    """Each tensor-parallel leader's group (:attr:`StageTables.groups
    <planner.simulate.tables.StageTables>`), with the plan's resharded boundaries
    (``reshard``: None where there are none, the routes of equal layouts)."""

    reshard: Reshard | None = None


def split_parts(profile: Profile, before: StageSpec, after: StageSpec, mb: int) -> tuple[int, int]:
    """The bytes of the values crossing from ``before`` to ``after`` that are split along
    the sequence under sequence parallelism, and of the rest (module docstring), from the
    sequence-parallel side's degree (the sender's where both are).

    Example::

        split_parts(profile, *with_parallelism(parse_stages("0:a+b;1:c"),
                                                 sequence_parallel=True), 4)
    """
    side = before if before.sequence_parallel else after
    whole = boundary_bytes(profile, before.last, mb)
    member = boundary_bytes(shard_view(profile, side), before.last, mb)
    t = side.tensor_parallel
    split = min(whole, max(0, round((whole - member) * t / (t - 1))))
    return split, whole - split


def plan_reshard(profile: Profile, stages: Sequence[StageSpec], mb: int) -> Reshard | None:
    """The plan's resharded boundaries (:class:`Reshard`), None where there are none.

    Example::

        plan_reshard(profile, stages, 4)    # None without sequence parallelism
    """
    parts = tuple(
        (st.id, split_parts(profile, stages[st.id - 1], st, mb))
        for st in stages[1:]
        if reshards(stages[st.id - 1], st)
    )
    if not parts:
        return None
    split = frozenset(d for st in stages if st.sequence_parallel for d in st.devices)
    return Reshard(split, parts)


def piece_bytes(
    sources: Sequence[str], targets: Sequence[str], split: tuple[bool, bool], parts: tuple[int, int]
) -> list[tuple[str, str, int]]:
    """Each piece of the boundary as ``(sender, receiver, bytes)`` (module docstring).

    Example::

        piece_bytes(("a", "b"), ("c",), (True, False), (1000, 24))
        # [('a', 'c', 524), ('b', 'c', 500)]
    """
    x, rest = parts
    return [
        (p.sender, p.receiver, round(x * (p.stop - p.start)) + (rest if p.first else 0))
        for p in boundary_pieces(sources, targets, split=split)
    ]


# Per topology: (sources, targets, split, parts) -> (links, latency, wire); a solve asks
# for the same few boundaries in every candidate (bounded, as group_comm's caches).
_Key = tuple[tuple[str, ...], tuple[str, ...], tuple[bool, bool], tuple[int, int]]
_ROUTES: weakref.WeakKeyDictionary[
    Topology, dict[_Key, tuple[list[tuple[str, str]], float, float]]
] = weakref.WeakKeyDictionary()
_MAX_ROUTES = 1 << 14


def reshard_transfer(
    topology: Topology,
    sources: Sequence[str],
    targets: Sequence[str],
    split: tuple[bool, bool],
    parts: tuple[int, int],
) -> tuple[list[tuple[str, str]], float, float]:
    """The pieces of one resharded boundary all at once: ``(links, latency_ms, wire_ms)``,
    every link any of them uses held for the longest latency plus the busiest link's bytes
    (the pieces crossing it) over its bandwidth.

    Example::

        reshard_transfer(topology, ("gpu0", "gpu1"), ("gpu2",), (True, False), (2**20, 0))
    """
    per = _ROUTES.get(topology)
    if per is None:
        per = _ROUTES[topology] = {}
    key = (tuple(sources), tuple(targets), split, parts)
    hit = per.get(key)
    if hit is not None:
        return hit
    load: dict[tuple[str, str], int] = {}
    latency = 0.0
    for a, b, n in piece_bytes(sources, targets, split, parts):
        if a == b:
            continue
        latency = max(latency, topology.latency_ms(a, b))
        for hop in topology.route_links(a, b):
            load[hop] = load.get(hop, 0) + n
    wire = max((n / topology.link_bandwidth(*hop) * 1e3 for hop, n in load.items()), default=0.0)
    if len(per) >= _MAX_ROUTES:
        per.clear()
    per[key] = (list(load), latency, wire)
    return per[key]
