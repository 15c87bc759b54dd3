"""Tensor-parallel groups the fabric favours, derived from the topology (never from names).

A tensor-parallel group issues collectives on every layer of every microbatch, so its
members must sit on the fastest links there are: on a DGX-1 the fully NVLinked quads, on
NVLink pairs the pairs, on two DGX nodes within a node. :func:`tp_groupings` proposes, for
one degree ``t``, a few partitions of the devices into groups of ``t``:

* **widest-link clustering**: within each *bandwidth island* (the devices of one host where
  the topology has several, else all of them), start from single devices and merge
  clusters pairwise until they hold ``t``, each round a maximum-weight matching
  (:func:`networkx.max_weight_matching`) on the narrowest link between two clusters (ties:
  the widest total), so a pair joins over its double NVLink before a single one, and two
  pairs form a quad where every member reaches every other on NVLink;
* **walks**: ``t`` consecutive devices of the file order and of the widest-link walks of
  :func:`planner.partition.mapping.candidate_paths` (what a rank order gives).

They are ranked by the slowest group's ring all-reduce of a typical collective, then the
total over all groups; the best ``limit`` of distinct speed are kept (a switch's many
symmetric pairings are one). Each group's members are
in the order of a widest-link walk inside the group (the ring's order), and the groups in
the order of a widest-link walk over groups (member ``i`` to member ``i``), so that
consecutive pipeline stages are neighbours. Leftover devices (``N`` not a multiple of ``t``)
are left out.

Example::

    groupings = tp_groupings(topology, 4, nbytes=2**20)
    groupings[0]   # (('gpu0', 'gpu1', 'gpu2', 'gpu3'), ('gpu4', 'gpu5', 'gpu6', 'gpu7'))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import networkx as nx

from planner.partition.mapping import candidate_paths

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["Grouping", "MATCHING_LIMIT", "order_groups", "tp_groupings"]

Grouping = tuple[tuple[str, ...], ...]
"""Groups of devices, in pipeline order, each in its ring's order."""

MATCHING_LIMIT = 64
"""Islands up to this many devices are clustered by matching (cubic in the devices);
larger ones only by walks."""

# Walks over devices or groups are quadratic in their number: beyond this, keep file order.
_WALK_LIMIT = 256


def tp_groupings(
    topology: Topology, degree: int, *, nbytes: float = 2.0**20, limit: int = 2
) -> list[Grouping]:
    """Up to ``limit`` partitions of the devices into groups of ``degree``, fastest first
    (see the module docstring); ``nbytes`` is the collective their rings are ranked by.

    Example::

        tp_groupings(load_topology("topologies/nvlink-pairs.yaml"), 2)[0][:2]
        # (('gpu0', 'gpu1'), ('gpu2', 'gpu3'))
    """
    names = topology.device_names()
    if degree < 1 or degree > len(names):
        return []
    # Walks first: where a clustering is no faster (a switch), the rank order wins the tie.
    paths = [names] if len(names) > _WALK_LIMIT else candidate_paths(topology)
    found = [
        [tuple(p[k : k + degree]) for k in range(0, len(p) - degree + 1, degree)] for p in paths
    ]
    clustered = _clustered(topology, degree)
    if clustered is not None:
        found.append(clustered)
    ranked: list[tuple[float, float, int, list[tuple[str, ...]]]] = []
    seen: set[frozenset[frozenset[str]]] = set()
    for i, groups in enumerate(found):
        key = frozenset(frozenset(g) for g in groups)
        if key in seen:
            continue
        seen.add(key)
        groups = [_ring_order(topology, g) for g in groups]
        times = [topology.allreduce_ms(list(g), nbytes) for g in groups] if degree > 1 else [0.0]
        ranked.append((max(times), sum(times), i, groups))
    ranked.sort(key=lambda x: (round(x[0], 9), round(x[1], 9), x[2]))
    kept: dict[tuple[float, float], list[tuple[str, ...]]] = {}
    for slowest, total, _, groups in ranked:
        # Groupings as fast as one kept already (a switch's symmetric pairings) add nothing.
        kept.setdefault((round(slowest, 9), round(total, 9)), groups)
    return [order_groups(topology, groups) for groups in list(kept.values())[:limit]]


