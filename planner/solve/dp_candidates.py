"""Candidates from the exact chain DP (:mod:`planner.partition.dp`): for every device path,
uniform replication degree and number of stages worth trying, the DP's best partition,
ranked by its estimated iteration time.

On identical slots and links one backward DP answers every number of stages
(:func:`planner.partition.dp.partition_chain_depths`); otherwise one DP runs per number of
stages, at most :data:`planner.solve.options.MAX_FRONT_DPS` of them.

Example::

    costs = layer_costs(profile, 4)
    best = dp_candidates(search, costs, [topology.device_names()], "1f1b", 8)[0]
    best.ranges, best.groups, best.estimate
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from planner.partition.dp import (
    ChainPartition,
    LayerCosts,
    Linear,
    Slot,
    partition_chain,
    partition_chain_depths,
)
from planner.partition.mapping import links_between, slots_along
from planner.schedule.replicas import replica_round
from planner.solve.memory import in_flight, weight_versions
from planner.solve.options import MAX_FRONT_DPS
from planner.solve.search import Search

__all__ = ["DpCand", "dp_candidates"]


def _stage_counts(max_stages: int, num_layers: int) -> list[int]:
    """Numbers of stages worth trying: all up to 8, then powers of two and the maximum."""
    top = min(max_stages, num_layers)
    counts = set(range(1, min(top, 8) + 1))
    p = 16
    while p < top:
        counts.add(p)
        p *= 2
    counts.add(top)
    for extra in (top * 3 // 4, top // 2 + 1):
        if extra >= 1:
            counts.add(extra)
    return sorted(counts)


def _replication_degrees(num_devices: int) -> list[int]:
    """The divisors of ``num_devices``, and 2, 3 and 4 where there are that many."""
    degrees = {r for r in range(1, num_devices + 1) if num_devices % r == 0}
    degrees |= {r for r in (2, 3, 4) if r <= num_devices}
    return sorted(degrees)


@dataclass(frozen=True)
class DpCand:
    """A DP partition over device groups, with the DP's estimate of its iteration time."""

    estimate: float
    ranges: tuple[tuple[int, int], ...]
    groups: tuple[tuple[str, ...], ...]
    recompute: tuple[bool, ...]


def _depth_only(
    schedule: str, top: int, num_microbatches: int, rounds: int = 1
) -> list[int] | None:
    """The in-flight count by distance from the last stage, if that is all it depends on."""
    from_end = [
        in_flight(schedule, top, top - 1 - q, num_microbatches, rounds=rounds) for q in range(top)
    ]
    for s in range(1, top):
        if any(
            in_flight(schedule, s, s - 1 - q, num_microbatches, rounds=rounds) != from_end[q]
            for q in range(s)
        ):
            return None
    return from_end


def _dp_partitions(
    costs: LayerCosts,
    slots: Sequence[Slot],
    links: Sequence[Linear],
    schedule: str,
    num_microbatches: int,
) -> Iterator[tuple[int, ChainPartition]]:
    """The DP's best partition for each number of stages worth trying on these slots."""
    n = costs.num_layers
    counts = _stage_counts(len(slots), n)
    wv = weight_versions(schedule)
    kind = [(sl.speed, sl.memory_bytes, sl.replicas, sl.allreduce) for sl in slots]
    same = all(k == kind[0] for k in kind) and all(lk == links[0] for lk in links)
    rounds = replica_round([sl.replicas for sl in slots], num_microbatches)
    from_end = _depth_only(schedule, min(len(slots), n), num_microbatches, rounds) if same else None
    if from_end is not None:
        # Identical slots and links: one backward DP answers every number of stages.
        parts = partition_chain_depths(
            costs,
            slots[0],
            max_stages=len(from_end),
            in_flight_from_end=from_end,
            num_microbatches=num_microbatches,
            link=links[0] if links else None,
            weight_versions=wv,
        )
        for s in counts:
            got = parts[s - 1]
            if got is not None:
                yield s, got
        return
    # One DP per number of stages costs O(S * L^2): on long paths try fewer, spread out.
    limit = MAX_FRONT_DPS if len(slots) <= 16 else 3
    if len(counts) > limit:
        step = len(counts) / limit
        counts = sorted({counts[int(i * step)] for i in range(limit)} | {counts[-1]})
    for s in counts:
        stashed = [in_flight(schedule, s, k, num_microbatches, rounds=rounds) for k in range(s)]
        part = partition_chain(
            costs,
            slots[:s],
            in_flight=stashed,
            num_microbatches=num_microbatches,
            links=links[: s - 1],
            weight_versions=wv,
        )
        if part is not None:
            yield s, part


def dp_candidates(
    search: Search,
    costs: LayerCosts,
    paths: Sequence[Sequence[str]],
    schedule: str,
    num_microbatches: int,
) -> list[DpCand]:
    """DP partitions over every candidate device path and replication degree, best
    estimated iteration time first.

    Example::

        dp_candidates(search, layer_costs(profile, 4), [["gpu0", "gpu1"]], "1f1b", 8)
    """
    topo = search.topology
    found: dict[tuple[Any, ...], DpCand] = {}
    for path in paths:
        for r in _replication_degrees(len(path)):
            if r > num_microbatches:
                continue
            all_slots = slots_along(topo, path, replicas=r)
            if not all_slots:
                continue
            all_links = links_between(topo, all_slots)
            for s, part in _dp_partitions(costs, all_slots, all_links, schedule, num_microbatches):
                # Steady state at the bottleneck plus one pass of fill and drain; each
                # replica sees m / r microbatches of r times the per-slot cost.
                est = (num_microbatches - r) * part.bottleneck_ms + r * sum(part.stage_ms)
                groups = tuple(sl.devices for sl in all_slots[:s])
                key = (tuple(part.ranges), groups)
                cand = DpCand(est, tuple(part.ranges), groups, tuple(part.recompute))
                if key not in found or found[key].estimate > est:
                    found[key] = cand
    return sorted(found.values(), key=lambda c: (c.estimate, c.ranges, c.groups))
