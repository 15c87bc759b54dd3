"""How long ``pipeplan solve`` takes: the chain DP at scale and the ILP on a heterogeneous box.

Cases:

- ``dp 200x64``: the chain DP alone (one backward DP answering every number of stages, plus
  one 64-stage forward DP) for 200 layers on 64 identical GPUs on one switch.
- ``solve 200x64 small`` / ``large``: the whole search (DP candidates over every number of
  stages and replication degree, simulator, local search, schedules) on the same machine,
  for a model that fits on one GPU and one that needs at least ~8 pipeline stages, without
  the baselines; ``solve+bl`` is the same with the baselines (what ``pipeplan solve`` does by
  default: their partitions, PipeDream's DP included, and one simulation each), and
  ``baselines`` their partitions alone.
- ``ilp 48x16``: the integer program alone on PipeDream's GNMT profile (48 layers) and a
  16-device heterogeneous topology (8 A100 on NVSwitch, 4 V100 and 4 T4 on PCIe, 25 GB/s
  Ethernet between the hosts), 16 and 8 stages, CBC with the default 60 s time limit,
  warm-started from the DP; status and gap as CBC reports them.
- ``tp 96x1024``: GPT-3 175B-shaped (96 identical blocks, h = 12288, sequence 2048, mixed
  precision Adam: 2 bytes of weights and 12 of optimizer state per parameter, forward
  ``24 s h^2 + 4 s^2 h`` FLOPs at 400 TFLOP/s) with Megatron-style tensor-parallel entries
  for degrees 2, 4 and 8 (``planner.cost.synthetic_tensor_parallel``: exact numbers, not a
  profiler run), on 1024 H100s (``pipeplan topology cluster --preset dgx-h100 --nodes
  128``), global batch 512 sequences: the whole solve as ``pipeplan solve`` runs it (the
  search over TP, SP, sharding, depth, replicas, placement, microbatching and schedule, then
  the tuned peers, Megatron-LM and torchtitan with TP among them) without a time limit, and
  pipeplan's own search alone (``searched``: no peers).

Run::

    .venv/bin/python bench/solve_time.py           # table + bench/results/solve_time.json
    .venv/bin/python bench/solve_time.py --quick   # skip the baselines timing, the ILP, TP
    .venv/bin/python bench/solve_time.py --tp      # the TP row alone (merged into the JSON)
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from planner.cost import synthetic_profile, synthetic_tensor_parallel
from planner.partition.dp import Slot, layer_costs, partition_chain, partition_chain_depths
from planner.partition.ilp import solve_ilp
from planner.profile import Layer, LayerTiming, Measurement, Profile, load_profile
from planner.solve import SolveOptions, baseline_partitions, solve
from planner.solve.arguments import batch_settings
from planner.solve.entry import searched
from planner.solve.memory import in_flight as stashed
from planner.solve.options import AUTO_SCHEDULES
from planner.solve.search import Search
from planner.topology import Topology, topology_from_dict, uniform_topology
from planner.topology.cluster import cluster_dict

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "solve_time.json"


def chain_profile(n: int, *, param_mib: float, seed: int = 0) -> Profile:
    """A transformer-like chain: uneven layer times, ``param_mib`` MiB of weights per layer."""
    rng = random.Random(seed)
    layers, timings = [], []
    for i in range(n):
        p = int(param_mib * 2**20 * rng.uniform(0.5, 1.5))
        layers.append(Layer(f"block{i}", p // 4, p, 2 * p))
        f = rng.uniform(1.0, 4.0)
        out = 8 * 2**20
        timings.append(LayerTiming(f, 2 * f, f, f, out, 4 * out))
    return Profile(f"chain{n}", layers, [Measurement(1, 8 * 2**20, timings)])


def hetero16() -> Topology:
    return topology_from_dict(
        {
            "schema": "pipeplan.topology/v1",
            "name": "hetero-16",
            "devices": [
                {"name": "a100_{0..7}", "memory": "80 GiB", "speed": 1.0, "host": "n0"},
                {"name": "v100_{0..3}", "memory": "32 GiB", "speed": 0.36, "host": "n1"},
                {"name": "t4_{0..3}", "memory": "16 GiB", "speed": 0.2, "host": "n1"},
            ],
            "switches": ["nvs", "pcie1", "eth"],
            "links": [
                {"between": ["a100_{0..7}", "nvs"], "bandwidth": "300 GB/s", "latency": "1 us"},
                {"between": ["v100_{0..3}", "pcie1"], "bandwidth": "15.75 GB/s", "latency": "2 us"},
                {"between": ["t4_{0..3}", "pcie1"], "bandwidth": "15.75 GB/s", "latency": "2 us"},
                {"between": ["nvs", "eth"], "bandwidth": "25 GB/s", "latency": "5 us"},
                {"between": ["pcie1", "eth"], "bandwidth": "25 GB/s", "latency": "5 us"},
            ],
        }
    )


def time_dp(profile: Profile, topo: Topology, m: int) -> dict[str, Any]:
    start = time.perf_counter()
    costs = layer_costs(profile, 1)
    d = len(topo.devices)
    slot = Slot(("gpu",), 1.0, float(topo.devices[0].memory_bytes))
    from_end = [stashed("1f1b", d, d - 1 - q, m) for q in range(d)]
    parts = partition_chain_depths(
        costs, slot, max_stages=d, in_flight_from_end=from_end, num_microbatches=m
    )
    mid = time.perf_counter()
    slots = [Slot((n,), 1.0, float(topo.devices[0].memory_bytes)) for n in topo.device_names()]
    partition_chain(costs, slots, in_flight=from_end[::-1], num_microbatches=m)
    end = time.perf_counter()
    feasible = sum(p is not None for p in parts)
    return {
        "all_depths_s": round(mid - start, 4),
        "forward_64_stages_s": round(end - mid, 4),
        "stage_counts_feasible": feasible,
    }


def time_solve(
    profile: Profile, topo: Topology, batch: int, *, baselines: bool = False
) -> dict[str, Any]:
    start = time.perf_counter()
    plan = solve(profile, topo, global_batch=batch, options=SolveOptions(baselines=baselines))
    seconds = time.perf_counter() - start
    return {
        "seconds": round(seconds, 3),
        "stages": len(plan.stages),
        "replicas": [len(s.devices) for s in plan.stages],
        "schedule": plan.schedule.name,
        "iteration_ms": round(plan.predicted.iteration_ms, 3),
        "global_lower_bound_ms": round(plan.predicted.global_lower_bound_ms, 3),
        "simulations": plan.solver.simulations,
        "method": plan.solver.method,
        "baselines": {b.name: b.feasible for b in plan.baselines},
    }


def time_ilp(profile: Profile, topo: Topology, stages: int, m: int) -> dict[str, Any]:
    mb = profile.microbatch_sizes[0]
    costs = layer_costs(profile, mb)
    # Warm start: the DP's partition over the strongest devices first.
    order = sorted(topo.devices, key=lambda d: -d.speed)
    slots = [Slot((d.name,), d.speed, float(d.memory_bytes)) for d in order[:stages]]
    in_flight = [stashed("1f1b", stages, k, m) for k in range(stages)]
    part = partition_chain(costs, slots, in_flight=in_flight, num_microbatches=m)
    warm = None
    if part is not None:
        warm = (part.ranges, [s.devices[0] for s in slots], part.recompute)
    res = solve_ilp(
        costs,
        topo,
        num_stages=stages,
        in_flight=in_flight,
        num_microbatches=m,
        time_limit=60.0,
        warm_start=warm,
    )
    return {
        "stages": stages,
        "status": res.status,
        "gap": None if res.gap is None else round(res.gap, 4),
        "seconds": round(res.seconds, 2),
        "objective_ms": None if res.objective_ms is None else round(res.objective_ms, 2),
        "bound_ms": None if res.bound_ms is None else round(res.bound_ms, 2),
        "devices": res.devices,
    }


def gpt3_175b_tp() -> Profile:
    """GPT-3 175B-shaped blocks with synthetic TP 2/4/8 entries (module docstring)."""
    h, seq = 12288, 2048
    params = 12 * h * h
    fwd_ms = (24 * seq * h * h + 4 * seq * seq * h) / 400e12 * 1e3
    base = synthetic_profile(
        96,
        forward_ms=fwd_ms,
        backward_input_ms=fwd_ms,
        backward_weight_ms=fwd_ms,
        param_bytes=2 * params,
        optimizer_state_bytes=12 * params,
        output_bytes=2 * seq * h,
        saved_bytes=34 * seq * h + 5 * 96 * seq * seq,
        input_bytes=2 * seq * h,
        optimizer_ms=10.0,
    )
    return synthetic_tensor_parallel(base, (2, 4, 8))


def time_tp(batch: int = 512) -> dict[str, Any]:
    """The ``tp 96x1024`` row: the whole solve (no time limit), then the search alone."""
    profile = gpt3_175b_tp()
    topo = topology_from_dict(cluster_dict("dgx-h100", 128), "<dgx-h100 x128>")
    start = time.perf_counter()
    plan = solve(profile, topo, global_batch=batch, time_limit=3600.0)
    seconds = time.perf_counter() - start
    settings = batch_settings(profile, batch, None, len(topo.devices))
    start = time.perf_counter()
    own = searched(Search(profile, topo, SolveOptions(), 3600.0), settings, AUTO_SCHEDULES)
    alone = time.perf_counter() - start
    best = min((x for x in own if x.fits), key=lambda x: x.key())
    st = plan.stages[0]
    peers = {b.name: b.iteration_ms for b in plan.baselines if b.kind == "tuned peer"}
    return {
        "seconds": round(seconds, 1),
        "search_alone_s": round(alone, 1),
        "search_alone_iteration_ms": round(best.iteration_ms, 1),
        "iteration_ms": round(plan.predicted.iteration_ms, 1),
        "plan": f"PP{len(plan.stages) // plan.schedule.virtual_stages} x DP{st.replicas}"
        + f" x TP{st.tensor_parallel}"
        + (", SP" if st.sequence_parallel else "")
        + (f", {st.sharding}" if st.sharding != "none" else "")
        + f", {plan.schedule.name} v={plan.schedule.virtual_stages}"
        + f", mb {plan.microbatch_size} x {plan.num_microbatches}",
        "simulations": plan.solver.simulations,
        "method": plan.solver.method,
        "tuned_peers_ms": {k: None if v is None else round(v, 1) for k, v in peers.items()},
        # Other work on the machine moves this number: say how busy it was.
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def main() -> None:
    quick = "--quick" in sys.argv
    rows: dict[str, Any] = {}
    if "--tp" in sys.argv:
        old = json.loads(OUT.read_text()) if OUT.exists() else {"rows": {}}
        rows = {**old["rows"], "tp 96x1024": time_tp()}
        print(json.dumps(rows["tp 96x1024"], indent=1))
        OUT.write_text(json.dumps({**old, "rows": rows}, indent=1) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")
        return
    topo64 = uniform_topology(64, bandwidth=50e9, latency_ms=0.002)
    small = chain_profile(200, param_mib=20)
    large = chain_profile(200, param_mib=400)
    rows["dp 200x64"] = time_dp(large, topo64, 128)
    rows["solve 200x64 small"] = time_solve(small, topo64, 128)
    rows["solve 200x64 large"] = time_solve(large, topo64, 128)
    # What `pipeplan solve` does by default: the search plus the four baselines, simulated.
    rows["solve+bl 200x64 small"] = time_solve(small, topo64, 128, baselines=True)
    rows["solve+bl 200x64 large"] = time_solve(large, topo64, 128, baselines=True)
    if not quick:
        start = time.perf_counter()
        baseline_partitions(large, topo64, 1)
        rows["baselines 200x64"] = {"seconds": round(time.perf_counter() - start, 3)}
        gnmt = load_profile(ROOT / "profiles" / "pipedream-gnmt.json")
        topo16 = hetero16()
        rows["ilp 48x16 S=16"] = time_ilp(gnmt, topo16, 16, 32)
        rows["ilp 48x16 S=8"] = time_ilp(gnmt, topo16, 8, 32)
        rows["solve 48x16 gnmt"] = time_solve(gnmt, topo16, 32 * 32)
        rows["tp 96x1024"] = time_tp()
    print(f"{'case':24s} {'seconds':>8s}  details")
    for name, row in rows.items():
        secs = row.get("seconds", row.get("all_depths_s"))
        details = {k: v for k, v in row.items() if k not in ("seconds", "devices")}
        print(f"{name:24s} {secs!s:>8s}  {details}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "rows": rows,
    }
    OUT.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
