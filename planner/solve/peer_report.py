"""The peers in a solve: each tuned over its sweep and the peer defaults, scored by the
search (:func:`peer_report`); their plans as seeds of the search (:func:`seeded_by_peers`);
and the plan's ``baselines`` rows (:func:`peer_rows`).

:func:`baseline_outcomes` and :func:`baseline_partitions` give the peer defaults'
partitions alone (:func:`planner.solve.peer_partitions.default_outcomes`).

Example::

    peers = peer_report(search, [(4, 8)], "auto")
    rows = peer_rows(peers, samples=32)
    for name, ranges, replicas in baseline_partitions(profile, topology, 4): ...
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.plan_parts import Baseline
from planner.profile.schema import Profile
from planner.schedule.families import family
from planner.shape import PlanShape
from planner.solve.local import local_budget, local_search
from planner.solve.mesh_local import mesh_moves
from planner.solve.options import INTERLEAVED_BASE
from planner.solve.peer_partitions import PeerPartitions, default_outcomes
from planner.solve.peers import PeerBest, tune_peers
from planner.solve.scored import Scored
from planner.solve.search import Search, TimeUp, make_shape

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "PeerReport",
    "baseline_outcomes",
    "baseline_partitions",
    "peer_report",
    "peer_rows",
    "seeded_by_peers",
]


def baseline_partitions(
    profile: Profile, topology: Topology, microbatch_size: int
) -> list[tuple[str, list[tuple[int, int]], list[int]]]:
    """``(name, ranges, replicas per stage)`` of every peer default, for ``min(layers,
    devices)`` stages (PipeDream chooses its own stages and replicas). Those whose own
    algorithm gives no partition here are left out; :func:`baseline_outcomes` says why.

    Example::

        for name, ranges, replicas in baseline_partitions(profile, topology, 4): ...
    """
    return [
        (name, ranges, replicas)
        for name, ranges, replicas, _ in baseline_outcomes(profile, topology, microbatch_size)
        if ranges
    ]


def baseline_outcomes(
    profile: Profile, topology: Topology, microbatch_size: int
) -> list[tuple[str, list[tuple[int, int]], list[int], str | None]]:
    """Every peer default as ``(name, ranges, replicas, reason)``
    (:func:`planner.solve.peer_partitions.default_outcomes`); ``ranges`` and ``replicas``
    are empty where ``reason`` says why there is no partition.

    Example::

        for name, ranges, replicas, reason in baseline_outcomes(profile, topology, 4): ...
    """
    out: list[tuple[str, list[tuple[int, int]], list[int], str | None]] = []
    for name, stages in default_outcomes(PeerPartitions(profile, topology), microbatch_size):
        if isinstance(stages, str):
            out.append((name, [], [], stages))
        else:
            out.append((name, [s.layers for s in stages], [len(s.devices) for s in stages], None))
    return out


def _default_shapes(
    search: Search, schedule: str, mb: int, num_microbatches: int, parts: PeerPartitions
) -> list[tuple[str, PlanShape | str]]:
    """The peer defaults' stages (one device per stage in device order, or PipeDream's
    replicas on consecutive devices) as shapes, recompute where memory needs it; a default
    whose algorithm fails comes back as the reason instead."""
    out: list[tuple[str, PlanShape | str]] = []
    for label, stages in default_outcomes(parts, mb):
        if isinstance(stages, str):
            out.append((label, stages))
            continue
        ranges, groups = [s.layers for s in stages], [s.devices for s in stages]
        out.append((label, make_shape(search, ranges, groups, schedule, mb, num_microbatches)))
    return out


@dataclass
class PeerReport:
    """The tuned peers (their best configurations) and the peer defaults, simulated."""

    tuned: list[PeerBest]
    defaults: dict[str, Scored]
    failed: dict[str, str]  # defaults whose own algorithm gives no partition


def peer_report(search: Search, settings: Sequence[tuple[int, int]], schedule: str) -> PeerReport:
    """Each peer tuned over its sweep (with the user's schedule where one is given), and the
    peer defaults: one stage per device in device order (PipeDream: its replicas), 1F1B or
    the requested schedule, recompute where memory needs it, the best microbatch size; all
    scored by ``search`` (a shape the search and a peer both propose is simulated once).

    Example::

        peer_report(search, [(4, 8)], "auto").tuned[0].peer
    """
    override = None if schedule == "auto" else (schedule,)
    parts = PeerPartitions(search.profile, search.topology)
    tuned = tune_peers(search, settings, schedules=override, parts=parts)
    interleaves = schedule == "auto" or family(schedule).interleaved
    base_sched = INTERLEAVED_BASE if interleaves else schedule
    defaults: dict[str, Scored] = {}
    failed: dict[str, str] = {}
    for mb, m in settings:
        for label, shape in _default_shapes(search, base_sched, mb, m, parts):
            if isinstance(shape, str):
                failed.setdefault(label, shape)
                continue
            try:
                got = search.evaluate(shape, f"peer default {label}")
            except TimeUp:
                failed.setdefault(label, "not simulated: the solve's time limit passed first")
                continue
            if label not in defaults or got.key() < defaults[label].key():
                defaults[label] = got
    return PeerReport(tuned, defaults, failed)


def seeded_by_peers(
    search: Search, peers: PeerReport, own: Sequence[Scored], schedules: Sequence[str]
) -> list[Scored]:
    """The peers' best plans as candidates (never worse than a configuration a peer's
    user would pick); where one beats the search's own, local search improves it (over
    tensor parallelism and sharding too where the seed has them).

    Example::

        final.extend(seeded_by_peers(search, peers, final, ["1f1b"]))
    """
    seeds = list(peers.defaults.values())
    for best in peers.tuned:
        if best.config is None or not best.feasible:
            continue
        seeds.append(search.evaluate(best.config.shape, f"peer {best.peer}"))
    seeds = [x for x in seeds if x.shape.schedule in schedules and x.fits]
    mine = [x for x in own if x.fits]
    if not seeds:
        return []
    top = min(seeds, key=Scored.key)
    if mine and min(mine, key=Scored.key).key()[:3] <= top.key()[:3]:
        return seeds
    search.methods.append("peer seed")
    budget = local_budget(search.options.local_search_evals, top)
    # A seed with tensor parallelism or sharding moves in those dimensions too.
    moves = None if all(s.is_plain for s in top.shape.stages) else mesh_moves
    return [*seeds, local_search(search, top, budget, moves=moves)]


def _tuned_row(best: PeerBest, samples: int) -> Baseline:
    """A tuned peer's row: its best configuration, or why it has none."""
    c = best.config
    if c is None or not best.feasible:
        return Baseline(
            best.peer,
            None,
            False,
            kind="tuned peer",
            reason=best.describe(),
            configurations=best.configurations,
            simulations=best.simulations,
        )
    return Baseline(
        best.peer,
        best.per_sample_ms * samples,
        True,
        kind="tuned peer",
        configuration=c.describe(),
        partition=c.partition,
        depth=c.depth,
        data_parallel=c.data_parallel,
        microbatch_size=c.shape.microbatch_size,
        num_microbatches=c.shape.num_microbatches,
        schedule=c.shape.schedule,
        virtual_stages=c.shape.virtual_stages,
        recompute=c.recompute,
        configurations=best.configurations,
        simulations=best.simulations,
        extra=_parallelism(c.shape),
    )


