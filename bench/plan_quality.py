"""Plan quality: pipeplan against every peer at its best, and against the lower bound.

For every profile under ``profiles/`` (the examples' and the imported PipeDream ones) and
every topology under ``topologies/``, ``solve`` with its defaults (2 x devices microbatches,
every profiled microbatch size, ``--schedule auto``), and report, all judged by the same
simulator on the same profile, topology and batch:

- ``vs_best_peer``: the best *tuned* peer's time / pipeplan's. Each peer (DeepSpeed,
  torchgpipe, Megatron-LM, torch.distributed.pipelining, PipeDream, plain data parallelism)
  is its partitioner plus the sweep its users do: pipeline depth over the divisors of the
  device count, data parallelism over the rest in device order, every profiled microbatch
  size, its own schedules, recompute where memory needs it
  (:mod:`planner.solve.peers`); ``best_peer`` names the winner and its configuration;
- ``search_alone``: the same ratio for what pipeplan's own search finds before the peers'
  plans join its pool and before the tie-break (``solve`` seeds the pool with them, so its
  fastest plan is never slower than a peer by construction; this column is the one that
  can lose); ``vs_best_peer`` may be below 1 by up to the tie tolerance, where the final
  choice prefers a simpler plan within the profile's noise (docs/solve.md);
- ``verdict``: ``ahead``, ``equal``, ``tie`` (the peer is faster by no more than the solve's
  ``tie_tolerance``, reported per case: the two plans are equal within the profile's noise,
  and issue 23 asks the solver not to flip between such plans) or ``behind`` (faster beyond
  it: a defect, counted in the summary's ``behind_peer``, which must stay 0);
- ``vs_peer_defaults``: the best of the old one-stage-per-device rows (``peer default``);
- ``peer_vs_bound``: the best peer / the global lower bound (every device busy all the
  time with an equal share of the work at its speed): no plan can beat a peer by more;
  ``vs_bound``: pipeplan / that bound.

With tensor parallelism: the bundled gpt profile with synthetic Megatron-style entries for
degrees 2, 4 and 8, sequence parallelism included (``planner.cost.synthetic_tensor_parallel``:
every layer split, the embedding and head as vocab-parallel layers; exact numbers, not a
profiler run), profile ``gpt+tp``; and ``hf-llama+tp``: ``examples/hf_llama.py`` (a small
Hugging Face Llama, grouped-query attention with 2 key/value heads, so TP 2 at most) counted
by the
analytic profiler on the H100 SXM with its TP 2 shards, with and without sequence
parallelism (transformers' ``base_model_tp_plan``, the example's ``tp_plan()`` for SP):
real shard counts, not synthetic ones (left out, with the reason printed, where
transformers is not installed). Both on every topology: the search then explores TP, SP and
ZeRO-1 / FSDP too, and the tuned peers are Megatron-LM and torchtitan with TP, DeepSpeed
ZeRO-3 and FSDP beside the others (``planner.solve.peers.TP_PEERS``).

Summary: geometric mean and worst ``vs_best_peer`` (and ``search_alone``) over the uneven
topologies (uneven links, mixed devices, two nodes, irregular fabric) and over all cases
of the bundled profiles, and the same over the ``gpt+tp`` and ``hf-llama+tp`` cases (``tp_...``).
Everything is simulated and deterministic (no timings: solve times are bench/solve_time.py's
and bench/solver_scaling.py's), so the results do not depend on the machine.

Run::

    .venv/bin/python bench/plan_quality.py          # table + bench/results/plan_quality.json
    .venv/bin/python bench/plan_quality.py --quick  # mlp and gpt on cpu and hetero
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path
from typing import Any

from planner.cost import synthetic_tensor_parallel
from planner.errors import InfeasibleError
from planner.profile import Profile, load_profile
from planner.profile.analytic import analytic_profile
from planner.profile.tensor_parallel import TensorParallelRequest
from planner.solve import solve
from planner.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "plan_quality.json"
QUICK_PROFILES = ("mlp", "gpt")
QUICK_TOPOLOGIES = ("cpu", "hetero")
# Uneven links, mixed devices, two nodes, an irregular fabric.
UNEVEN = ("dgx1-v100", "hetero", "two-node-ib", "nvlink-pairs")
TP_NAME = "gpt+tp"
LLAMA_NAME = "hf-llama+tp"
TP_NAMES = (TP_NAME, LLAMA_NAME)


def _ratio(a: float | None, b: float) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def _plan_shape(plan: Any) -> str:
    st0 = plan.stages[0]
    reps = sorted({s.replicas for s in plan.stages})
    shape = f"{len(plan.stages)}st x {'/'.join(map(str, reps))}"
    degrees = [s.tensor_parallel for s in plan.stages]
    sp = ", SP" if any(s.sequence_parallel for s in plan.stages) else ""
    if len(set(degrees)) > 1:  # a degree per stage (issue #22)
        shape += " x TP " + "/".join(map(str, degrees)) + sp
    elif st0.tensor_parallel > 1:
        shape += f" x TP{st0.tensor_parallel}" + sp
    shardings = sorted({s.sharding for s in plan.stages} - {"none"})
    if shardings:
        shape += ", " + "/".join(shardings)
    sched = plan.schedule.name
    if plan.schedule.virtual_stages > 1:
        sched += f" v={plan.schedule.virtual_stages}"
    return f"{shape}, mb {plan.microbatch_size} x {plan.num_microbatches}, {sched}"


def tp_profile() -> Profile:
    """The bundled gpt profile with synthetic TP 2/4/8 entries (module docstring)."""
    return synthetic_tensor_parallel(load_profile(ROOT / "profiles" / "gpt.json"), (2, 4, 8))


def llama_tp_profile() -> Profile | str:
    """``examples/hf_llama.py`` counted on the H100 SXM with its TP 2 shards (module
    docstring), or why not (transformers missing)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed (pip install -e '.[hf]')"
    return analytic_profile(
        ROOT / "examples" / "hf_llama.py",
        [1, 2],
        gpu="h100-sxm",
        tensor_parallel=TensorParallelRequest((2,), sequence_parallel=True),
    )


