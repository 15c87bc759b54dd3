"""The schedule families pipeplan generates, and what each implies, in one table.

Code that needs to know how a schedule behaves asks its family (or a
:class:`~planner.schedule.actions.Schedule`'s own ``flush`` / ``weight_versions``), never
compares names. A family owns its behaviour: its generator (:meth:`Family.order`, which
:func:`planner.schedule.build_schedule` dispatches to), the microbatches a stage holds at
its peak (:meth:`Family.in_flight_microbatches`), where its virtual stages sit
(:attr:`Family.placement`: :data:`PLACEMENTS`) and whether its iterations may run as one
continuous stream (:attr:`Family.streams`). A new schedule is one more row here.

======== ===== ================ ========================================================
family   flush weight versions what else
======== ===== ================ ========================================================
gpipe    yes   1                all forwards, then all backwards
1f1b     yes   1                PipeDream-Flush: one forward, one backward
interleaved yes 1               several chunks (virtual stages) per device, in a loop
zb       yes   1                backward split into input (I) and weight (W) halves
2bw      no    2                PipeDream-2BW: iterations overlap, gradients one step stale
optimized yes  1                1F1B or ZB-H1 with searched depths (needs a profile)
======== ===== ================ ========================================================

Example::

    family("2bw").weight_versions     # 2
    family("zb").split_backward       # True
    family("1f1b").in_flight_microbatches(4, 0, 8)   # 4
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from planner.errors import InputError
from planner.schedule.expand import ComputeOp
from planner.schedule.gpipe import gpipe_order
from planner.schedule.interleaved import interleaved_order
from planner.schedule.onef1b import default_warmup, onef1b_order
from planner.schedule.replicas import per_replica_order, replica_round, round_count
from planner.schedule.zerobubble import zb_order
from planner.stages import StageSpec

__all__ = [
    "FAMILIES",
    "PLACEMENTS",
    "Family",
    "Generator",
    "Held",
    "device_groups",
    "family",
    "is_interleaved",
]

T = TypeVar("T")
Order = dict[int, list[ComputeOp]]
# A family's generator: (stages p, microbatches M, virtual stages v, iterations,
# microbatches per replica round R) -> the compute order per rank, over ceil(M / R) rounds
# per iteration (planner.schedule.replicas).
Generator = Callable[[int, int, int, int, int], Order]
# Microbatches stage ``s`` of ``p`` holds at its peak over all its replicas: (p, s,
# microbatches M, virtual stages v, microbatches per round R, rounds per iteration n).
Held = Callable[[int, int, int, int, int, int], int]

# Where stage ``s`` of a pipeline over ``p`` device groups sits: the group's index.
# loop: s mod p (interleaved 1F1B: rank r holds r, r + p, ...); v: down and back up
# (ZB-V: rank r holds r and 2p - 1 - r), zigzag for more than two chunks.
PLACEMENTS: Mapping[str, Callable[[int, int], int]] = MappingProxyType(
    {
        "loop": lambda s, p: s % p,
        "v": lambda s, p: s % p if (s // p) % 2 == 0 else p - 1 - s % p,
    }
)


def _repeat(order: Order, num_microbatches: int, iterations: int) -> Order:
    """The same order ``iterations`` times (with a flush between), microbatches renumbered."""
    if iterations == 1:
        return order
    return {
        rank: [(kind, s, k + i * num_microbatches) for i in range(iterations) for kind, s, k in ops]
        for rank, ops in order.items()
    }


def _flushed(one: Callable[[int, int], Order]) -> Generator:
    """A flushing generator over replicated stages: one schedule per pipeline replica
    (:mod:`planner.schedule.replicas`), iterations one after the other."""

    def order(p: int, num_microbatches: int, v: int, iterations: int, rounds: int) -> Order:
        n = round_count(num_microbatches, rounds)
        return _repeat(
            per_replica_order(one(p, n), rounds, num_microbatches), num_microbatches, iterations
        )

    return order


def _interleaved(p: int, num_microbatches: int, v: int, iterations: int, rounds: int) -> Order:
    n = round_count(num_microbatches, rounds)
    base = onef1b_order(p, n) if v == 1 else interleaved_order(p // v, v, n)
    return per_replica_order(base, rounds, num_microbatches)


def _stream(p: int, num_microbatches: int, v: int, iterations: int, rounds: int) -> Order:
    """2BW: the 1F1B order as one continuous stream of iterations. A warm-up deeper than an
    iteration would run the forwards of iteration i + 2 before iteration i's step made
    their weights (2BW keeps two versions), so it is capped at one iteration."""
    n = round_count(num_microbatches, rounds)
    warmup = [min(default_warmup(p, s), n) for s in range(p)]
    return per_replica_order(
        onef1b_order(p, n, warmup=warmup, iterations=iterations), rounds, num_microbatches
    )


def _held_all(p: int, s: int, num_microbatches: int, v: int, r: int, n: int) -> int:
    return num_microbatches  # GPipe stashes every microbatch


def _held_1f1b(p: int, s: int, num_microbatches: int, v: int, r: int, n: int) -> int:
    return min((p - s) * r, num_microbatches)


def _held_zb(p: int, s: int, num_microbatches: int, v: int, r: int, n: int) -> int:
    return min(p * r, num_microbatches)


def _held_interleaved(p: int, s: int, num_microbatches: int, v: int, r: int, n: int) -> int:
    # p: the devices, s: the device's rank; chunk-microbatches over all v chunks.
    if v == 1:
        return min((p - s) * r, num_microbatches)
    return min(2 * (p - s - 1) + (v - 1) * p + 1, n * v) * r


def _held_stream(p: int, s: int, num_microbatches: int, v: int, r: int, n: int) -> int:
    # No flush: the next iteration's microbatches keep the pipeline full; the warm-up is
    # capped at one iteration, so w + 1 consecutive rounds of the stream are held.
    held = min(p - s, n + 1)
    return held * r if held < n else num_microbatches + (held - n) * r


def _held_searched(p: int, s: int, num_microbatches: int, v: int, r: int, n: int) -> int:
    return min(p - s, num_microbatches)  # 1F1B's count, the depth the search starts from


@dataclass(frozen=True)
class Family:
    """What a named schedule implies for memory, bounds and execution, and how its order
    is made.

    Example::

        Family("gpipe", _flushed(gpipe_order), _held_all)
    """

    name: str
    generator: Generator | None = None  # None: searched by simulating (needs a profile)
    held: Held = _held_1f1b
    flush: bool = True  # False: consecutive iterations overlap (no flush between them)
    split_backward: bool = False  # I and W apart (a searched optimized order may be too)
    interleaved: bool = False  # several stages (chunks) per device
    placement: str = "loop"  # where chunks sit on the device groups: a PLACEMENTS key
    # Whether `solve --schedule auto` tries it, and its rank among those: on equal times
    # the lower (more conventional) one wins. None: only when asked for by name.
    auto: int | None = None

    @property
    def searched(self) -> bool:
        """Built by simulating candidates (needs a profile), not by a generator here."""
        return self.generator is None

    @property
    def weight_versions(self) -> int:
        """Weight versions a stage keeps: 2 without a flush, else 1."""
        return 1 if self.flush else 2

    @property
    def streams(self) -> bool:
        """Whether its iterations may run as one continuous stream (iteration ``i + 1``
        starting while ``i`` drains): generated, without a flush. A worker (and the
        simulator) then runs the generator's stream of many iterations rather than the
        plan's one iteration, step by step.

        Example::

            family("2bw").streams, family("1f1b").streams   # (True, False)
        """
        return not self.flush and not self.searched

    def order(
        self, replicas: Sequence[int], num_microbatches: int, virtual_stages: int, iterations: int
    ) -> Order:
        """The compute order per rank for stages with these replica counts (one per stage,
        chunks included); not validated (:func:`planner.schedule.build_schedule` does).

        Example::

            family("1f1b").order([1, 1], 4, 1, 1)[0]   # F0 F1 B0 F2 B1 F3 B2 B3 (stage 0)
        """
        if self.generator is None:
            raise InputError(
                f"the {self.name} schedule is searched by simulating; build it with "
                "planner.simulate.order_search.optimized_schedule",
                field="schedule",
            )
        p, m = len(replicas), num_microbatches
        rounds = self.usable_rounds(replica_round(replicas, m), m, virtual_stages, p)
        return self.generator(p, m, virtual_stages, iterations, rounds)

    def usable_rounds(
        self, rounds: int, num_microbatches: int, virtual_stages: int, num_stages: int
    ) -> int:
        """Microbatches per round this family's order uses, given
        :func:`~planner.schedule.replicas.replica_round`'s ``rounds`` for a pipeline of
        ``num_stages`` stages (interleaved: device groups times chunks). The interleaved
        order keeps rounds only where they divide ``M`` into a multiple of the device
        groups; a stream (2bw) only where an iteration has the ``p - 1`` rounds its
        deepest warm-up needs.

        Example::

            family("1f1b").usable_rounds(3, 8, 1, 3)   # 3: rounds of 3, 3 and 2
            family("2bw").usable_rounds(3, 4, 1, 4)    # 1: two rounds, a warm-up of three
        """
        m, v, p = num_microbatches, virtual_stages, num_stages
        if rounds <= 1:
            return 1
        if self.interleaved and (m % rounds or (v > 1 and (m // rounds) % (p // v))):
            return 1
        if not self.flush and round_count(m, rounds) < p - 1:
            return 1
        return rounds

    def in_flight_microbatches(
        self,
        num_stages: int,
        stage_index: int,
        num_microbatches: int,
        *,
        virtual_stages: int = 1,
        rounds: int = 1,
    ) -> int:
        """Microbatches whose activations a stage holds at its peak under this family,
        over all its replicas.

        For a family with several chunks per device (interleaved) ``num_stages`` is the
        number of devices ``p``, ``stage_index`` the device rank, and the count is
        chunk-microbatches over all ``v`` chunks of that device (each chunk's activations
        are ``1/v`` of the device's share). A searched family (optimized) returns 1F1B's
        count, the depth its search starts from. ``rounds``: microbatches per round where
        replicated stages run one schedule per replica
        (:func:`planner.schedule.replicas.replica_round`): each replica then holds what
        one pipeline over ``M / rounds`` microbatches holds (the last round of an
        iteration holds fewer where ``rounds`` does not divide ``M``).

        Example::

            family("1f1b").in_flight_microbatches(4, 0, 8)             # 4
            family("1f1b").in_flight_microbatches(4, 0, 8, rounds=2)   # 8: 4 on each of 2
        """
        p, m, v = num_stages, num_microbatches, virtual_stages
        r = self.usable_rounds(rounds if rounds <= m else 1, m, v, p * v)  # as order()'s
        return self.held(p, stage_index, m, v, r, round_count(m, r))

    def group_of(self, stage: int, num_groups: int) -> int:
        """The device group (pipeline rank) of ``stage`` under this family's placement.

        Example::

            [family("interleaved").group_of(s, 2) for s in range(4)]   # [0, 1, 0, 1]
        """
        return PLACEMENTS[self.placement](stage, num_groups)

    def virtual_stages_of(self, stages: Sequence[StageSpec], requested: int = 1) -> int:
        """The chunks per device group of this (interleaved) family's stages, checked
        against its placement (loop: stage s on the devices of stage s mod p; v: down and
        back up) and against ``requested`` (> 1: what the caller expects).

        Example::

            family("interleaved").virtual_stages_of(parse_stages("0:a;1:b;2:a;3:b"))   # 2
        """
        groups = device_groups(stages)
        p = len(groups)
        v = len(stages) // p
        placed = p * v == len(stages) and all(
            s.devices == groups[self.group_of(i, p)] for i, s in enumerate(stages)
        )
        if not placed and self.placement == "loop":
            raise InputError(
                f"the {self.name} schedule needs stage s on the same devices as stage s mod p "
                f"(p = {p} device groups, {len(stages)} stages); e.g. "
                "'0-1:gpu0;2-3:gpu1;4-5:gpu0;6-7:gpu1'",
                field="stages",
            )
        if not placed:
            example = ";".join(f"{s}:{d}" for s, d in enumerate(self.place(["gpu0", "gpu1"], 2)))
            raise InputError(
                f"the {self.name} schedule places stages {self.placement}-shaped: stage s of "
                f"p device groups on group s, then back from group p - 1 (p = {p} device "
                f"groups, {len(stages)} stages); e.g. '{example}'",
                field="stages",
            )
        if requested > 1 and requested != v:
            raise InputError(
                f"--virtual-stages {requested} does not match the partition: {len(stages)} "
                f"stages on {p} device groups give {v} virtual stages per device",
                field="virtual_stages",
            )
        return v

    def place(self, groups: Sequence[T], virtual_stages: int) -> list[T]:
        """Each of ``len(groups) * virtual_stages`` stages' device group, in stage order.

        Example::

            family("interleaved").place(["a", "b"], 2)   # ['a', 'b', 'a', 'b']
        """
        p = len(groups)
        return [groups[self.group_of(s, p)] for s in range(p * virtual_stages)]


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        f.name: f
        for f in (
            Family("gpipe", _flushed(gpipe_order), _held_all, auto=1),
            Family("1f1b", _flushed(onef1b_order), _held_1f1b, auto=0),
            Family("interleaved", _interleaved, _held_interleaved, interleaved=True, auto=3),
            Family("zb", _flushed(zb_order), _held_zb, split_backward=True, auto=2),
            Family("2bw", _stream, _held_stream, flush=False),
            Family("optimized", None, _held_searched),
        )
    }
)


def device_groups(stages: Sequence[StageSpec]) -> list[tuple[str, ...]]:
    """The pipeline ranks: distinct device lists in stage order.

    Example::

        device_groups(parse_stages("0-1:gpu0;2-3:gpu1;4-5:gpu0;6-7:gpu1"))  # 2 ranks
    """
    groups: list[tuple[str, ...]] = []
    for stage in stages:
        if stage.devices not in groups:
            groups.append(stage.devices)
    return groups


def family(name: str) -> Family:
    """The family called ``name``; one InputError naming the known ones otherwise.

    Example::

        family("1f1b").flush   # True
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise InputError(
            f"unknown schedule {name!r}; expected one of {', '.join(FAMILIES)}", field="schedule"
        ) from None


def is_interleaved(name: str) -> bool:
    """Whether ``name`` is a family that puts several stages on a device; False for a name
    outside the table (a hand-written schedule's).

    Example::

        is_interleaved("interleaved"), is_interleaved("1f1b"), is_interleaved("mine")
        # (True, False, False)
    """
    known = FAMILIES.get(name)
    return known is not None and known.interleaved
