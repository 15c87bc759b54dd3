"""Solve time as the model's layers (10-400) and the devices (2-128) grow.

Synthetic transformer-like chains (uneven layer times between 1 and 4 ms, 100 MiB of weights
per layer, 8 MiB activations; built with planner.profile's dataclasses, not measured) are
solved by ``planner.solve.solve`` (the whole search: DP candidates for every number of
stages and replication degree, the depth x replication grid, simulator, local search,
schedules, then the tuned peers of ``planner.solve.peers`` and their plans as seeds: what
``pipeplan solve`` does by default) on two kinds of machine:

- ``one-switch``: ``uniform_topology(n)``, every GPU on one 50 GB/s switch;
- ``ib-cluster``: hosts of 8 GPUs on a 450 GB/s NVSwitch, one 400 Gbit/s InfiniBand NIC
  per GPU to one fabric switch (``topologies/two-node-ib.yaml`` repeated; fewer than 8
  GPUs: one host).

The global batch is 2 samples per device. Reported: wall seconds of ``solve``, the plan's
stages, predicted iteration time against the global lower bound (every device busy with an
equal share of the work, no communication) and against the search's bound for the plan
itself (its busiest device's compute + all-reduce + step, with the pipeline's fill and drain:
``planner.solve.bounds``), the best tuned peer (name and configuration) and its time over
pipeplan's, for the final plan and for the search alone (before the peers' plans join).
Plot: solve seconds against layers for each device count, log axes
(``bench/results/solver_scaling.svg``).

Run::

    .venv/bin/python bench/solver_scaling.py          # table + bench/results/solver_scaling.json
    .venv/bin/python bench/solver_scaling.py --quick  # 10 and 50 layers on 2, 8 and 32 GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path
from typing import Any

from plan_summary import plan_summary
from svgplot import line_plot

from planner.errors import InfeasibleError
from planner.profile import Layer, LayerTiming, Measurement, Profile
from planner.solve import solve
from planner.topology import Topology, topology_from_dict, uniform_topology

RESULTS = Path(__file__).resolve().parent / "results"
LAYERS = [10, 25, 50, 100, 200, 400]
DEVICES = [2, 4, 8, 16, 32, 64, 128]
QUICK_LAYERS = [10, 50]
QUICK_DEVICES = [2, 8, 32]


def chain_profile(n: int, *, param_mib: float = 100.0, seed: int = 0) -> Profile:
    """``n`` layers with uneven forward times (1-4 ms) and ~``param_mib`` MiB of weights each."""
    rng = random.Random(seed)
    layers, timings = [], []
    for i in range(n):
        p = int(param_mib * 2**20 * rng.uniform(0.5, 1.5))
        layers.append(Layer(f"block{i}", p // 4, p, 2 * p))
        f = rng.uniform(1.0, 4.0)
        out = 8 * 2**20
        timings.append(LayerTiming(f, 2 * f, f, f, out, 4 * out))
    return Profile(f"chain{n}", layers, [Measurement(1, 8 * 2**20, timings)])


def ib_cluster(n: int) -> Topology:
    """``n`` GPUs in hosts of 8 (NVSwitch inside, one InfiniBand NIC per GPU between)."""
    per_host = min(n, 8)
    return topology_from_dict(
        {
            "name": f"ib-cluster-{n}",
            "hosts": {
                "count": n // per_host,
                "devices": {"count": per_host, "memory": "80 GiB", "kind": "H100"},
                "switch": {"name": "nvswitch", "bandwidth": "450 GB/s", "latency": "1 us"},
                "network": {"name": "ib", "bandwidth": "400 Gbit/s", "latency": "2.5 us"},
            },
        },
        f"<ib-cluster-{n}>",
    )


def machine(kind: str, n: int) -> Topology:
    if kind == "one-switch":
        return uniform_topology(n, bandwidth=50e9, latency_ms=0.002)
    return ib_cluster(n)


def measure(layers: int, devices: int, kind: str) -> dict[str, Any]:
    profile = chain_profile(layers)
    topo = machine(kind, devices)
    start = time.perf_counter()
    row: dict[str, Any] = {"layers": layers, "devices": devices, "topology": kind}
    try:
        plan = solve(profile, topo, global_batch=2 * devices, time_limit=10.0)
    except InfeasibleError:  # 400 x 100 MiB on 2 GPUs: proving that nothing fits is timed too
        row.update(seconds=round(time.perf_counter() - start, 3), stages=None)
        return row
    seconds = time.perf_counter() - start
    return {**row, "seconds": round(seconds, 3), **plan_summary(profile, topo, plan)}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    series: dict[str, list[tuple[float, float]]] = {}
    styles: dict[str, tuple[int, int]] = {}
    for di, kind in enumerate(("one-switch", "ib-cluster")):
        for ci, n in enumerate(sorted({r["devices"] for r in rows})):
            pts = [
                (r["layers"], r["seconds"])
                for r in rows
                if r["topology"] == kind and r["devices"] == n
            ]
            if pts:
                series[f"{n} GPUs, {kind}"] = pts
                styles[f"{n} GPUs, {kind}"] = (ci, di)
    svg = line_plot(
        series,
        title="pipeplan solve time (synthetic chains, 2-core CPU)",
        xlabel="layers",
        ylabel="solve seconds",
        xticks=sorted({r["layers"] for r in rows}),
        styles=styles,
        width=760,
        height=460,
    )
    path.write_text(svg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 and 50 layers on 2, 8, 32 GPUs")
    args = ap.parse_args()
    layers = QUICK_LAYERS if args.quick else LAYERS
    devices = QUICK_DEVICES if args.quick else DEVICES
    rows = []
    print(
        f"{'layers':>6} {'GPUs':>5} {'topology':>10} {'solve s':>8} {'stages':>6} {'vs LB':>6} "
        f"{'vs peer':>7} {'alone':>6}"
    )
    for kind in ("one-switch", "ib-cluster"):
        for n in devices:
            for L in layers:
                r = measure(L, n, kind)
                rows.append(r)
                tail = (
                    f"{r['stages']:>6} {r['vs_lower_bound']:>6.2f} {r['vs_best_peer']!s:>7} "
                    f"{r['search_alone']!s:>6}"
                    if r["stages"]
                    else "  does not fit"
                )
                print(f"{L:>6} {n:>5} {kind:>10} {r['seconds']:>8.2f} {tail}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(rows, RESULTS / "solver_scaling.svg")
    payload = {
        "benchmark": "solver_scaling",
        "note": (
            "Synthetic chain profiles (derived, not measured); solve as `pipeplan solve` runs "
            "it (tuned peers included). vs_lower_bound: plan / global bound (equal shares, no "
            "communication); vs_plan_bound: plan / the search's bound for the plan itself "
            "(busiest device's compute + all-reduce + step, fill and drain); vs_best_peer and "
            "search_alone: best tuned peer / pipeplan, final plan and search alone."
        ),
        "machine": f"{os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "load_average_1min": os.getloadavg()[0],
        "rows": rows,
    }
    (RESULTS / "solver_scaling.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {RESULTS / 'solver_scaling.json'} and solver_scaling.svg")


if __name__ == "__main__":
    main()