def _parallelism(shape: PlanShape) -> dict[str, Any]:
    """A tuned peer's tensor parallelism, sequence parallelism and sharding, for its row
    (nothing for a peer without them, so such rows are what they were)."""
    st = shape.stages[0]
    out: dict[str, Any] = {}
    if st.tensor_parallel > 1:
        out["tensor_parallel"] = st.tensor_parallel
    if st.sequence_parallel:
        out["sequence_parallel"] = True
    shardings = sorted({s.sharding for s in shape.stages} - {"none"})
    if shardings:
        out["sharding"] = "/".join(shardings)
    return out


def peer_rows(peers: PeerReport | None, samples: int) -> list[Baseline]:
    """The plan's ``baselines``: each tuned peer's best configuration, then the peer
    defaults; times scaled to the plan's samples per iteration (like for like).

    Example::

        [row.name for row in peer_rows(peers, 32)]
    """
    if peers is None:
        return []
    rows = [_tuned_row(best, samples) for best in peers.tuned]
    failed = {k: v for k, v in peers.failed.items() if k not in peers.defaults}
    for label in sorted([*peers.defaults, *failed]):
        name = f"{label} (peer default)"
        if label not in peers.defaults:
            # The peer's own algorithm gives no partition (e.g. torchgpipe on zero-time
            # layers): an infeasible row that says why, rather than a failed solve.
            rows.append(Baseline(name, None, False, kind="peer default", reason=failed[label]))
            continue
        b = peers.defaults[label]
        ms = b.per_sample_ms * samples if math.isfinite(b.iteration_ms) else None
        rows.append(Baseline(name, ms, b.fits, kind="peer default"))
    return rows