def run_case(profile_path: Path | tuple[str, Profile], topo_path: Path) -> dict[str, Any]:
    """One profile (a file, or a name and a profile) on one topology: pipeplan's plan
    against each tuned peer."""
    if isinstance(profile_path, tuple):
        name, profile = profile_path
    else:
        name, profile = profile_path.stem, load_profile(profile_path)
    topo = load_topology(topo_path)
    case = {"profile": name, "topology": topo_path.stem}
    try:
        plan = solve(profile, topo, time_limit=60.0)
    except InfeasibleError as exc:
        return {**case, "infeasible": str(exc)}
    it = plan.predicted.iteration_ms
    alone = plan.solver.without_peers.iteration_ms
    bound = plan.predicted.global_lower_bound_ms
    tuned = [b for b in plan.baselines if b.tuned]
    defaults = [b for b in plan.baselines if b.kind == "peer default"]
    feasible = [b for b in tuned if b.feasible]
    best = min(feasible, key=lambda b: b.iteration_ms) if feasible else None
    best_default = min(
        (b.iteration_ms for b in defaults if b.feasible and b.iteration_ms), default=None
    )
    peers = {
        b.name: {"ratio": _ratio(b.iteration_ms, it), "configuration": b.configuration or b.reason}
        for b in tuned
    }
    tolerance = plan.solver.tie_tolerance or 0.0
    return {
        **case,
        "plan": _plan_shape(plan),
        "best_peer": None if best is None else f"{best.name}: {best.configuration}",
        "vs_best_peer": None if best is None else _ratio(best.iteration_ms, it),
        "tie_tolerance": round(tolerance, 4),
        "verdict": None if best is None else verdict(best.iteration_ms, it, tolerance),
        "search_alone": None if best is None else _ratio(best.iteration_ms, alone),
        "vs_peer_defaults": _ratio(best_default, it),
        "peer_vs_bound": None if best is None else _ratio(best.iteration_ms, bound),
        "vs_bound": _ratio(it, bound),
        "iteration_ms": round(it, 4),
        "search_alone_ms": round(alone, 4),
        "origin": plan.solver.method.rsplit("-> ", 1)[-1],
        "peers": peers,
    }