def _islands(topology: Topology) -> list[list[str]]:
    """The devices of each host (where there are several hosts), else all devices."""
    hosts = topology.hosts()
    return list(hosts.values()) if len(hosts) > 1 else [topology.device_names()]


def _clustered(topology: Topology, degree: int) -> list[tuple[str, ...]] | None:
    """Widest-link clustering within each island, or None where the degree is not a power
    of two or an island cannot be cut into groups of ``degree`` (or is too big to match)."""
    if degree & (degree - 1):
        return None
    out: list[tuple[str, ...]] = []
    for island in _islands(topology):
        if len(island) % degree or len(island) > MATCHING_LIMIT:
            return None
        clusters: list[tuple[str, ...]] = [(d,) for d in island]
        while len(clusters[0]) < degree:
            clusters = _merge_pairs(topology, clusters)
        out.extend(clusters)
    return out


def _merge_pairs(topology: Topology, clusters: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Clusters merged two by two along a maximum-weight perfect matching: the weight of a
    pair is its narrowest cross link, then (a thousandth as much) its total bandwidth."""
    widest = 1.0
    pairs: dict[tuple[int, int], tuple[float, float]] = {}
    for i, a in enumerate(clusters):
        for j in range(i + 1, len(clusters)):
            bws = [topology.bandwidth(x, y) for x in a for y in clusters[j]]
            pairs[(i, j)] = (min(bws), sum(bws) / len(bws))
            widest = max(widest, max(bws))
    graph = nx.Graph()
    graph.add_nodes_from(range(len(clusters)))
    for (i, j), (narrow, mean) in pairs.items():
        graph.add_edge(i, j, weight=narrow / widest + 1e-3 * mean / widest)
    matching = nx.max_weight_matching(graph, maxcardinality=True)
    merged = sorted(
        (min(i, j), max(i, j)) for i, j in matching
    )  # deterministic: by the first cluster's place
    return [clusters[i] + clusters[j] for i, j in merged]


def _ring_order(topology: Topology, group: Sequence[str]) -> tuple[str, ...]:
    """``group`` in the order of a widest-link walk from its first device in file order."""
    if len(group) <= 2:
        return tuple(sorted(group, key=topology.device_index))
    left = sorted(group, key=topology.device_index)
    path = [left.pop(0)]
    while left:
        cur = path[-1]
        nxt = min(left, key=lambda n: (-topology.bandwidth(cur, n), topology.device_index(n)))
        path.append(nxt)
        left.remove(nxt)
    return tuple(path)


def order_groups(topology: Topology, groups: Sequence[tuple[str, ...]]) -> Grouping:
    """``groups`` in the order of a walk that always steps to the group whose member ``i``
    is best connected to member ``i`` of the current one (its narrowest such link, then
    file order), from the group holding the first device; file order beyond a few hundred
    groups.

    Example::

        order_groups(topology, [("gpu4", "gpu5"), ("gpu0", "gpu1")])   # gpu0's group first
    """
    left = sorted(groups, key=lambda g: min(topology.device_index(d) for d in g))
    if len(left) > _WALK_LIMIT or len(left) <= 2:
        return tuple(left)
    path = [left.pop(0)]
    while left:
        cur = path[-1]

        def link(g: tuple[str, ...], cur: tuple[str, ...] = cur) -> float:
            return min(
                (topology.bandwidth(a, b) for a, b in zip(cur, g, strict=True)), default=math.inf
            )

        nxt = min(left, key=lambda g: -link(g))
        path.append(nxt)
        left.remove(nxt)
    return tuple(path)
