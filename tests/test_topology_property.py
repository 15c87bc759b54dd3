"""Property-based checks of the routing rules on random graphs (hypothesis).

The expectations are computed independently with networkx: the best possible bottleneck is the
largest link bandwidth ``w`` for which the two devices are connected using only links of at
least ``w``; the fewest hops among such routes is a shortest path in that subgraph.
"""

from __future__ import annotations

import itertools
from typing import Any

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.topology import Device, Topology

BANDWIDTHS = [1e9, 2e9, 5e9, 10e9, 25e9]  # few values, so ties are common
LATENCIES = [0.0, 0.001, 0.002]


@st.composite
def graphs(draw: Any) -> tuple[nx.Graph, list[Device], str]:
    n_dev = draw(st.integers(2, 6))
    n_sw = draw(st.integers(0, 3))
    nodes = [f"d{i}" for i in range(n_dev)] + [f"s{i}" for i in range(n_sw)]
    g = nx.Graph()
    g.add_nodes_from(nodes)

    def link() -> dict[str, float]:
        return {
            "bandwidth": draw(st.sampled_from(BANDWIDTHS)),
            "latency_ms": draw(st.sampled_from(LATENCIES)),
        }

    # A random spanning tree keeps the graph connected; extra random links add cycles.
    order = draw(st.permutations(nodes))
    for k in range(1, len(order)):
        parent = order[draw(st.integers(0, k - 1))]
        g.add_edge(order[k], parent, **link())
    pairs = list(itertools.combinations(nodes, 2))
    for u, v in draw(st.lists(st.sampled_from(pairs), max_size=8)):
        g.add_edge(u, v, **link())
    devices = [Device(f"d{i}", 2**30) for i in range(n_dev)]
    relay = draw(st.sampled_from(["all", "switches"]))
    return g, devices, relay


def _allowed(g: nx.Graph, s: str, t: str, devices: set[str], relay: str) -> nx.Graph:
    if relay == "all":
        return g
    return g.subgraph([n for n in g if n not in devices or n in (s, t)])


def _best(g: nx.Graph, s: str, t: str) -> tuple[float, int]:
    for w in sorted({d["bandwidth"] for _, _, d in g.edges(data=True)}, reverse=True):
        sub = nx.Graph([(u, v) for u, v, d in g.edges(data=True) if d["bandwidth"] >= w])
        if s in sub and t in sub and nx.has_path(sub, s, t):
            return w, nx.shortest_path_length(sub, s, t)
    return 0.0, -1


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_routes_have_the_best_bottleneck_and_fewest_hops(
    case: tuple[nx.Graph, list[Device], str],
) -> None:
    g, devices, relay = case
    names = {d.name for d in devices}
    reachable = all(
        _best(_allowed(g, s, t, names, relay), s, t)[0] > 0
        for s, t in itertools.combinations(sorted(names), 2)
    )
    if not reachable:  # only possible under relay: switches, which must then refuse it
        from planner.errors import InputError

        with pytest.raises(InputError, match="relay: switches"):
            Topology("random", g.copy(), devices, relay=relay)
        return
    topo = Topology("random", g.copy(), devices, relay=relay)
    for s, t in itertools.permutations(sorted(names), 2):
        route = topo.route(s, t)
        assert route[0] == s and route[-1] == t and len(set(route)) == len(route)
        if relay == "switches":
            assert not names & set(route[1:-1])
        hops = list(zip(route, route[1:], strict=False))
        assert all(g.has_edge(u, v) for u, v in hops)
        bottleneck = min(g.edges[u, v]["bandwidth"] for u, v in hops)
        best, fewest = _best(_allowed(g, s, t, names, relay), s, t)
        assert bottleneck == best == topo.bandwidth(s, t)
        assert len(hops) == fewest == topo.hops(s, t)
        latency = sum(g.edges[u, v]["latency_ms"] for u, v in hops)
        assert topo.latency_ms(s, t) == pytest.approx(latency)
        assert topo.transfer_ms(s, t, 1e9) == pytest.approx(latency + 1e9 / best * 1e3)
        assert topo.transfer_ms(s, t, 1e9) == topo.transfer_ms(t, s, 1e9)


@settings(max_examples=50, deadline=None)
@given(graphs(), st.sampled_from([0.5, 2.0, 3.0]))
def test_scaling_bandwidth_scales_the_byte_term_only(
    case: tuple[nx.Graph, list[Device], str], factor: float
) -> None:
    g, devices, _ = case
    topo = Topology("random", g.copy(), devices)
    fast = topo.scaled(bandwidth=factor)
    for s, t in itertools.combinations(topo.device_names(), 2):
        assert fast.route(s, t) == topo.route(s, t)
        assert fast.bandwidth(s, t) == pytest.approx(factor * topo.bandwidth(s, t))
        assert fast.latency_ms(s, t) == pytest.approx(topo.latency_ms(s, t))
