"""Scaling on paper: GPT-3 sizes on 64-1024 simulated H100s. DERIVED, NOT MEASURED.

Every per-layer cost here comes from formulas, not from a profiler:

- a transformer block of hidden size ``h`` at sequence length ``s`` and microbatch ``b``
  does ``24 b s h^2 + 4 b s^2 h`` forward FLOPs (Megatron-LM's count), backward twice that,
  split evenly into its input- and weight-gradient halves; the head ``2 b s h V``;
- time = FLOPs / (989 TFLOP/s bf16 dense peak x an assumed 45 % efficiency);
- 12 h^2 parameters per block, bf16 weights (2 B each), mixed-precision Adam state
  (12 B per parameter); activations kept for backward ``s b h (34 + 5 a s / h)`` bytes
  (Korthikanti et al. 2022, no recompute), the block output ``2 s b h`` bytes.

Models (Brown et al. 2020, table 2.1): 1.3B, 6.7B, 13B, 175B; sequence 2048, vocabulary
50257. Clusters: DGX-H100-like hosts (8 GPUs on a 450 GB/s NVSwitch, one 400 Gbit/s
InfiniBand NIC per GPU, as ``topologies/two-node-ib.yaml``) with 64 to 1024 GPUs. Global
batch 512 sequences (1M tokens). Reported: how long ``solve`` takes (as ``pipeplan solve``
runs it, the tuned peers of ``planner.solve.peers`` included), how far its simulated plan
is from the global lower bound (every GPU busy with an equal share, no communication) and from
the search's bound for the plan itself (its busiest GPU's compute + all-reduce + step, with
the pipeline's fill and drain), and the best tuned peer (DeepSpeed, Megatron-LM,
torch.distributed.pipelining, ... each at its best depth x data parallel, microbatch and
schedule) against pipeplan's plan and against its search alone.

175B runs on 64 GPUs only by default: its 64-stage plans with 512 microbatches make each
simulation ~0.3 s and one solve ~1 minute on a 2-core CPU; ``--all`` adds 128-1024 GPUs
(several minutes each).

Run::

    .venv/bin/python bench/scaling_on_paper.py          # table + bench/results/<name>.json
    .venv/bin/python bench/scaling_on_paper.py --quick  # 1.3B and 13B on 64 GPUs
    .venv/bin/python bench/scaling_on_paper.py --all    # 175B on every cluster too (slow)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from plan_summary import plan_summary
from svgplot import line_plot

from planner.errors import InfeasibleError
from planner.profile import Layer, LayerTiming, Measurement, Profile
from planner.solve import solve
from planner.topology import Topology, topology_from_dict

RESULTS = Path(__file__).resolve().parent / "results"
PEAK_FLOPS = 989e12  # H100 SXM bf16 dense
EFFICIENCY = 0.45
SEQ, VOCAB = 2048, 50257
GLOBAL_BATCH = 512  # sequences (1M tokens); GPT-3 175B used 1536
# name: (layers, hidden, heads)
MODELS = {
    "gpt3-1.3b": (24, 2048, 16),
    "gpt3-6.7b": (32, 4096, 32),
    "gpt3-13b": (40, 5120, 40),
    "gpt3-175b": (96, 12288, 96),
}
GPUS = [64, 128, 256, 512, 1024]


def _ms(flops: float) -> float:
    return flops / (PEAK_FLOPS * EFFICIENCY) * 1e3


def _timing(fwd_flops: float, out_bytes: int, saved_bytes: int) -> LayerTiming:
    f = _ms(fwd_flops)
    return LayerTiming(f, 2 * f, f, f, out_bytes, saved_bytes)


def gpt3_profile(name: str, microbatch_sizes: tuple[int, ...] = (1, 2)) -> Profile:
    """An analytic profile: embedding, ``L`` blocks, head (LayerNorm + logits)."""
    n_layers, h, a = MODELS[name]
    block_params = 12 * h * h
    layers = [Layer("embedding", VOCAB * h, 2 * VOCAB * h, 12 * VOCAB * h)]
    layers += [
        Layer(f"block{i}", block_params, 2 * block_params, 12 * block_params)
        for i in range(n_layers)
    ]
    layers.append(Layer("head", VOCAB * h, 2 * VOCAB * h, 12 * VOCAB * h))
    measurements = []
    for b in microbatch_sizes:
        out = 2 * SEQ * b * h
        saved = int(SEQ * b * h * (34 + 5 * a * SEQ / h))
        block_flops = 24 * b * SEQ * h * h + 4 * b * SEQ * SEQ * h
        timings = [LayerTiming(0.01, 0.02, 0.01, 0.01, out, out)]  # a lookup: ~free
        timings += [_timing(block_flops, out, saved) for _ in range(n_layers)]
        timings.append(_timing(2 * b * SEQ * h * VOCAB, 4 * b * SEQ * VOCAB, 4 * b * SEQ * VOCAB))
        measurements.append(Measurement(b, 8 * b * SEQ, timings))
    return Profile(
        name,
        layers,
        measurements,
        device="cuda",
        dtype="bfloat16",
        meta={"origin": "analytic (bench/scaling_on_paper.py), not measured"},
    )


def cluster(n: int) -> Topology:
    """``n`` H100s in hosts of 8: NVSwitch inside, one 400 Gbit/s IB NIC per GPU."""
    return topology_from_dict(
        {
            "name": f"h100-ib-{n}",
            "hosts": {
                "count": n // 8,
                "devices": {"count": 8, "memory": "80 GiB", "kind": "H100"},
                "switch": {"name": "nvswitch", "bandwidth": "450 GB/s", "latency": "1 us"},
                "network": {"name": "ib", "bandwidth": "400 Gbit/s", "latency": "2.5 us"},
            },
        },
        f"<h100-ib-{n}>",
    )


def measure(model: str, gpus: int) -> dict[str, Any]:
    profile = gpt3_profile(model)
    topo = cluster(gpus)
    row: dict[str, Any] = {"model": model, "gpus": gpus}
    start = time.perf_counter()
    try:
        plan = solve(profile, topo, global_batch=GLOBAL_BATCH, time_limit=20.0)
    except InfeasibleError as exc:
        row.update(solve_s=round(time.perf_counter() - start, 2), plan=f"infeasible: {exc}"[:80])
        return row
    seconds = round(time.perf_counter() - start, 2)
    summary = plan_summary(profile, topo, plan)
    row.update(solve_s=seconds)
    row.update({k: summary[k] for k in ("stages", "replicas", "schedule")})
    row.update(
        microbatch=f"{plan.num_microbatches}x{plan.microbatch_size}",
        iteration_s=round(plan.predicted.iteration_ms / 1e3, 3),
    )
    quality = ("vs_lower_bound", "vs_plan_bound", "best_peer", "vs_best_peer", "search_alone")
    row.update({k: summary[k] for k in quality})
    return row


def plots(rows: list[dict[str, Any]], gpus: list[int]) -> None:
    """Solve seconds and plan / lower bound against GPUs, one line per model."""
    for key, name, label, logy in (
        ("solve_s", "scaling_on_paper.svg", "solve seconds", True),
        ("vs_lower_bound", "scaling_on_paper_quality.svg", "plan / lower bound", False),
    ):
        series: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            if r.get(key):
                series.setdefault(r["model"], []).append((r["gpus"], r[key]))
        series = {m: pts for m, pts in series.items() if len(pts) > 1}
        if not series:
            continue
        (RESULTS / name).write_text(
            line_plot(
                series,
                title=f"{label}, GPT-3 sizes on H100 clusters (derived, not measured)",
                xlabel="GPUs",
                ylabel=label,
                xticks=gpus,
                logy=logy,
                width=760,
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1.3B and 13B on 64 GPUs")
    ap.add_argument("--all", action="store_true", help="175B on 128-1024 GPUs too (slow)")
    args = ap.parse_args()
    models = ["gpt3-1.3b", "gpt3-13b"] if args.quick else list(MODELS)
    gpus = [64] if args.quick else GPUS
    rows = []
    print("DERIVED, NOT MEASURED: analytic GPT-3 per-layer costs on simulated H100 clusters")
    print(
        f"{'model':<10} {'GPUs':>5} {'solve s':>8} {'plan':<28} {'iter s':>7} {'vs LB':>6} "
        f"{'vs peer':>7} {'alone':>6}"
    )
    for model in models:
        for n in gpus:
            if model == "gpt3-175b" and n > 64 and not args.all:
                continue
            r = measure(model, n)
            rows.append(r)
            plan = (
                f"{r['stages']}st x{r['replicas']} {r['schedule']} {r['microbatch']}"
                if "stages" in r
                else r["plan"]
            )
            print(
                f"{model:<10} {n:>5} {r['solve_s']:>8.2f} {plan:<28} "
                f"{r.get('iteration_s', '-')!s:>7} {r.get('vs_lower_bound', '-')!s:>6} "
                f"{r.get('vs_best_peer', '-')!s:>7} {r.get('search_alone', '-')!s:>6}",
                flush=True,
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.quick:
        plots(rows, gpus)
    payload = {
        "benchmark": "scaling_on_paper",
        "note": (
            "DERIVED, NOT MEASURED: per-layer costs from FLOP and byte formulas "
            f"({EFFICIENCY:.0%} of {PEAK_FLOPS / 1e12:.0f} TFLOP/s), simulated clusters; "
            "only solve_s is a measurement (of the planner on this machine)."
        ),
        "machine": f"{os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "global_batch": GLOBAL_BATCH,
        "rows": rows,
    }
    (RESULTS / "scaling_on_paper.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {RESULTS / 'scaling_on_paper.json'}")


if __name__ == "__main__":
    main()
