"""Time and memory to load a topology, and the cost of asking it for routes.

Clusters of DGX-H100-like hosts (8 GPUs on an NVSwitch, one 400 Gbit/s NIC per GPU) with
64 to 16,384 GPUs, in three fabrics: every NIC on one InfiniBand switch ("flat"), NICs on
leaf switches of 32 GPUs joined to one spine by 16 x 400 Gbit/s uplinks ("leaf-spine",
2:1 oversubscribed, so routes have three bandwidth levels), or ``pipeplan topology cluster
--preset dgx-h100``'s rail-optimised network ("rail": GPU k of every node on rail k, rails
on a spine); and, for reference, all GPUs on a single switch ("one-switch"). Loading
(``build_s``, ``build_mib``: the peak of Python's allocations, tracemalloc) is the whole
``Topology`` constructor from the file mapping: validation, the graph, the bottleneck tree.
Routes are worked out on first use (planner/topology/routes.py): ``first_query_us`` is a
transfer time asked of 2,000 random device pairs for the first time (each works out its
route), ``transfer_ms_query_us`` and ``route_query_us`` the same pairs asked again (the
solver's case: the same pairs, millions of times).

Run::

    .venv/bin/python bench/topology_table.py          # table + bench/results/topology_table.json
    .venv/bin/python bench/topology_table.py --quick  # 64 and 256 only
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from planner.topology import Topology, topology_from_dict
from planner.topology.cluster import cluster_dict

SIZES = [64, 256, 1024, 4096, 16384]
FABRICS = ("one-switch", "flat", "leaf-spine", "rail")
PAIRS = 2000


def cluster(n_gpus: int, fabric: str) -> dict[str, Any]:
    """A topology mapping (the file format) for ``n_gpus`` GPUs."""
    if fabric == "one-switch":
        return {
            "name": f"one-switch-{n_gpus}",
            "devices": [{"name": f"gpu{{0..{n_gpus - 1}}}", "memory": "80 GiB"}],
            "switches": ["sw"],
            "links": [{"between": [f"gpu{{0..{n_gpus - 1}}}", "sw"], "bandwidth": "50 GB/s"}],
        }
    if fabric == "rail":
        return cluster_dict("dgx-h100", n_gpus // 8, network="rail")
    hosts = n_gpus // 8
    data: dict[str, Any] = {
        "name": f"{fabric}-{n_gpus}",
        "hosts": {
            "count": hosts,
            "devices": {"count": 8, "memory": "80 GiB", "kind": "H100"},
            "switch": {"name": "nvswitch", "bandwidth": "450 GB/s", "latency": "1 us"},
        },
    }
    if fabric == "flat":
        data["hosts"]["network"] = {"name": "ib", "bandwidth": "400 Gbit/s", "latency": "2.5 us"}
        return data
    leaves = max(1, n_gpus // 32)
    data["switches"] = [f"leaf{{0..{leaves - 1}}}", "spine"]
    data["links"] = [
        {
            "between": [f"gpu{{{32 * k}..{32 * k + 31}}}", f"leaf{k}"],
            "bandwidth": "400 Gbit/s",
            "latency": "1 us",
        }
        for k in range(leaves)
    ]
    data["links"].append(
        {
            "between": ["leaf{0.." + str(leaves - 1) + "}", "spine"],
            "bandwidth": "400 Gbit/s",
            "count": 16,
            "latency": "1 us",
        }
    )
    return data


def measure(n_gpus: int, fabric: str) -> dict[str, Any]:
    data = cluster(n_gpus, fabric)
    repeats = 3 if n_gpus <= 256 else 1
    best = float("inf")
    topo: Topology | None = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        topo = topology_from_dict(data, f"<{fabric}-{n_gpus}>")
        best = min(best, time.perf_counter() - t0)
    assert topo is not None
    tracemalloc.start()
    topology_from_dict(data, f"<{fabric}-{n_gpus}>")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    names = topo.device_names()
    rng = random.Random(0)
    pairs = [(rng.choice(names), rng.choice(names)) for _ in range(PAIRS)]
    t0 = time.perf_counter()
    for src, dst in pairs:
        topo.transfer_ms(src, dst, 1e6)
    first = (time.perf_counter() - t0) / len(pairs)
    again = pairs * 100
    t0 = time.perf_counter()
    for src, dst in again:
        topo.transfer_ms(src, dst, 1e6)
    per_query = (time.perf_counter() - t0) / len(again)
    t0 = time.perf_counter()
    for src, dst in pairs:
        topo.route(src, dst)
    per_route = (time.perf_counter() - t0) / len(pairs)
    return {
        "devices": n_gpus,
        "fabric": fabric,
        "nodes": topo.graph.number_of_nodes(),
        "links": topo.graph.number_of_edges(),
        "build_s": best,
        "build_mib": round(peak / 2**20, 1),
        "first_query_us": first * 1e6,
        "transfer_ms_query_us": per_query * 1e6,
        "route_query_us": per_route * 1e6,
    }


def main() -> None:
    sizes = SIZES[:2] if "--quick" in sys.argv else SIZES
    rows = [measure(n, fabric) for n in sizes for fabric in FABRICS]
    machine = f"{os.cpu_count()} CPU cores, Python {platform.python_version()}"
    print(f"topology load and route queries ({machine})")
    header = f"{'devices':>7} {'fabric':>10} {'nodes':>6} {'links':>6} {'build s':>8} {'MiB':>6}"
    print(header + f" {'first us':>9} {'transfer_ms us':>14} {'route us':>9}")
    for r in rows:
        print(
            f"{r['devices']:>7} {r['fabric']:>10} {r['nodes']:>6} {r['links']:>6} "
            f"{r['build_s']:>8.3f} {r['build_mib']:>6.1f} {r['first_query_us']:>9.1f} "
            f"{r['transfer_ms_query_us']:>14.2f} {r['route_query_us']:>9.1f}"
        )
    out = Path(__file__).resolve().parent / "results" / "topology_table.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
