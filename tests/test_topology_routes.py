"""Routes on demand (planner/topology/routes.py) against the all-pairs tables they replace.

The reference below is the route table pipeplan built when a topology loaded, before routes
became lazy (planner/topology/graph.py's ``_build_table`` and routing.py's three functions
at commit e5f16c2), kept here verbatim apart from names. Every ordered device pair of every
bundled topology, of generated clusters of a few hundred devices and of random graphs full
of ties must get the same route, bottleneck, latency, hop count and transfer time, bit for
bit, in an order that exercises resumed searches and both directions.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
import yaml

from planner.topology import Device, Topology, load_topology, topology_from_dict
from planner.topology.cluster import cluster_dict, cluster_yaml

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted((ROOT / "topologies").glob("*.yaml"))


# ------------------------------------------------------------------ the reference (e5f16c2)


def _ref_all_pairs_bottleneck(graph: nx.Graph, rank: dict[str, int], n: int) -> np.ndarray:
    out = np.zeros((n, n), dtype=np.float64)
    np.fill_diagonal(out, math.inf)
    parent = list(range(len(rank)))
    members: list[list[int]] = [[i] if i < n else [] for i in range(len(rank))]

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    edges = sorted(
        ((float(d["bandwidth"]), rank[u], rank[v]) for u, v, d in graph.edges(data=True)),
        key=lambda e: -e[0],
    )
    for width, u, v in edges:
        ru, rv = find(u), find(v)
        if ru == rv:
            continue
        a, b = members[ru], members[rv]
        if a and b:
            out[np.ix_(a, b)] = width
            out[np.ix_(b, a)] = width
        if len(a) < len(b):
            ru, rv, a, b = rv, ru, b, a
        parent[rv] = ru
        a.extend(b)
        members[rv] = []
    return out


def _ref_widest_from(adj: list[list[tuple[int, float, float]]], source: int, n: int) -> np.ndarray:
    best = [0.0] * len(adj)
    best[source] = math.inf
    heap = [(-math.inf, source)]
    done = [False] * len(adj)
    while heap:
        neg, u = heapq.heappop(heap)
        if done[u]:
            continue
        done[u] = True
        if u < n and u != source:
            continue
        for v, bw, _ in adj[u]:
            width = min(-neg, bw)
            if width > best[v]:
                best[v] = width
                heapq.heappush(heap, (-width, v))
    return np.asarray(best[:n], dtype=np.float64)


def _ref_fewest_hops(
    adj: list[list[tuple[int, float, float]]],
    source: int,
    width: float,
    targets: list[int],
    endpoints_below: int | None = None,
) -> tuple[list[int], list[int], list[float]]:
    size = len(adj)
    parent = [-1] * size
    hops = [0] * size
    lat = [0.0] * size
    parent[source] = source
    wanted = set(targets)
    queue = [source]
    head = 0
    while head < len(queue) and wanted:
        u = queue[head]
        head += 1
        if endpoints_below is not None and u < endpoints_below and u != source:
            continue
        for v, bw, link_lat in adj[u]:
            if bw < width or parent[v] != -1:
                continue
            parent[v] = u
            hops[v] = hops[u] + 1
            lat[v] = lat[u] + link_lat
            queue.append(v)
            wanted.discard(v)
    return parent, hops, lat


class Reference:
    """The all-pairs table as ``Topology.__init__`` built it at e5f16c2."""

    def __init__(self, topo: Topology) -> None:
        names = topo.device_names()
        n = len(names)
        nodes = names + [x for x in topo.graph.nodes if x not in set(names)]
        rank = {x: i for i, x in enumerate(nodes)}
        adj: list[list[tuple[int, float, float]]] = [[] for _ in nodes]
        for u, v, data in topo.graph.edges(data=True):
            a, b = rank[u], rank[v]
            adj[a].append((b, float(data["bandwidth"]), float(data["latency_ms"])))
            adj[b].append((a, float(data["bandwidth"]), float(data["latency_ms"])))
        for row in adj:
            row.sort()
        relay_devices = topo.relay == "all"
        if relay_devices:
            bottleneck = _ref_all_pairs_bottleneck(topo.graph, rank, n)
        else:
            bottleneck = np.vstack([_ref_widest_from(adj, s, n) for s in range(n)])
        hops = np.zeros((n, n), dtype=np.int32)
        latency = np.zeros((n, n), dtype=np.float64)
        trees: list[dict[float, np.ndarray]] = [{} for _ in range(n)]
        for s in range(n - 1):
            widths = bottleneck[s, s + 1 :]
            for width in np.unique(widths):
                targets = (np.nonzero(widths == width)[0] + s + 1).tolist()
                parent, hop, lat = _ref_fewest_hops(
                    adj, s, float(width), targets, None if relay_devices else n
                )
                trees[s][float(width)] = np.asarray(parent, dtype=np.int32)
                for t in targets:
                    hops[s, t] = hops[t, s] = hop[t]
                    latency[s, t] = latency[t, s] = lat[t]
        self.nodes, self.bottleneck, self.hops, self.latency = nodes, bottleneck, hops, latency
        self.bw_rows: list[list[float]] = bottleneck.tolist()
        self.lat_rows: list[list[float]] = latency.tolist()
        self.trees = trees

    def route(self, i: int, j: int) -> list[str]:
        if i == j:
            return [self.nodes[i]]
        s, t = min(i, j), max(i, j)
        parent = self.trees[s][self.bw_rows[s][t]]
        path = [t]
        while path[-1] != s:
            path.append(int(parent[path[-1]]))
        names = [self.nodes[k] for k in path]
        return names if i > j else names[::-1]

    def transfer_ms(self, i: int, j: int, nbytes: float) -> float:
        if i == j:
            return 0.0
        return self.lat_rows[i][j] + nbytes / self.bw_rows[i][j] * 1e3


# ------------------------------------------------------------------ the topologies


def _cluster(preset: str, nodes: int, network: str) -> Topology:
    data = cluster_dict(preset, nodes, network=network)
    return topology_from_dict(yaml.safe_load(cluster_yaml(data, preset)), f"<{preset}>")


def _leaf_spine(gpus: int) -> Topology:
    """bench/topology_table.py's 2:1 oversubscribed leaf-spine: three bandwidth levels."""
    leaves = gpus // 32
    data: dict[str, Any] = {
        "name": "leaf-spine",
        "hosts": {
            "count": gpus // 8,
            "devices": {"count": 8, "memory": "80 GiB"},
            "switch": {"name": "nvswitch", "bandwidth": "450 GB/s", "latency": "1 us"},
        },
        "switches": [f"leaf{{0..{leaves - 1}}}", "spine"],
        "links": [
            {"between": [f"gpu{{{32 * k}..{32 * k + 31}}}", f"leaf{k}"], "bandwidth": "50 GB/s"}
            for k in range(leaves)
        ]
        + [{"between": [f"leaf{{0..{leaves - 1}}}", "spine"], "bandwidth": "50 GB/s", "count": 16}],
    }
    return topology_from_dict(data, "<leaf-spine>")


