"""Measured, not only simulated: pipeplan's plan against the best tuned peer's, both run.

For each bundled example (``examples/mlp.py``, ``cnn.py``, ``gpt.py``) with its committed
profile (``profiles/NAME.json``) on ``topologies/cpu.yaml`` (local CPU processes over gloo):

- pipeplan's plan: ``solve`` with 8 microbatches (every profiled microbatch size,
  ``--schedule auto``);
- the best tuned peer's plan: every peer of :mod:`planner.solve.peers` at its best
  configuration for the same profile, topology and batch (depth x data parallel over the
  processes, microbatch size, the peer's schedules), the fastest of them by the simulator;
  written as a plan with its stages, schedule and prediction.

Both plans are run with ``pipeplan run`` (:func:`planner.runtime.run_plan`, one thread per
process as profiled) for ``--rounds`` rounds (default 3), the order alternating from round
to round (pipeplan first in even rounds, the peer first in odd ones) so that a slow spell of
the machine does not fall on one side. Reported per model: both plans, predicted and median
measured iteration time, each round's measurement, and peer / pipeplan for both. Where the
best peer's plan is pipeplan's plan (``same_plan``), the measured ratio is run-to-run noise.

The numbers are timings: run it on an otherwise idle machine.

Run::

    .venv/bin/python bench/peer_runs.py             # table + bench/results/peer_runs.json
    .venv/bin/python bench/peer_runs.py --quick     # mlp, 1 round, 3 steps
    .venv/bin/python bench/peer_runs.py --models gpt --rounds 5 --steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results" / "peer_runs.json"
MICROBATCHES = 8


def plans_for(name: str, tmp: Path) -> dict[str, Any]:
    """pipeplan's plan and the best tuned peer's plan for one example, saved under ``tmp``."""
    from planner.plan import FileRef, plan_from_simulation
    from planner.profile.schema import load_profile
    from planner.simulate import simulate
    from planner.solve import solve
    from planner.solve.peers import tune_peers
    from planner.solve.search import Search
    from planner.topology import load_topology

    profile_path = ROOT / "profiles" / f"{name}.json"
    topo_path = ROOT / "topologies" / "cpu.yaml"
    profile, topo = load_profile(profile_path), load_topology(topo_path)
    plan = solve(
        profile,
        topo,
        num_microbatches=MICROBATCHES,
        time_limit=20,
        profile_path=str(profile_path),
        topology_path=str(topo_path),
    )
    ours = tmp / f"{name}.pipeplan.plan.json"
    plan.save(ours)
    settings = [(mb, MICROBATCHES) for mb in profile.microbatch_sizes]
    tuned = [b for b in tune_peers(Search(profile, topo), settings) if b.feasible and b.config]
    best = min(tuned, key=lambda b: b.per_sample_ms)
    assert best.config is not None
    config = best.config
    shape = config.shape
    stages = list(shape.stages)
    result = simulate(
        profile,
        topo,
        stages,
        shape.schedule,
        shape.num_microbatches,
        shape.microbatch_size,
        virtual_stages=shape.virtual_stages,
    )
    peer_plan = plan_from_simulation(
        result, stages, profile=FileRef.of_file(profile_path), topology=FileRef.of_file(topo_path)
    )
    theirs = tmp / f"{name}.peer.plan.json"
    peer_plan.save(theirs)
    same = (
        [(s.layers, s.devices, s.recompute) for s in plan.stages]
        == [(s.layers, s.devices, s.recompute) for s in peer_plan.stages]
        and plan.schedule.to_dict() == peer_plan.schedule.to_dict()
        and plan.microbatch_size == peer_plan.microbatch_size
    )
    return {
        "model": name,
        "pipeplan": _describe(plan),
        "peer": f"{best.peer}: {config.describe()}",
        "same_plan": same,
        "paths": (ours, theirs),
        "predicted": (plan.predicted.iteration_ms, peer_plan.predicted.iteration_ms),
        "samples": (
            plan.microbatch_size * plan.num_microbatches,
            peer_plan.microbatch_size * peer_plan.num_microbatches,
        ),
    }


def _describe(plan: Any) -> str:
    stages = ";".join(f"{s.first}-{s.last}:{','.join(s.devices)}" for s in plan.stages)
    sched = plan.schedule.name
    if plan.schedule.virtual_stages > 1:
        sched += f" v={plan.schedule.virtual_stages}"
    return f"{stages} {sched}, mb {plan.microbatch_size} x {plan.num_microbatches}"


def run_once(name: str, plan_path: Path, steps: int) -> float:
    """One ``pipeplan run`` of the plan: its median measured iteration, ms."""
    from planner.runtime import run_plan

    report = run_plan(
        plan_path,
        ROOT / "examples" / f"{name}.py",
        steps=steps,
        warmup=2,
        device="cpu",
        threads=1,
        timeout_s=300,
    )
    return float(report.iteration_ms)


def measure(case: dict[str, Any], rounds: int, steps: int) -> dict[str, Any]:
    """Both plans, ``rounds`` times, alternating which goes first."""
    measured: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for side in order:
            measured[side].append(run_once(case["model"], case["paths"][side], steps))
    # Per sample, scaled to pipeplan's samples per iteration (the batches can differ when
    # the microbatch size does; with --microbatches fixed both run 8 microbatches).
    scale = case["samples"][0] / case["samples"][1]
    ours_ms = statistics.median(measured[0])
    peer_ms = statistics.median(measured[1]) * scale
    return {
        "model": case["model"],
        "pipeplan": case["pipeplan"],
        "best_peer": case["peer"],
        "same_plan": case["same_plan"],
        "predicted_ms": round(case["predicted"][0], 3),
        "peer_predicted_ms": round(case["predicted"][1] * scale, 3),
        "predicted_ratio": round(case["predicted"][1] * scale / case["predicted"][0], 3),
        "measured_ms": round(ours_ms, 3),
        "peer_measured_ms": round(peer_ms, 3),
        "measured_ratio": round(peer_ms / ours_ms, 3),
        "rounds_ms": [round(x, 3) for x in measured[0]],
        "peer_rounds_ms": [round(x * scale, 3) for x in measured[1]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn,gpt")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each plan, order alternating")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("-o", "--output", default=str(OUT))
    ap.add_argument("--quick", action="store_true", help="mlp, 1 round, 3 steps")
    args = ap.parse_args()
    if args.quick:
        args.models, args.rounds, args.steps = "mlp", 1, 3
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            case = plans_for(name, Path(tmp))
            rows.append(measure(case, args.rounds, args.steps))
    print(f"{'model':<5} {'pred peer/pp':>12} {'meas peer/pp':>12}  pipeplan | best peer")
    for r in rows:
        print(
            f"{r['model']:<5} {r['predicted_ratio']:>12.3f} {r['measured_ratio']:>12.3f}  "
            f"{r['pipeplan']} | {r['best_peer']}" + ("  (same plan)" if r["same_plan"] else "")
        )
    payload = {
        "benchmark": "peer_runs",
        "note": (
            "pipeplan's plan and the best tuned peer's plan for each example on "
            "topologies/cpu.yaml, both run with pipeplan run (1 thread per process), rounds "
            "alternating the order; *_ms are medians over the rounds; ratios peer / pipeplan "
            "(> 1: pipeplan faster)."
        ),
        "host": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "load_average_1min": os.getloadavg()[0],
        "rounds": args.rounds,
        "steps": args.steps,
        "rows": rows,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
