"""Scaling on paper: GPT-3 sizes on 64-1024 simulated H100s. DERIVED, NOT MEASURED.

Every per-layer cost comes from the analytic profile of real model code, not from a
profiler run and not from a formula of this script: examples/gpt.py's GPT (embedding with
learned positions, pre-norm blocks of causal self-attention and a 4h GELU MLP, LayerNorm
and the logit layer) at GPT-3 sizes, built on the meta device and counted by
``pipeplan profile --analytic --gpu h100-sxm --precision bf16`` (planner/profile/analytic.py:
FLOPs and bytes of every aten operation, a roofline of the H100 SXM datasheet at the
catalog's default efficiencies, activation bytes as torch's mixed precision keeps them).

Models (Brown et al. 2020, table 2.1): 1.3B, 6.7B, 13B, 175B; sequence 2048, vocabulary
50257; microbatch sizes 1 and 2. Clusters: ``pipeplan topology cluster --preset dgx-h100
--network fat-tree`` (8 H100 SXM per node on a 450 GB/s NVSwitch, one 400 Gbit/s
InfiniBand NIC per GPU on a non-blocking fat tree) with 64 to 1024 GPUs. Global batch 512
sequences (1M tokens). Reported: how long ``solve`` takes (as ``pipeplan solve`` runs it,
the tuned peers of ``planner.solve.peers`` included), how far its simulated plan is from
the global lower bound (every GPU busy with an equal share, no communication) and from the
search's bound for the plan itself (its busiest GPU's compute + all-reduce + step, with the
pipeline's fill and drain), and the best tuned peer (DeepSpeed, Megatron-LM,
torch.distributed.pipelining, ... each at its best depth x data parallel, microbatch and
schedule) against pipeplan's plan and against its search alone. ``profile_s`` (in the
JSON's ``profiles``) is how long each analytic profile took here.

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
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from plan_summary import plan_summary
from svgplot import line_plot

from planner.errors import InfeasibleError
from planner.profile import Profile
from planner.profile.analytic import analytic_profile
from planner.solve import solve
from planner.topology import Topology, topology_from_dict
from planner.topology.cluster import cluster_dict

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
GPU, PRECISION, SIZES = "h100-sxm", "bf16", (1, 2)
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


def model_file(name: str, folder: Path) -> Path:
    """A model.py of examples/gpt.py's GPT at GPT-3 size ``name``."""
    layers, hidden, heads = MODELS[name]
    path = folder / f"{name}.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(ROOT / "examples")!r})
            import torch
            from gpt import GPT

            def build_model():
                return GPT(vocab={VOCAB}, seq_len={SEQ}, d_model={hidden}, n_head={heads},
                           n_layer={layers})

            def sample_batch(b):
                t = torch.randint(0, {VOCAB}, (b, {SEQ} + 1))
                return t[:, :-1].contiguous(), t[:, 1:].contiguous()
            """
        )
    )
    return path


def gpt3_profile(name: str, folder: Path) -> tuple[Profile, float]:
    """The analytic profile of GPT-3 ``name`` on the H100 SXM, and the seconds it took."""
    start = time.perf_counter()
    profile = analytic_profile(model_file(name, folder), SIZES, gpu=GPU, precision=PRECISION)
    return profile, time.perf_counter() - start


def cluster(n: int) -> Topology:
    """``n`` H100s: DGX H100 nodes on a non-blocking fat tree (``topology cluster``)."""
    return topology_from_dict(
        cluster_dict("dgx-h100", n // 8, network="fat-tree"), f"<dgx-h100 x{n // 8}>"
    )


def measure(model: str, gpus: int, profile: Profile) -> dict[str, Any]:
    topo = cluster(gpus)
    row: dict[str, Any] = {"model": model, "gpus": gpus}
    start = time.perf_counter()
    try:
        # A limit that never stops the search: the table reports what the whole search takes
        # (the default 60 s would stop the 175B solves).
        plan = solve(profile, topo, global_batch=GLOBAL_BATCH, time_limit=3600.0)
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
    profiles: dict[str, dict[str, Any]] = {}
    print("DERIVED, NOT MEASURED: analytic GPT-3 per-layer costs on simulated H100 clusters")
    print(
        f"{'model':<10} {'GPUs':>5} {'solve s':>8} {'plan':<28} {'iter s':>7} {'vs LB':>6} "
        f"{'vs peer':>7} {'alone':>6}"
    )
    folder = Path(tempfile.mkdtemp(prefix="scaling_on_paper-"))
    for model in models:
        profile, seconds = gpt3_profile(model, folder)
        profiles[model] = {
            "profile_s": round(seconds, 2),
            "parameters": sum(layer.param_count for layer in profile.layers),
            "forward_tflop_per_sequence": round(
                sum(t.forward_flops or 0 for t in profile.measurement(1).layers) / 1e12, 3
            ),
        }
        for n in gpus:
            if model == "gpt3-175b" and n > 64 and not args.all:
                continue
            r = measure(model, n, profile)
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
            "DERIVED FROM THE ANALYTIC MODEL, NOT MEASURED: per-layer costs from analytic "
            f"profiles of examples/gpt.py's GPT at GPT-3 sizes (--analytic --gpu {GPU} "
            f"--precision {PRECISION}: FLOPs and bytes per aten op, roofline at the catalog's "
            "default efficiencies), simulated DGX H100 clusters; only solve_s and profile_s "
            "are measurements (of pipeplan on this machine)."
        ),
        "machine": f"{os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "global_batch": GLOBAL_BATCH,
        "profiles": profiles,
        "rows": rows,
    }
    (RESULTS / "scaling_on_paper.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {RESULTS / 'scaling_on_paper.json'}")


if __name__ == "__main__":
    main()
