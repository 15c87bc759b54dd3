"""Identical data-parallel replicas simulated once: the same numbers, a ``r``-th of the work.

A plan whose every stage has ``r`` replicas runs ``r`` pipelines that meet only at their
stages' all-reduces (microbatch ``k`` on replica ``k % r`` of every stage). Where the
replicas are *identical* -- each device's program is replica 0's counterpart's with the
microbatches shifted, the same durations and memory, and each replica's transfers on links
of its own with the same latencies and wire times -- every replica's run is replica 0's,
float for float: the engine's times follow from the dataflow (sums and maxima of the same
numbers), an all-reduce starts at the latest of equal arrivals, and a link that only one
replica uses serves its transfers in the order of their ready times in the reference run
(equal for every replica). So replica 0 alone is run (its all-reduces meet at once), and
every other device takes its counterpart's memory peak and busy time.

The one thing the full run could order otherwise is a tie: two transfers from different
devices that are ready at the same time on one link are served in the order their sends
ran in the reference run. Replica 0's devices run in the same order there with or
without the others (a device wakes only devices of its own replica, and the runnable
stack keeps their order) unless a device waits at an all-reduce for another replica and
sends after it (``Fold.late_sends``: interleaved chunks, 2bw streams). Up to the point
where a device first reaches an all-reduce, replica 0's devices run in the same order in
both runs, so only a tie of two sends after that point can be ordered otherwise
(:func:`has_cross_ties`). Where the folded run's queues hold such a tie, the caller runs
the reference run of every replica (free communication: cheaper than the timed run) for
the order of replica 0's sends, and still times replica 0 alone over those queues: every
link's order is then the full run's, and the timed run follows from the queues and the
dataflow alone.

:func:`fold_programs` works on the compiled programs alone (once per compiled shape);
:func:`symmetric` checks the tables and the links of one simulation.

Example::

    fold = fold_programs(shape.programs, run_stages, tables.devices)
    if fold is not None and symmetric(fold, tables, topology):
        programs = fold.programs   # replica 0's, sends renumbered to its devices
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.simulate.links import LinkQueues, route_of_way, send_ways
from planner.simulate.program import ALLREDUCE, Program
from planner.stages import StageSpec

if TYPE_CHECKING:
    from planner.simulate.tables import StageTables
    from planner.topology import Topology

__all__ = ["Fold", "fold_programs", "has_cross_ties", "symmetric"]


@dataclass
class Fold:
    """Replica 0 of a plan with identical replicas: ``kept`` (indices into the devices, in
    their order), ``base[i]`` the position in ``kept`` of device ``i``'s counterpart,
    ``shift[i]`` device ``i``'s replica, ``programs`` replica 0's (``dst`` renumbered to
    positions in ``kept``), ``replicas`` per stage; ``checked`` remembers
    :func:`symmetric`'s link checks by topology, devices and cut.

    Example::

        fold.kept, fold.base[5], fold.programs[0][0]
    """

    kept: tuple[int, ...]
    base: tuple[int, ...]
    shift: tuple[int, ...]
    programs: list[Program]
    replicas: int
    # Whether a program sends after an all-reduce (interleaved chunks, 2bw streams): then
    # the full run's order of sends may differ in ties (see has_cross_ties).
    late_sends: bool = True
    # The compiled form of ``programs`` (planner.simulate.shapes.CompiledShape), once made.
    compiled: Any = None
    checked: dict[tuple[Any, ...], tuple[Any, bool]] = field(default_factory=dict)

    def spread(self, values: Sequence[Any]) -> list[Any]:
        """Per device (all of them, in order) its counterpart's entry of ``values`` (one per
        kept device).

        Example::

            fold.spread([10, 20])   # [10, 20, 10, 20] for two replicas of two devices
        """
        return [values[b] for b in self.base]


def _replica_of(stages: Sequence[StageSpec], devices: list[str]) -> tuple[list[int], list[int]]:
    """Per device its replica and its counterpart in replica 0 (indices into
    ``devices``); ``([], [])`` where a device sits at two replica positions or its
    counterpart differs between its stages."""
    index = {d: i for i, d in enumerate(devices)}
    rep = [-1] * len(devices)
    base = [-1] * len(devices)
    for st in stages:
        for j, d in enumerate(st.devices):
            i, b = index[d], index[st.devices[0]]
            if rep[i] not in (-1, j) or base[i] not in (-1, b):
                return [], []
            rep[i], base[i] = j, b
    if -1 in rep:
        return [], []
    return rep, base


def _shifted(prog: Program, j: int, mapped: dict[int, int]) -> Program:
    """``prog`` (of replica 0) as replica ``j`` runs it: microbatches and keys shifted by
    ``j``, sends to the counterparts (``mapped``: replica 0's index to replica ``j``'s)."""
    return [
        (
            code,
            s,
            k + j if k >= 0 else k,
            slot,
            rkey + 2 * j if rkey >= 0 else rkey,
            skey + 2 * j if skey >= 0 else skey,
            mapped.get(dst, -2) if dst >= 0 else dst,
        )
        for code, s, k, slot, rkey, skey, dst in prog
    ]


def fold_programs(
    programs: list[Program], stages: Sequence[StageSpec], devices: list[str]
) -> Fold | None:
    """Replica 0's part of ``programs`` (of ``stages``, run on ``devices``), or None where
    the stages' replica counts differ, are 1, or some replica's program is not replica
    0's with its microbatches shifted (see the module docstring).

    Example::

        fold_programs(shape.programs, leader_stages(stages), tables.devices)
    """
    counts = {len(st.devices) for st in stages}
    if len(counts) != 1 or min(counts) < 2:
        return None
    rep, base = _replica_of(stages, devices)
    if not rep:
        return None
    kept = tuple(i for i, j in enumerate(rep) if j == 0)
    position = {i: p for p, i in enumerate(kept)}
    # Replica j's counterparts: replica 0's device index to replica j's.
    maps: dict[int, dict[int, int]] = {}
    for i, j in enumerate(rep):
        maps.setdefault(j, {})[base[i]] = i
    for i, j in enumerate(rep):
        if j and programs[i] != _shifted(programs[base[i]], j, maps[j]):
            return None
    folded: list[Program] = []
    for i in kept:
        prog = programs[i]
        if any(e[6] >= 0 and e[6] not in position for e in prog):
            return None
        folded.append([(*e[:6], position[e[6]] if e[6] >= 0 else e[6]) for e in prog])
    return Fold(
        kept,
        tuple(position[b] for b in base),
        tuple(rep),
        folded,
        next(iter(counts)),
        any(_sends_after_allreduce(prog) for prog in folded),
    )


def _sends_after_allreduce(prog: Program) -> bool:
    """Whether an entry of ``prog`` sends after its first ALLREDUCE."""
    met = False
    for e in prog:
        if e[0] == ALLREDUCE:
            met = True
        elif met and e[5] >= 0:
            return True
    return False


def _same_tables(fold: Fold, tables: StageTables, topology: Topology | None) -> bool:
    """Whether every device's durations, static memory and speed are its counterpart's."""
    devices = tables.devices
    for i, b in enumerate(fold.base):
        k = fold.kept[b]
        if i == k:
            continue
        d, c = devices[i], devices[k]
        if tables.durations[i] != tables.durations[k] or tables.static[d] != tables.static[c]:
            return False
        if topology is not None and topology.device(d).speed != topology.device(c).speed:
            return False
    for (i, slot), ms in tables.reference.items():
        if tables.reference.get((fold.kept[fold.base[i]], slot)) != ms:
            return False
    return True


def _same_links(
    fold: Fold, tables: StageTables, topology: Topology, programs: list[Program], total_mb: int
) -> bool:
    """Whether each replica's sends take routes of their own (no link shared between
    replicas) with the latencies, wire times and bytes of replica 0's."""
    stages = len(tables.replicas)
    num_keys = 2 * stages * total_mb
    ways = send_ways(programs, num_keys, total_mb, stages)
    link_ids: dict[tuple[str, str], int] = {}
    owner: dict[int, int] = {}  # link id -> the replica using it
    firsts: dict[tuple[int, int, int], tuple[float, float, int]] = {}
    cuts = stages + 1
    for way in sorted(set(ways) - {-1}):
        route = route_of_way(topology, tables.devices, tables.cut, way, link_ids, tables.groups)
        ids, lat, wire, src, dst, nbytes = route
        j = fold.shift[src]
        if fold.shift[dst] != j:
            return False
        if any(owner.setdefault(link, j) != j for link in ids):
            return False
        pair = (fold.base[src], fold.base[dst], way % cuts)
        if firsts.setdefault(pair, (lat, wire, nbytes)) != (lat, wire, nbytes):
            return False
    return True


