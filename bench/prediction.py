"""Prediction accuracy: measured / predicted iteration time of plans for the bundled examples.

For each example model (``examples/*.py``) a profile measured just before (at the
microbatch sizes of the committed one; ``--stored-profiles``: the committed profile in
``profiles/``) is solved for a 2-process version of
``topologies/cpu.yaml`` (2 processes on this 2-core machine, one thread each, as profiled;
the 4-process topology would oversubscribe the cores) -- row ``solved`` -- and, so that a
pipeline is measured whatever the solver picks, the best 2-stage 1F1B pipeline by the
simulator -- row ``pipeline``. Each plan is run with ``pipeplan run --device cpu``
``--rounds`` times (default 3), round robin over the plans, so that a slow spell of the
machine falls on one run of several plans rather than on every run of one. The ratio is
the median measured iteration time over the rounds / the predicted one (target within 15%
on CPU); ``round_ratios`` lists each run's. With ``--device cuda`` the same is done on the
local GPUs with a profile measured there (target within 10%); the device is named in the
results.

The prediction includes the optimizer step (the profile's per-layer ``optimizer_ms``); the
table also shows the ratio without the measured optimizer step (``ratio_no_step``), and
``compute`` = how much slower the stages' own forward/backward ran inside the run than the
profile says (the largest stage ratio of ``run --calibrate``): when it is close to the
ratio, the gap is the machine (load, cores shared), not the runtime's scheduling.

Run::

    .venv/bin/python bench/prediction.py                 # table + bench/results/prediction.json
    .venv/bin/python bench/prediction.py --models mlp --steps 5
    .venv/bin/python bench/prediction.py --quick         # mlp, 3 steps, 1 round, committed profile
    .venv/bin/python bench/prediction.py --stored-profiles
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CPU2 = """schema: pipeplan.topology/v1
name: cpu-local-2
allreduce_efficiency: 0.2
devices:
  - {name: "cpu{0..1}", memory: 4 GiB, speed: 1.0, host: localhost, kind: cpu}
switches:
  - {name: loopback, kind: loopback}
links:
  - {between: ["cpu{0..1}", loopback], bandwidth: 3 GB/s, latency: 35 us, kind: gloo-tcp}
"""


def _profile(name: str, device: str, tmp: Path, fresh: bool = True) -> Path:
    """The example's profile: measured now (``fresh``, the default: a user profiles, solves
    and runs on the machine as it is now) at the committed profile's microbatch sizes, or
    the committed one in ``profiles/`` where it still matches the source."""
    from planner.fileio import sha256_file
    from planner.profile.measure import profile_model
    from planner.profile.schema import load_profile

    source = ROOT / "examples" / f"{name}.py"
    stored = ROOT / "profiles" / f"{name}.json"
    sizes = [4, 8, 16]
    if device == "cpu" and stored.exists():
        prof = load_profile(stored)
        sizes = [m.microbatch_size for m in prof.measurements]
        if prof.source_sha256 == sha256_file(source) and not fresh:
            return stored
    measured = profile_model(source, sizes, device=device, repeat=5, warmup=2)
    out = tmp / f"{name}.json"
    measured.save(out)
    return out


def _pipeline_plan(profile_path: Path, topo_path: Path, mbs: int):  # type: ignore[no-untyped-def]
    """The best 2-stage 1F1B pipeline (one stage per process) by the simulator."""
    from planner.plan import FileRef, parse_stages, plan_from_simulation
    from planner.profile.schema import load_profile
    from planner.simulate import simulate
    from planner.topology import load_topology

    profile, topo = load_profile(profile_path), load_topology(topo_path)
    n = profile.num_layers
    best = None
    for cut in range(n - 1):
        stages = parse_stages(f"0-{cut}:cpu0;{cut + 1}-{n - 1}:cpu1")
        r = simulate(profile, topo, stages, "1f1b", 8, mbs)
        if best is None or r.iteration_ms < best[0].iteration_ms:
            best = (r, stages)
    assert best is not None
    r, stages = best
    return plan_from_simulation(
        r, stages, profile=FileRef.of_file(profile_path), topology=FileRef.of_file(topo_path)
    )


def make_plan(
    name: str, device: str, tmp: Path, kind: str = "solved", fresh: bool = True
) -> tuple[Path, Path]:
    """The model's plan of this kind, saved; returns (plan path, profile path)."""
    from planner.profile.schema import load_profile
    from planner.solve import solve
    from planner.topology import load_topology

    profile_path = tmp / f"{name}.json"
    if kind == "solved" or not profile_path.exists():  # both plans of a model: one profile
        profile_path = _profile(name, device, tmp, fresh)
    topo_path = tmp / "cpu2.yaml"
    topo_path.write_text(CPU2)
    plan = solve(
        load_profile(profile_path),
        load_topology(topo_path),
        num_microbatches=8,
        schedule="1f1b",
        time_limit=20,
        profile_path=str(profile_path),
        topology_path=str(topo_path),
    )
    if kind == "pipeline":
        plan = _pipeline_plan(profile_path, topo_path, plan.microbatch_size)
    plan_path = tmp / f"{name}.{kind}.plan.json"
    plan.save(plan_path)
    return plan_path, profile_path


