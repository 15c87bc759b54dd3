"""The device orderings and checks the solver asks of a topology, answered without a table
of every device pair (planner/partition/mapping.py, planner/solve/peer_partitions.py),
against the all-pairs versions they replace (kept below as they were at commit e5f16c2):
the same walks, the same answers, on every bundled topology and on generated clusters.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from planner.partition.mapping import candidate_paths, uniform_network, widest_walk
from planner.solve.peer_partitions import pipedream_levels
from planner.topology import Topology, load_topology, topology_from_dict, uniform_topology
from planner.topology.cluster import cluster_dict

ROOT = Path(__file__).resolve().parents[1]


def _ref_uniform_network(topology: Topology) -> bool:
    names = topology.device_names()
    seen = {
        (topology.bandwidth(a, b), round(topology.latency_ms(a, b), 12))
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    }
    return len(seen) <= 1


def _ref_widest_walk(topology: Topology, start: str, *, prefer_speed: bool = False) -> list[str]:
    order = {name: i for i, name in enumerate(topology.device_names())}
    speed = {d.name: d.speed for d in topology.devices}
    path = [start]
    left = [n for n in topology.device_names() if n != start]
    while left:
        cur = path[-1]

        def key(n: str, cur: str = cur) -> tuple[float, ...]:
            bw = topology.bandwidth(cur, n)
            lat = topology.latency_ms(cur, n)
            if prefer_speed:
                return (-speed[n], -bw, lat, order[n])
            return (-bw, lat, -speed[n], order[n])

        nxt = min(left, key=key)
        path.append(nxt)
        left.remove(nxt)
    return path


def _ref_pipedream_levels(topology: Topology) -> list[tuple[int, float]]:
    hosts = list(topology.hosts().values())
    names = topology.device_names()

    def narrowest(pairs: list[tuple[str, str]]) -> float:
        return min((topology.bandwidth(a, b) for a, b in pairs), default=math.inf)

    if len(hosts) > 1 and len({len(h) for h in hosts}) == 1:
        inside = [(a, b) for h in hosts for a, b in itertools.combinations(h, 2)]
        across = [(h[0], g[0]) for h, g in itertools.combinations(hosts, 2)]
        levels = []
        if len(hosts[0]) > 1:
            levels.append((len(hosts[0]), narrowest(inside)))
        levels.append((len(hosts), narrowest(across)))
        return levels
    bw = narrowest(list(itertools.combinations(names, 2)))
    return [(len(names), bw if math.isfinite(bw) else 1e12)]


def _mixed_cluster() -> Topology:
    """Four DGX-A100-like nodes, the last two slower and with half the memory."""
    data = cluster_dict("dgx-a100", 4, network="rail")
    data["devices"][2]["speed"] = data["devices"][3]["speed"] = 0.5
    return topology_from_dict(data, "<mixed>")


def _switch_of_mixed_speeds() -> Topology:
    """Slow devices first on one switch: equal routes, so speed breaks the ties."""
    data = {
        "name": "mixed-switch",
        "devices": [
            {"name": "gpu{0..3}", "memory": "16 GiB", "speed": 0.5},
            {"name": "gpu{4..7}", "memory": "16 GiB"},
        ],
        "switches": ["sw"],
        "links": [{"between": ["gpu{0..7}", "sw"], "bandwidth": "25 GB/s"}],
    }
    return topology_from_dict(data, "<mixed-switch>")


TOPOLOGIES = [
    *((p.stem, lambda p=p: load_topology(p)) for p in sorted((ROOT / "topologies").glob("*.yaml"))),
    ("dgx-h100 x8 rail", lambda: topology_from_dict(cluster_dict("dgx-h100", 8), "<r>")),
    (
        "dgx-h100 x6 fat-tree",
        lambda: topology_from_dict(cluster_dict("dgx-h100", 6, network="fat-tree"), "<f>"),
    ),
    ("mixed speeds", _mixed_cluster),
    ("switch of mixed speeds", _switch_of_mixed_speeds),
    ("one switch", lambda: uniform_topology(24)),
]


@pytest.mark.parametrize("make", [t[1] for t in TOPOLOGIES], ids=[t[0] for t in TOPOLOGIES])
def test_walks_and_checks_are_those_of_every_pair(make: object) -> None:
    topo = make()  # type: ignore[operator]
    assert uniform_network(topo) == _ref_uniform_network(topo)
    assert pipedream_levels(topo) == _ref_pipedream_levels(topo)
    for start in topo.device_names()[:: max(1, len(topo.devices) // 5)]:
        for fast in (False, True):
            assert widest_walk(topo, start, prefer_speed=fast) == _ref_widest_walk(
                topo, start, prefer_speed=fast
            )
    assert candidate_paths(topo)[0] == topo.device_names()