def verdict(peer_ms: float, pipeplan_ms: float, tolerance: float) -> str:
    """``ahead`` (pipeplan faster), ``equal``, ``tie`` (the peer faster, but by no more than
    the solve's tie tolerance: within the profile's noise, where ``solve`` prefers the
    simpler plan, docs/solve.md) or ``behind`` (the peer faster beyond it: a defect).

    Example::

        verdict(96.0, 100.0, 0.05)   # "tie": 100 <= 96 * 1.05
    """
    if pipeplan_ms < peer_ms * (1.0 - 1e-9):
        return "ahead"
    if pipeplan_ms <= peer_ms * (1.0 + 1e-9):
        return "equal"
    return "tie" if pipeplan_ms <= peer_ms * (1.0 + tolerance) * (1.0 + 1e-9) else "behind"


def _geomean(xs: list[float]) -> float | None:
    return round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 4) if xs else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric mean and worst ratio, on the uneven topologies and over all cases."""
    out: dict[str, Any] = {}
    scopes = (
        ("uneven", lambda r: r["profile"] not in TP_NAMES and r["topology"] in UNEVEN),
        ("all", lambda r: r["profile"] not in TP_NAMES),
        ("tp_uneven", lambda r: r["profile"] in TP_NAMES and r["topology"] in UNEVEN),
        ("tp_all", lambda r: r["profile"] in TP_NAMES),
    )
    for scope, keep in scopes:
        for key in ("vs_best_peer", "search_alone"):
            xs = [r[key] for r in rows if keep(r) and r.get(key) is not None]
            out[f"{scope}_{key}_geomean"] = _geomean(xs)
            out[f"{scope}_{key}_worst"] = min(xs) if xs else None
    out["losses"] = sum(1 for r in rows if (r.get("search_alone") or 1.0) < 1.0 - 1e-9)
    out["ties_below_peer"] = sum(1 for r in rows if r.get("verdict") == "tie")
    out["behind_peer"] = sum(1 for r in rows if r.get("verdict") == "behind")
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="mlp and gpt on cpu and hetero")
    args = ap.parse_args()
    profiles = sorted((ROOT / "profiles").glob("*.json"))
    topologies = sorted((ROOT / "topologies").glob("*.yaml"))
    if args.quick:
        profiles = [p for p in profiles if p.stem in QUICK_PROFILES]
        topologies = [t for t in topologies if t.stem in QUICK_TOPOLOGIES]
    sources: list[Path | tuple[str, Profile]] = [*profiles, (TP_NAME, tp_profile())]
    llama = llama_tp_profile()
    if isinstance(llama, str):
        print(f"{LLAMA_NAME} left out: {llama}")
    else:
        sources.append((LLAMA_NAME, llama))
    cases = [run_case(p, t) for p in sources for t in topologies]
    print("profile | topology | pipeplan | best tuned peer | vs peer | search alone")
    for r in cases:
        if "infeasible" in r:
            print(f"{r['profile']} | {r['topology']} | infeasible: {r['infeasible'][:70]}")
            continue
        print(
            f"{r['profile']} | {r['topology']} | {r['plan']} | {r['best_peer']} | "
            f"{_fmt(r['vs_best_peer'])} | {_fmt(r['search_alone'])}"
        )
    rows = [r for r in cases if "infeasible" not in r]
    summary = summarise(rows)
    for key, value in summary.items():
        print(f"{key}: {value}")
    table = [
        {k: r.get(k) for k in ("profile", "topology", "plan", "best_peer")}
        | {
            k: r.get(k)
            for k in (
                "vs_best_peer",
                "verdict",
                "search_alone",
                "vs_peer_defaults",
                "peer_vs_bound",
                "vs_bound",
            )
        }
        for r in rows
    ]
    payload = {
        "benchmark": "plan_quality",
        "note": (
            "Simulated, deterministic. vs_best_peer = best tuned peer's time / pipeplan's "
            "(>= 1 means pipeplan is at least as fast; verdict tie: the peer faster within the "
            "solve's tie tolerance, the profile's noise; behind: beyond it); search_alone = "
            "the same for pipeplan's "
            "search before peer plans join its pool; vs_peer_defaults = best one-stage-per-"
            "device row; peer_vs_bound = best peer / global lower bound (no plan beats a "
            "peer by more); uneven = " + ", ".join(UNEVEN) + "."
        ),
        "python": platform.python_version(),
        **summary,
        # One line for the report (lists are left out of its bullets).
        "infeasible": "; ".join(
            f"{r['profile']} on {r['topology']}: {r['infeasible'][:100]}"
            for r in cases
            if "infeasible" in r
        )
        or None,
        "rows": table,
        "cases": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