def _random(seed: int, relay: str) -> Topology:
    """A connected random graph with few bandwidths and latencies: ties everywhere."""
    rng = random.Random(seed)
    n_dev, n_sw = rng.randint(12, 40), rng.randint(1, 8)
    devices = [f"d{i}" for i in range(n_dev)]
    nodes = devices + [f"s{i}" for i in range(n_sw)]
    rng.shuffle(nodes)
    g = nx.Graph()
    g.add_nodes_from(nodes)

    def link() -> dict[str, float]:
        return {
            "bandwidth": rng.choice([1e9, 2e9, 5e9, 25e9]),
            "latency_ms": rng.choice([0.0, 0.001, 0.0025, 0.003]),
        }

    for k in range(1, len(nodes)):
        g.add_edge(nodes[k], nodes[rng.randrange(k)], **link())
    for _ in range(len(nodes) * 2):
        u, v = rng.sample(nodes, 2)
        g.add_edge(u, v, **link())
    if relay == "switches":  # every device on s0 as well, so no pair needs a relaying device
        for d in devices:
            g.add_edge(d, "s0", **link())
    return Topology(f"random-{seed}", g, [Device(d, 2**30) for d in devices], relay=relay)


CASES: list[tuple[str, Any]] = [
    *((p.stem, lambda p=p: load_topology(p)) for p in BUNDLED),
    ("dgx-h100 x32 rail", lambda: _cluster("dgx-h100", 32, "rail")),
    ("dgx-a100 x24 fat-tree", lambda: _cluster("dgx-a100", 24, "fat-tree")),
    ("leaf-spine 256", lambda: _leaf_spine(256)),
    *(
        (f"random {s} {r}", lambda s=s, r=r: _random(s, r))
        for s in range(6)
        for r in ("all", "switches")
    ),
]