def symmetric(
    fold: Fold,
    tables: StageTables,
    topology: Topology | None,
    programs: list[Program],
    total_mb: int,
) -> bool:
    """Whether ``tables`` (and ``topology``'s links, for the full ``programs``) make every
    replica identical to replica 0 (see the module docstring); the link check is
    remembered per topology and cut.

    Example::

        symmetric(fold, tables, topology, shape.programs, 8)
    """
    if not _same_tables(fold, tables, topology):
        return False
    if topology is None:
        return True
    # The devices too: one compiled shape serves every device list of its pattern.
    key = (
        id(topology),
        tuple(tables.devices),
        tuple(tables.cut),
        tuple(sorted(tables.groups.items())),
        getattr(tables.groups, "reshard", None),
    )
    hit = fold.checked.get(key)
    if hit is not None and hit[0] is topology:
        return hit[1]
    ok = _same_links(fold, tables, topology, programs, total_mb)
    fold.checked[key] = (topology, ok)
    return ok


def has_cross_ties(
    links: LinkQueues, ready: list[float], late: Sequence[int] | None = None
) -> bool:
    """Whether a link queue holds two transfers from different devices ready at the same
    time (their order could follow the other replicas; see the module docstring); with
    ``late`` (per key: whether its send ran after a device first reached an all-reduce in
    the reference run), only a tie of two late sends counts: up to that point replica 0's
    devices run in the same order with or without the other replicas, so a send before it
    precedes every later one in both runs.

    Example::

        has_cross_ties(link_queues(...), ref.arrival)   # False for most plans
    """
    route_of = links.route_of
    for queue in links.queues:
        for a, b in zip(queue, queue[1:-1], strict=False):
            tie = ready[a] == ready[b] and route_of[a][3] != route_of[b][3]
            if tie and (late is None or (late[a] and late[b])):
                return True
    return False
