"""Topology model: loading, routing rules, transfer times, all-reduce, the bundled presets."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
import yaml

from planner.errors import InputError
from planner.topology import (
    Device,
    Topology,
    expand_names,
    load_topology,
    topology_from_dict,
    uniform_topology,
)
from planner.topology.collectives import ring_allreduce_ms

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted((ROOT / "topologies").glob("*.yaml"))
GB = 1e9


def _dgx1(**changes: Any) -> Topology:
    data = yaml.safe_load((ROOT / "topologies" / "dgx1-v100.yaml").read_text())
    data.update(changes)
    return topology_from_dict(data, "dgx1-v100.yaml")


def _nvlink_pairs(topo: Topology, count: int) -> list[tuple[str, str]]:
    return [(u, v) for u, v, d in topo.links() if d["kind"] == "nvlink" and d["count"] == count]


def test_presets_exist_load_and_cite_their_sources() -> None:
    names = {p.name for p in PRESETS}
    assert {
        "nvlink.yaml",
        "dgx1-v100.yaml",
        "pcie.yaml",
        "two-node-ib.yaml",
        "hetero.yaml",
        "cpu.yaml",
    } <= names
    for path in PRESETS:
        topo = load_topology(path)
        assert topo.devices, path
        head = path.read_text().splitlines()[0]
        assert head.startswith("#"), f"{path.name} must start with a comment"
        assert "source" in path.read_text().lower(), f"{path.name} must name its sources"


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_presets_round_trip_through_the_normalised_form(path: Path) -> None:
    topo = load_topology(path)
    again = topology_from_dict(yaml.safe_load(topo.to_yaml()), "again.yaml")
    assert again.to_dict() == topo.to_dict()
    assert np.array_equal(again.bandwidth_matrix(), topo.bandwidth_matrix())
    assert np.array_equal(again.latency_matrix(), topo.latency_matrix())


def test_dgx1_has_the_uneven_cube_mesh() -> None:
    topo = _dgx1()
    single, double = _nvlink_pairs(topo, 1), _nvlink_pairs(topo, 2)
    assert len(single) == 8 and len(double) == 8  # 16 NVLink pairs, 24 links
    per_gpu = dict.fromkeys(topo.device_names(), 0)
    for u, v, d in topo.links():
        if d["kind"] == "nvlink":
            per_gpu[u] += d["count"]
            per_gpu[v] += d["count"]
    assert set(per_gpu.values()) == {6}  # six NVLinks per V100
    assert topo.link_bandwidth("gpu0", "gpu3") == 50 * GB
    assert topo.link_bandwidth("gpu0", "gpu1") == 25 * GB


def test_dgx1_two_link_pairs_are_faster_than_one_link_pairs() -> None:
    # Under the contract's rule (widest bottleneck, any vertex relays) the double links form a
    # ring through all eight GPUs, so a one-link pair is reached at 50 GB/s too, but only over
    # more hops: it pays more latency for every transfer size.
    topo = _dgx1(relay="all")
    for nbytes in (0, 1, 2**20, 2**30):
        slowest_double = max(topo.transfer_ms(u, v, nbytes) for u, v in _nvlink_pairs(topo, 2))
        fastest_single = min(topo.transfer_ms(u, v, nbytes) for u, v in _nvlink_pairs(topo, 1))
        assert slowest_double < fastest_single
    assert topo.route("gpu0", "gpu1") == ["gpu0", "gpu3", "gpu2", "gpu1"]
    assert topo.hops("gpu0", "gpu1") == 3 and topo.bandwidth("gpu0", "gpu1") == 50 * GB
    # The bundled file does not relay through GPUs (as CUDA peer copies don't): there the
    # difference is the bandwidth itself, 50 vs 25 GB/s.
    direct = _dgx1()
    assert direct.relay == "switches"
    for u, v in _nvlink_pairs(direct, 2):
        assert direct.bandwidth(u, v) == 50 * GB and direct.route(u, v) == [u, v]
    for u, v in _nvlink_pairs(direct, 1):
        assert direct.bandwidth(u, v) == 25 * GB and direct.route(u, v) == [u, v]
        assert direct.transfer_ms(u, v, 2**30) > max(
            direct.transfer_ms(a, b, 2**30) for a, b in _nvlink_pairs(direct, 2)
        )


def test_dgx1_pairs_without_nvlink_route_as_the_rules_say() -> None:
    topo = _dgx1(relay="all")
    # gpu0-gpu7: the widest route runs over two double links through gpu4 (50 GB/s, 2 hops);
    # the other two-hop route, through gpu3, has a single link (25 GB/s).
    assert topo.route("gpu0", "gpu7") == ["gpu0", "gpu4", "gpu7"]
    assert topo.bandwidth("gpu0", "gpu7") == 50 * GB
    assert topo.latency_ms("gpu0", "gpu7") == pytest.approx(0.002)
    # gpu0-gpu5: 50 GB/s needs four double-link hops along the ring; fewest hops among the
    # 50 GB/s routes, ties broken by device order (gpu3 before gpu4).
    assert topo.route("gpu0", "gpu5") == ["gpu0", "gpu3", "gpu2", "gpu1", "gpu5"]
    assert topo.route("gpu0", "gpu6") == ["gpu0", "gpu4", "gpu7", "gpu6"]
    # Never PCIe: its 15.75 GB/s bottleneck is narrower than any NVLink route.
    for u, v in itertools.combinations(topo.device_names(), 2):
        assert not any(n.startswith(("pcie", "cpu")) for n in topo.route(u, v))
    # Without relaying through GPUs, non-neighbours go through PCIe and the QPI.
    direct = _dgx1(relay="switches")
    assert direct.route("gpu0", "gpu5") == ["gpu0", "pcie0", "cpu0", "cpu1", "pcie2", "gpu5"]
    assert direct.bandwidth("gpu0", "gpu5") == 15.75 * GB
    assert direct.latency_ms("gpu0", "gpu5") == pytest.approx(4 * 0.0015 + 0.001)


def test_transfer_time_is_latency_plus_bytes_over_bottleneck() -> None:
    topo = load_topology(ROOT / "topologies" / "two-node-ib.yaml")
    # Across the nodes: gpu0 -> ib -> gpu8, 2 x 2.5 us, 400 Gbit/s = 50 GB/s.
    assert topo.route("gpu0", "gpu8") == ["gpu0", "ib", "gpu8"]
    assert topo.transfer_ms("gpu0", "gpu8", 50e6) == pytest.approx(0.005 + 1.0)
    # Inside a node through the NVSwitch: 450 GB/s, 2 x 1 us.
    assert topo.transfer_ms("gpu0", "gpu7", 450e6) == pytest.approx(0.002 + 1.0)
    assert topo.transfer_ms("gpu3", "gpu3", 1e9) == 0.0
    assert topo.bandwidth("gpu3", "gpu3") == math.inf
    assert topo.route_links("gpu0", "gpu8") == [("gpu0", "ib"), ("ib", "gpu8")]
    assert topo.hosts()["node1"] == [f"gpu{i}" for i in range(8, 16)]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_transfer_times_are_symmetric_positive_and_linear(path: Path) -> None:
    topo = load_topology(path)
    names = topo.device_names()
    for u, v in itertools.permutations(names, 2):
        t1, t2 = topo.transfer_ms(u, v, 1e6), topo.transfer_ms(u, v, 2e6)
        assert t1 > 0
        assert t1 == topo.transfer_ms(v, u, 1e6)
        assert topo.route(v, u) == topo.route(u, v)[::-1]
        # Linear: equal steps in bytes add equal time, the intercept is the latency.
        t0 = topo.transfer_ms(u, v, 0)
        assert t0 == pytest.approx(topo.latency_ms(u, v))
        assert t2 - t1 == pytest.approx(t1 - t0, rel=1e-9)
        assert t2 - t1 == pytest.approx(1e6 / topo.bandwidth(u, v) * 1e3, rel=1e-9)


def test_hetero_devices_differ_in_memory_and_speed() -> None:
    topo = load_topology(ROOT / "topologies" / "hetero.yaml")
    kinds = {d.kind for d in topo.devices}
    assert kinds == {"A100", "V100"}
    assert len({d.memory_bytes for d in topo.devices}) == 2
    assert len({d.speed for d in topo.devices}) == 2
    # Across the Ethernet: 100 Gbit/s is the bottleneck.
    assert topo.bandwidth("a100_0", "v100_0") == 12.5 * GB


def test_cpu_preset_is_local_processes() -> None:
    topo = load_topology(ROOT / "topologies" / "cpu.yaml")
    assert topo.device_names() == ["cpu0", "cpu1"]
    assert {d.host for d in topo.devices} == {"localhost"}
    assert topo.bandwidth("cpu0", "cpu1") == 3 * GB
    assert topo.latency_ms("cpu0", "cpu1") == pytest.approx(0.070)


def test_allreduce_is_the_ring_formula_on_a_switch() -> None:
    topo = uniform_topology(4, bandwidth=25 * GB, latency_ms=0.01)
    # 2 (n-1) steps of nbytes/n each at the full link bandwidth, plus latency per step.
    expected = 2 * 3 * (0.01 + 1e9 / 4 / (25 * GB) * 1e3)
    assert topo.allreduce_ms(topo.device_names(), 1e9) == pytest.approx(expected)
    assert topo.allreduce_ms(["gpu2"], 1e9) == 0.0
    assert topo.allreduce_ms([], 1e9) == 0.0
    with pytest.raises(InputError, match="twice"):
        topo.allreduce_ms(["gpu0", "gpu0"], 1.0)
    with pytest.raises(InputError, match="unknown device 'gpu9'"):
        topo.allreduce_ms(["gpu0", "gpu9"], 1.0)


def test_allreduce_uses_the_routes_and_shares_links() -> None:
    topo = load_topology(ROOT / "topologies" / "two-node-ib.yaml")
    inside = topo.allreduce_ms(["gpu0", "gpu1"], 1e9)
    across = topo.allreduce_ms(["gpu0", "gpu8"], 1e9)
    assert inside == pytest.approx(2 * (0.002 + 0.5e9 / (450 * GB) * 1e3))
    assert across == pytest.approx(2 * (0.005 + 0.5e9 / (50 * GB) * 1e3))
    # Given order gpu0 gpu8 gpu1 gpu9 crosses the network four times; grouped by host only
    # twice. Either way each NIC link carries one ring hop per direction: 50 GB/s per hop.
    four = topo.allreduce_ms(["gpu0", "gpu8", "gpu1", "gpu9"], 1e9)
    assert four == pytest.approx(6 * (0.005 + 0.25e9 / (50 * GB) * 1e3))
    # A shared bottleneck: hetero's two nodes meet over one Ethernet link per node, so a ring
    # over a100_0, v100_0, a100_1, v100_1 in that order would cross it twice per direction;
    # grouping by host crosses it once, which is what allreduce_ms picks.
    het = load_topology(ROOT / "topologies" / "hetero.yaml")
    ring = ["a100_0", "v100_0", "a100_1", "v100_1"]
    grouped = ["a100_0", "a100_1", "v100_0", "v100_1"]
    assert ring_allreduce_ms(het, ring, 1e9) > ring_allreduce_ms(het, grouped, 1e9)
    assert het.allreduce_ms(ring, 1e9) == pytest.approx(ring_allreduce_ms(het, grouped, 1e9))
    chunk = 1e9 / 4
    assert ring_allreduce_ms(het, ring, 1e9) == pytest.approx(
        6 * (het.latency_ms("a100_0", "v100_0") + chunk / (12.5 * GB / 2) * 1e3)
    )


def test_scaled_multiplies_bandwidth_and_speed() -> None:
    topo = load_topology(ROOT / "topologies" / "dgx1-v100.yaml")
    fast = topo.scaled(bandwidth=2.0, speed=3.0)
    assert fast.bandwidth("gpu0", "gpu5") == 2 * topo.bandwidth("gpu0", "gpu5")
    assert fast.device("gpu0").speed == 3.0
    assert topo.device("gpu0").speed == 1.0  # the original is untouched
    assert fast.route("gpu0", "gpu5") == topo.route("gpu0", "gpu5")


def test_uniform_topology_and_api_basics() -> None:
    topo = uniform_topology(3, bandwidth=10 * GB, latency_ms=0.004, memory_bytes=2**30)
    assert topo.device_names() == ["gpu0", "gpu1", "gpu2"]
    assert topo.device("gpu1") == Device("gpu1", 2**30, 1.0, "host0", "")
    assert topo.latency_ms("gpu0", "gpu2") == pytest.approx(0.004)
    assert topo.bandwidth("gpu0", "gpu2") == 10 * GB
    assert topo.link_bandwidth("gpu0", "switch0") == 10 * GB
    assert topo.link_latency_ms("switch0", "gpu0") == pytest.approx(0.002)
    assert topo.device_index("gpu2") == 2
    with pytest.raises(InputError, match="unknown device 'gpu7'"):
        topo.device("gpu7")
    with pytest.raises(InputError, match="no link between"):
        topo.link_bandwidth("gpu0", "gpu1")
    one = uniform_topology(1)
    assert one.transfer_ms("gpu0", "gpu0", 1e9) == 0.0


def test_direct_construction_from_a_networkx_graph() -> None:
    g = nx.Graph()
    g.add_edge("a", "b", bandwidth=10 * GB, latency_ms=0.001)
    g.add_edge("b", "c", bandwidth=5 * GB, latency_ms=0.001)
    g.add_edge("a", "c", bandwidth=1 * GB, latency_ms=0.0)
    topo = Topology("tri", g, [Device("a", 1), Device("c", 1)])
    assert topo.switches == ["b"]
    assert topo.route("a", "c") == ["a", "b", "c"]  # 5 GB/s through b beats 1 GB/s direct
    assert topo.transfer_ms("a", "c", 5e9) == pytest.approx(0.002 + 1000.0)


def test_ties_on_bottleneck_take_fewest_hops() -> None:
    data = {
        "devices": [{"name": "gpu{0..1}", "memory": "1 GiB"}],
        "switches": ["s{0..2}"],
        "links": [
            # Three 10 GB/s routes: direct (1 hop, slow latency), via s0 (2 hops), s1-s2 (3).
            {"between": ["gpu0", "gpu1"], "bandwidth": "10 GB/s", "latency": "50 us"},
            {"between": ["gpu{0..1}", "s0"], "bandwidth": "10 GB/s", "latency": "1 us"},
            {"between": ["gpu0", "s1"], "bandwidth": "40 GB/s"},
            {"between": ["s1", "s2"], "bandwidth": "40 GB/s"},
            {"between": ["s2", "gpu1"], "bandwidth": "40 GB/s"},
        ],
    }
    topo = topology_from_dict(data)
    # The widest route wins even with more hops ...
    assert topo.route("gpu0", "gpu1") == ["gpu0", "s1", "s2", "gpu1"]
    # ... and among equally wide routes the fewest hops, whatever their latency.
    data["links"][4]["bandwidth"] = "10 GB/s"
    topo = topology_from_dict(data)
    assert topo.route("gpu0", "gpu1") == ["gpu0", "gpu1"]
    assert topo.latency_ms("gpu0", "gpu1") == pytest.approx(0.05)


def test_expand_names() -> None:
    assert expand_names("gpu{0..2}") == ["gpu0", "gpu1", "gpu2"]
    assert expand_names("n{0..1}.g{2..3}") == ["n0.g2", "n0.g3", "n1.g2", "n1.g3"]
    assert expand_names("plain") == ["plain"]
    with pytest.raises(InputError, match="counts down"):
        expand_names("gpu{3..1}")


def test_link_ranges_make_meshes_and_switch_groups() -> None:
    topo = topology_from_dict(
        {
            "devices": [{"name": "gpu{0..3}", "memory": "16 GiB"}],
            "links": [{"between": ["gpu{0..3}", "gpu{0..3}"], "bandwidth": "25 GB/s"}],
        }
    )
    assert topo.graph.number_of_edges() == 6  # every unordered pair once
    assert all(topo.hops(u, v) == 1 for u, v in itertools.combinations(topo.device_names(), 2))


def test_hosts_shorthand_builds_identical_hosts() -> None:
    topo = topology_from_dict(
        {
            "hosts": {
                "count": 4,
                "devices": {"count": 2, "memory": "40 GiB", "kind": "A100"},
                "switch": {"name": "nvs", "bandwidth": "300 GB/s"},
                "network": {"name": "eth", "per": "host", "bandwidth": "100 Gbit/s"},
            }
        }
    )
    assert topo.device_names() == [f"gpu{i}" for i in range(8)]
    assert list(topo.hosts()) == ["node0", "node1", "node2", "node3"]
    assert topo.switches == ["eth", "nvs0", "nvs1", "nvs2", "nvs3"]
    assert topo.route("gpu0", "gpu7") == ["gpu0", "nvs0", "eth", "nvs3", "gpu7"]
    assert topo.bandwidth("gpu0", "gpu1") == 300 * GB
    assert topo.bandwidth("gpu0", "gpu2") == 12.5 * GB


def test_defaults_fill_missing_device_fields() -> None:
    topo = topology_from_dict(
        {
            "defaults": {"memory": "8 GiB", "kind": "T4", "host": "box"},
            "devices": [{"name": "g0"}, {"name": "g1", "memory": "16 GiB", "speed": 2}],
            "links": [{"between": ["g0", "g1"], "bandwidth": "12 GB/s"}],
        }
    )
    assert topo.device("g0") == Device("g0", 8 * 2**30, 1.0, "box", "T4")
    assert topo.device("g1") == Device("g1", 16 * 2**30, 2.0, "box", "T4")
    assert topo.link_latency_ms("g0", "g1") == 0.0  # latency defaults to 0


def test_message_overhead_from_defaults_hosts_and_devices() -> None:
    hosts = topology_from_dict(
        {
            "defaults": {"message_overhead": "300 us"},
            "hosts": {
                "count": 2,
                "devices": {"count": 2, "memory": "4 GiB"},
                "network": {"bandwidth": "3 GB/s"},
            },
        }
    )
    assert [d.message_overhead_ms for d in hosts.devices] == [0.3] * 4
    named = topology_from_dict(
        {
            "devices": [
                {"name": "c0", "memory": "1 GiB", "message_overhead": "1 ms"},
                {"name": "c1", "memory": "1 GiB"},
            ],
            "links": [{"between": ["c0", "c1"], "bandwidth": "1 GB/s"}],
        }
    )
    assert [d.message_overhead_ms for d in named.devices] == [1.0, 0.0]
    back = topology_from_dict(named.to_dict())
    assert back.devices == named.devices
    assert "message_overhead" not in named.to_dict()["devices"][1]  # 0: files stay as they were


def test_relay_switches_rejects_topologies_that_need_relaying() -> None:
    data = {
        "relay": "switches",
        "devices": [{"name": "gpu{0..2}", "memory": "1 GiB"}],
        "links": [
            {"between": ["gpu0", "gpu1"], "bandwidth": "1 GB/s"},
            {"between": ["gpu1", "gpu2"], "bandwidth": "1 GB/s"},
        ],
    }
    with pytest.raises(InputError, match="relay: switches"):
        topology_from_dict(data)
    data["relay"] = "all"
    assert topology_from_dict(data).route("gpu0", "gpu2") == ["gpu0", "gpu1", "gpu2"]
    data["relay"] = "nobody"
    with pytest.raises(InputError, match="relay"):
        topology_from_dict(data)


def test_hosts_shorthand_list_of_groups_shares_the_network() -> None:
    topo = topology_from_dict(
        {
            "defaults": {"memory": "32 GiB"},
            "hosts": [
                {
                    "count": 1,
                    "name": "a",
                    "devices": {"count": 2, "name": "big", "memory": "80 GiB", "speed": 1.0},
                    "network": {"name": "eth", "bandwidth": "100 Gbit/s"},
                },
                {
                    "count": 2,
                    "name": "b",
                    "devices": {"count": 1, "name": "small", "speed": 0.5},
                    "network": {"name": "eth", "bandwidth": "25 Gbit/s"},
                },
            ],
        }
    )
    assert topo.device_names() == ["big0", "big1", "small0", "small1"]
    assert topo.hosts() == {"a0": ["big0", "big1"], "b0": ["small0"], "b1": ["small1"]}
    assert topo.device("small1").memory_bytes == 32 * 2**30  # from defaults
    assert topo.switches == ["eth"]
    assert topo.bandwidth("big0", "small0") == 25e9 / 8
    with pytest.raises(InputError, match=r"hosts\[1\]\.devices: expected the per-host devices"):
        topology_from_dict({"hosts": [{"devices": {"memory": "1 GiB"}}, {"count": 1}]})
    with pytest.raises(InputError, match=r"hosts\.network\.per: expected 'device' or 'host'"):
        topology_from_dict(
            {
                "hosts": {
                    "devices": {"memory": "1 GiB"},
                    "network": {"bandwidth": "1 GB/s", "per": "rack"},
                }
            }
        )


def test_allreduce_efficiency_slows_only_the_all_reduce() -> None:
    from planner.topology import load_topology

    def load_topology_text(text: str) -> Any:
        return topology_from_dict(yaml.safe_load(text), "e.yaml")

    text = (
        "name: e\ndevices:\n  - {name: 'c{0..3}', memory: 1 GiB}\nswitches: [sw]\n"
        "links:\n  - {between: ['c{0..3}', sw], bandwidth: 1 GB/s, latency: 0 us}\n"
    )
    full = load_topology_text(text)
    fifth = load_topology_text("allreduce_efficiency: 0.2\n" + text)
    devices = ["c0", "c1", "c2", "c3"]
    # Ring of 4, no latency: 2 * 3 steps of 1/4 of 8 MB at 1 GB/s (0.2 GB/s).
    assert full.allreduce_ms(devices, 8e6) == pytest.approx(6 * 2e6 / 1e9 * 1e3)
    assert fifth.allreduce_ms(devices, 8e6) == pytest.approx(5 * full.allreduce_ms(devices, 8e6))
    assert fifth.transfer_ms("c0", "c1", 8e6) == full.transfer_ms("c0", "c1", 8e6)
    assert fifth.scaled(bandwidth=2).allreduce_efficiency == 0.2
    again = load_topology_text(fifth.to_yaml())
    assert again.allreduce_efficiency == 0.2 and "allreduce_efficiency" not in full.to_dict()
    assert load_topology(ROOT / "topologies" / "cpu.yaml").allreduce_efficiency == 0.25
