"""The peers in a solve: each tuned over its sweep and the peer defaults, simulated through
the search's cache (:func:`peer_report`); their plans as seeds of the search
(:func:`seeded_by_peers`); and the plan's ``baselines`` rows (:func:`peer_rows`).

:func:`baseline_outcomes` and :func:`baseline_partitions` give the peer defaults'
partitions alone (:func:`planner.partition.peers.default_outcomes`).

Example::

    peers = peer_report(search, [(4, 8)], "auto")
    rows = peer_rows(peers, samples=32)
    for name, ranges, replicas in baseline_partitions(profile, topology, 4): ...
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.partition.peers import (
    PeerBest,
    PeerConfig,
    PeerJudge,
    default_outcomes,
    place_consecutively,
    tune_peers,
)
from planner.plan_parts import Baseline
from planner.profile.schema import Profile
from planner.schedule.families import family
from planner.shape import PlanShape
from planner.solve.local import local_budget, local_search
from planner.solve.options import INTERLEAVED_BASE
from planner.solve.scored import Scored
from planner.solve.search import Search, make_shape

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
    (:func:`planner.partition.peers.default_outcomes`).

    Example::

        for name, ranges, replicas, reason in baseline_outcomes(profile, topology, 4): ...
    """
    return default_outcomes(profile, topology, microbatch_size)


def _baseline_candidates(
    search: Search, schedule: str, mb: int, m: int, judge: PeerJudge
) -> list[tuple[str, PlanShape | str]]:
    """The baselines' partitions placed in device order (one device per stage, or
    PipeDream's replicas on consecutive devices); recompute where memory needs it. A
    baseline whose algorithm fails comes back as the reason instead of a candidate.
    (``judge``: the tuned peers', whose PipeDream stages the defaults reuse.)"""
    names = search.topology.device_names()
    out: list[tuple[str, PlanShape | str]] = []
    outcomes = default_outcomes(search.profile, search.topology, mb, judge=judge)
    for label, ranges, replicas, reason in outcomes:
        if reason is not None:
            out.append((label, reason))
            continue
        triples = [(a, b, r) for (a, b), r in zip(ranges, replicas, strict=True)]
        placed = place_consecutively(triples, names)
        if placed is None:
            continue
        groups = [s.devices for s in placed]
        out.append((label, make_shape(search, ranges, groups, schedule, mb, m)))
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
    the requested schedule, recompute where memory needs it, the best microbatch size.

    Example::

        peer_report(search, [(4, 8)], "auto").tuned[0].peer
    """
    override = None if schedule == "auto" else (schedule,)

    def simulate_peer(config: PeerConfig) -> tuple[float, bool]:
        # Through the search's own cache: a shape both simulate is simulated once.
        got = search.simulate_as_given(config.shape, f"peer {config.peer}")
        return got.iteration_ms, got.fits

    judge = PeerJudge(search.profile, search.topology, simulator=simulate_peer)
    tuned = tune_peers(search.profile, search.topology, settings, schedules=override, judge=judge)
    interleaves = schedule == "auto" or family(schedule).interleaved
    base_sched = INTERLEAVED_BASE if interleaves else schedule
    defaults: dict[str, Scored] = {}
    failed: dict[str, str] = {}
    for mb, m in settings:
        for label, cand in _baseline_candidates(search, base_sched, mb, m, judge):
            if isinstance(cand, str):
                failed.setdefault(label, cand)
                continue
            got = search.evaluate(cand, f"peer default {label}")
            if label not in defaults or got.key() < defaults[label].key():
                defaults[label] = got
    return PeerReport(tuned, defaults, failed)


def seeded_by_peers(
    search: Search, peers: PeerReport, own: Sequence[Scored], schedules: Sequence[str]
) -> list[Scored]:
    """The peers' best plans as candidates (never worse than a configuration a peer's
    user would pick); where one beats the search's own, local search improves it.

    Example::

        final.extend(seeded_by_peers(search, peers, final, ["1f1b"]))
    """
    seeds = list(peers.defaults.values())
    for best in peers.tuned:
        if best.best is None or not best.feasible:
            continue
        c = best.best.config
        seeds.append(search.evaluate(c.shape, f"peer {best.peer}"))
    seeds = [x for x in seeds if x.shape.schedule in schedules and x.fits]
    mine = [x for x in own if x.fits]
    if not seeds:
        return []
    top = min(seeds, key=Scored.key)
    if mine and min(mine, key=Scored.key).key()[:3] <= top.key()[:3]:
        return seeds
    search.methods.append("peer seed")
    budget = local_budget(search.options.local_search_evals, top)
    return [*seeds, local_search(search, top, budget)]


def _tuned_row(best: PeerBest, samples: int) -> Baseline:
    """A tuned peer's row: its best configuration, or why it has none."""
    if best.best is None or not best.feasible:
        return Baseline(
            best.peer,
            None,
            False,
            kind="tuned peer",
            reason=best.describe(),
            configurations=best.configurations,
            simulations=best.simulations,
        )
    c = best.best.config
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
    )


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
