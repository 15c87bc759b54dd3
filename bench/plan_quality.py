"""Plan quality: pipeplan against the baselines and the lower bound, on every bundled case.

For every profile under ``profiles/`` (the examples' profiles and the imported PipeDream
ones) and every topology under ``topologies/``, ``solve`` with its defaults (2 x devices
microbatches, every profiled microbatch size, ``--schedule auto``) and report

- each baseline's simulated iteration time divided by pipeplan's (uniform, parameter-
  balanced, time-balanced, PipeDream; all placed in device order, recompute only where
  memory needs it, 1F1B, the best microbatch size for each); "-" = does not fit;
- pipeplan's time divided by the lower bound (every device busy all the time with an
  equal share of the work at its speed: not reachable on heterogeneous devices or where
  communication or memory forces a pipeline), and divided by its own plan's simulator
  bound (max of busiest device, average work, one microbatch's critical path).

Run::

    .venv/bin/python bench/plan_quality.py        # table + bench/results/plan_quality.json
    .venv/bin/python bench/plan_quality.py --quick  # mlp and gpt on cpu and dgx1-v100
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from planner.errors import InfeasibleError
from planner.profile import load_profile
from planner.solve import solve
from planner.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "plan_quality.json"
QUICK_PROFILES = ("mlp", "gpt")
QUICK_TOPOLOGIES = ("cpu", "dgx1-v100")
BASELINES = ("uniform", "parameter-balanced", "time-balanced", "pipedream")


def run_case(profile_path: Path, topo_path: Path) -> dict[str, Any]:
    profile = load_profile(profile_path)
    topo = load_topology(topo_path)
    start = time.perf_counter()
    try:
        plan = solve(profile, topo, time_limit=60.0)
    except InfeasibleError as exc:
        return {"profile": profile_path.stem, "topology": topo_path.stem, "infeasible": str(exc)}
    seconds = time.perf_counter() - start
    it = plan.predicted["iteration_ms"]
    ratios: dict[str, float | None] = {}
    for row in plan.baselines:
        ok = row["feasible"] and row["iteration_ms"] is not None
        ratios[row["name"]] = round(row["iteration_ms"] / it, 3) if ok else None
    feasible = [r for r in ratios.values() if r is not None]
    return {
        "profile": profile_path.stem,
        "topology": topo_path.stem,
        "seconds": round(seconds, 2),
        "iteration_ms": round(it, 3),
        "stages": len(plan.stages),
        "devices_used": sum(len(s.devices) for s in plan.stages),
        "schedule": plan.schedule["name"],
        "microbatch": f"{plan.num_microbatches}x{plan.microbatch_size}",
        "baseline_ratio": ratios,
        "best_baseline_ratio": min(feasible) if feasible else None,
        "vs_lower_bound": round(it / plan.predicted["global_lower_bound_ms"], 3),
        "vs_plan_bound": round(it / plan.predicted["plan_lower_bound_ms"], 3),
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> None:
    profiles = sorted((ROOT / "profiles").glob("*.json"))
    topologies = sorted((ROOT / "topologies").glob("*.yaml"))
    if "--quick" in sys.argv:  # the two example profiles on the two smallest machines
        profiles = [p for p in profiles if p.stem in QUICK_PROFILES]
        topologies = [t for t in topologies if t.stem in QUICK_TOPOLOGIES]
    rows = [run_case(p, t) for p in profiles for t in topologies]
    head = ["profile", "topology", "plan", *BASELINES, "best", "vs LB", "vs plan LB", "s"]
    print(" | ".join(head))
    for r in rows:
        if "infeasible" in r:
            print(f"{r['profile']} | {r['topology']} | infeasible: {r['infeasible'][:60]}")
            continue
        plan = f"{r['stages']}st/{r['devices_used']}dev {r['schedule']} {r['microbatch']}"
        cells = [_fmt(r["baseline_ratio"].get(b)) for b in BASELINES]
        print(
            " | ".join(
                [
                    r["profile"],
                    r["topology"],
                    plan,
                    *cells,
                    _fmt(r["best_baseline_ratio"]),
                    _fmt(r["vs_lower_bound"]),
                    _fmt(r["vs_plan_bound"]),
                    str(r["seconds"]),
                ]
            )
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": platform.machine(), "python": platform.python_version(), "rows": rows}
    OUT.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
