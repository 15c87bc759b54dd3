"""Tensor-parallel groups derived from the topology: on the bundled uneven fabrics the
groups sit on the fast links, found from the links themselves (a topology whose devices
are renamed and listed in another order gives the same groups)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from planner.solve.tp_groups import tp_groupings
from planner.topology import Topology, load_topology, topology_from_dict

ROOT = Path(__file__).resolve().parents[1]


def _topo(name: str) -> Topology:
    return load_topology(ROOT / "topologies" / f"{name}.yaml")


def _is_partition(topology: Topology, groups: tuple[tuple[str, ...], ...], t: int) -> None:
    names = [d for g in groups for d in g]
    assert sorted(names) == sorted(topology.device_names())
    assert all(len(g) == t for g in groups)


def _nvlinked(topology: Topology, a: str, b: str) -> bool:
    """A direct NVLink between two devices (the links' kind, as the file gives it)."""
    return topology.graph.has_edge(a, b) and topology.graph.edges[a, b].get("kind") == "nvlink"


def test_dgx1_groups_ride_the_cube_mesh() -> None:
    topo = _topo("dgx1-v100")
    two = tp_groupings(topo, 2)[0]
    _is_partition(topo, two, 2)
    # Every pair on a double NVLink (50 GB/s), the fastest a DGX-1 pair has.
    assert all(topo.bandwidth(a, b) == pytest.approx(50e9) for a, b in two)
    four = tp_groupings(topo, 4)[0]
    _is_partition(topo, four, 4)
    # The two fully NVLinked quads: every member reaches every other on NVLink.
    assert {frozenset(g) for g in four} == {
        frozenset({"gpu0", "gpu1", "gpu2", "gpu3"}),
        frozenset({"gpu4", "gpu5", "gpu6", "gpu7"}),
    }
    assert all(_nvlinked(topo, a, b) for g in four for a, b in itertools.combinations(g, 2))


def test_nvlink_pairs_are_the_pairs() -> None:
    topo = _topo("nvlink-pairs")
    (two,) = tp_groupings(topo, 2)
    assert {frozenset(g) for g in two} == {
        frozenset({f"gpu{2 * k}", f"gpu{2 * k + 1}"}) for k in range(4)
    }


def test_two_nodes_keep_groups_inside_a_node() -> None:
    topo = _topo("two-node-ib")
    for t in (2, 4, 8):
        for groups in tp_groupings(topo, t):
            _is_partition(topo, groups, t)
            assert all(len({topo.device(d).host for d in g}) == 1 for g in groups)


def test_groups_follow_the_links_not_the_names() -> None:
    """nvlink-pairs with its GPUs renamed and listed in a scrambled order: the NVLink
    pairs still (nothing is read from the names or the file order)."""
    topo = _topo("nvlink-pairs")
    order = ["gpu5", "gpu2", "gpu7", "gpu0", "gpu3", "gpu6", "gpu1", "gpu4"]
    rename = {old: f"dev{i}" for i, old in enumerate(order)}
    data = topo.to_dict()
    by_name = {d["name"]: d for d in data["devices"]}
    data["devices"] = [{**by_name[old], "name": rename[old]} for old in order]
    for link in data["links"]:
        link["between"] = [rename.get(x, x) for x in link["between"]]
    scrambled = topology_from_dict(data, "<scrambled>")
    two = tp_groupings(scrambled, 2)[0]
    back = {v: k for k, v in rename.items()}
    pairs = {frozenset(back[d] for d in g) for g in two}
    assert pairs == {frozenset({f"gpu{2 * k}", f"gpu{2 * k + 1}"}) for k in range(4)}


def test_degrees_that_do_not_fit_give_nothing_and_leftovers_are_left_out() -> None:
    topo = _topo("cpu")
    assert tp_groupings(topo, 4) == []
    hetero = _topo("hetero")
    (three, *_) = tp_groupings(hetero, 3)
    assert len(three) == 2 and all(len(g) == 3 for g in three)