def measure(name: str, plan_path: Path, device: str, steps: int) -> dict[str, float]:
    """One ``run`` of the plan: its median step, optimizer step and compute ratio."""
    from planner.runtime import run_plan

    report = run_plan(
        plan_path, ROOT / "examples" / f"{name}.py", steps=steps, warmup=2, device=device,
        threads=1, timeout_s=300,
    )  # fmt: skip
    step_ms = max((v for k, v in report.stage_ms.items() if k.startswith("STEP")), default=0.0)
    return {
        "iteration_ms": report.iteration_ms,
        "step_ms": step_ms,
        # How much slower the stages' own compute ran than profiled (load, contention).
        "compute_ratio": report.compute_ratio or 1.0,
    }


def summarise(
    name: str, kind: str, device: str, plan_path: Path, runs: list[dict[str, float]]
) -> dict[str, object]:
    """A row: the plan, its prediction, and the medians of its runs."""
    from planner.plan import Plan

    plan = Plan.load(plan_path)
    predicted = float(plan.predicted.iteration_ms)
    measured = statistics.median(r["iteration_ms"] for r in runs)
    step = statistics.median(r["step_ms"] for r in runs)
    return {
        "model": name,
        "kind": kind,
        "device": device,
        "stages": [[s.first, s.last, s.devices, s.recompute] for s in plan.stages],
        "schedule": plan.schedule.name,
        "microbatches": f"{plan.num_microbatches} x {plan.microbatch_size}",
        "predicted_ms": round(predicted, 3),
        "measured_ms": round(measured, 3),
        "ratio": round(measured / predicted, 3),
        "round_ratios": [round(r["iteration_ms"] / predicted, 3) for r in runs],
        "optimizer_step_ms": round(step, 3),
        "ratio_no_step": round((measured - step) / predicted, 3),
        "compute_ratio": round(statistics.median(r["compute_ratio"] for r in runs), 3),
        "load_average_1min": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn,gpt")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each plan, round robin")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "prediction.json"))
    ap.add_argument("--quick", action="store_true", help="the mlp example, 3 steps")
    ap.add_argument(
        "--stored-profiles",
        action="store_true",
        help="use the committed profiles/ (default: profile each model first, as a user would)",
    )
    args = ap.parse_args()
    if args.quick:
        args.models, args.steps, args.stored_profiles, args.rounds = "mlp", 3, True, 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        plans = [
            (name, kind, *make_plan(name, args.device, Path(tmp), kind, not args.stored_profiles))
            for name in args.models.split(",")
            for kind in ("solved", "pipeline")
        ]
        runs: list[list[dict[str, float]]] = [[] for _ in plans]
        # Round robin over the plans: a slow spell of the machine (seconds to minutes on a
        # shared VM) then falls on one run of several plans, not on every run of one.
        for _ in range(args.rounds):
            for (name, _kind, plan_path, _), into in zip(plans, runs, strict=True):
                into.append(measure(name, plan_path, args.device, args.steps))
        for (name, kind, plan_path, _), got in zip(plans, runs, strict=True):
            rows.append(summarise(name, kind, args.device, plan_path, got))
    head = f"{'model':<6} {'plan':<24} {'pred ms':>9} {'meas ms':>9} {'ratio':>6} {'w/o step':>9}"
    print(head + f" {'compute':>8}")
    for r in rows:
        plan = f"{r['kind']} {r['schedule']} {r['microbatches']} {len(r['stages'])}st"  # type: ignore[arg-type]
        print(
            f"{r['model']:<6} {plan:<24} {r['predicted_ms']:>9.2f} {r['measured_ms']:>9.2f} "
            f"{r['ratio']:>6.2f} {r['ratio_no_step']:>9.2f} {r['compute_ratio']:>8.2f}"
        )
    device_name = platform.processor() or platform.machine()
    if args.device == "cuda":
        import torch

        device_name = torch.cuda.get_device_name(0)
    result = {
        "benchmark": "prediction",
        "device": args.device,
        "device_name": device_name,
        "host": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "load_average_1min": os.getloadavg()[0],
        "rows": rows,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