@pytest.mark.parametrize("make", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_every_pair_is_what_the_all_pairs_table_said(make: Any) -> None:
    topo = make()
    ref = Reference(topo)
    names = topo.device_names()
    n = len(names)
    rng = random.Random(n)
    pairs = list(itertools.product(range(n), repeat=2))
    rng.shuffle(pairs)  # sources and widths interleaved: searches are resumed and shared
    for i, j in pairs:
        a, b = names[i], names[j]
        # Some pairs are first asked for their transfer time, others for their route.
        if (i + j) % 2:
            assert topo.transfer_ms(a, b, 12345.0) == ref.transfer_ms(i, j, 12345.0)
            assert topo.route(a, b) == ref.route(i, j)
        else:
            assert topo.route(a, b) == ref.route(i, j)
            assert topo.transfer_ms(a, b, 12345.0) == ref.transfer_ms(i, j, 12345.0)
        assert topo.bandwidth(a, b) == ref.bottleneck[i, j]
        assert topo.latency_ms(a, b) == ref.latency[i, j]
        assert topo.hops(a, b) == ref.hops[i, j]
    fresh = make()  # bandwidths asked before any route: the tree, not the cached answers
    assert all(fresh.bandwidth(names[i], names[j]) == ref.bottleneck[i, j] for i, j in pairs)
    rows = make()  # a whole row at once, as walks over the devices ask for it
    assert all(rows.bandwidths_from(names[i]) == ref.bw_rows[i] for i in range(n))
    assert np.array_equal(topo.bandwidth_matrix(), ref.bottleneck)
    assert np.array_equal(make().latency_matrix(), ref.latency)
    off = ref.bottleneck[~np.eye(n, dtype=bool)]
    expected = (float(off.min()), float(off.max())) if off.size else None
    assert fresh.bandwidth_range() == expected


@pytest.mark.parametrize(
    "make",
    [CASES[i][1] for i in (1, 3, 6, 9, 11, 12)],
    ids=[CASES[i][0] for i in (1, 3, 6, 9, 11, 12)],
)
def test_caches_emptied_when_full_give_the_same_answers(make: Any) -> None:
    topo = make()
    ref = Reference(topo)
    routes = topo._routes  # bounded caches, shrunk so that they fill and empty constantly
    routes._max_pairs, routes._max_searches, routes._max_rows = 3, 1, 1
    routes._max_nodes = 1
    names = topo.device_names()
    pairs = list(itertools.product(range(len(names)), repeat=2))
    random.Random(1).shuffle(pairs)
    for i, j in pairs:
        assert topo.route(names[i], names[j]) == ref.route(i, j)
        assert topo.transfer_ms(names[i], names[j], 1e6) == ref.transfer_ms(i, j, 1e6)
    assert len(routes.known) <= 4 and len(routes._searches) <= 1 and len(routes._rows) <= 1


def test_a_cluster_of_16384_gpus_loads_without_a_table_of_pairs() -> None:
    topo = _cluster("dgx-h100", 2048, "rail")
    names = topo.device_names()
    assert len(names) == 16384
    assert topo._routes.known == {} and topo._routes._searches == {}
    assert topo.route(names[0], names[-8]) == [names[0], "rail0", names[-8]]
    assert topo.route(names[3], names[-1]) == [names[3], "nvswitch0", names[7], "rail7", names[-1]]
    assert topo.bandwidth_range() == (50e9, 450e9)
    assert len(topo._routes.known) == 4  # two pairs, both directions: nothing else


@pytest.mark.parametrize("make", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_narrowest_bandwidth_is_the_smallest_over_every_pair(make: Any) -> None:
    topo = make()
    ref = Reference(topo)
    names = topo.device_names()
    rng = random.Random(len(names))
    for size in (0, 1, 2, 3, 8, len(names)):
        chosen = rng.sample(range(len(names)), min(size, len(names)))
        pairs = list(itertools.combinations(chosen, 2))
        expected = min((ref.bottleneck[i, j] for i, j in pairs), default=math.inf)
        assert topo.narrowest_bandwidth([names[i] for i in chosen]) == expected
