"""Prediction accuracy: measured / predicted iteration time of every example and schedule,
each with its band, and ``pipeplan demo`` five times in a row.

For each example model (``examples/*.py``; the Hugging Face ones where transformers is
installed; not ``gpt_large``, a GPU model) a profile is measured just before, as a user
would, co-located as the run will be (``--colocate 2``: two processes on this host,
:mod:`planner.profile.colocation`; ``--alone``: one process, for comparison), at the
model's microbatch sizes below. On ``topologies/cpu.yaml`` (two processes, one per core of
the 2-core development VM, one thread each, as profiled; its message overhead included) it
is then
planned six ways, 8 microbatches each:

- ``solved``: ``solve --schedule auto`` (what a user gets);
- one row per schedule (``gpipe``, ``1f1b``, ``interleaved``, ``zb``, ``2bw``): the best
  pipeline of that schedule with one stage per process (interleaved: two chunks per
  process) at the solved plan's microbatch size, by the simulator, so that every schedule's
  run is measured whatever the solver picks.

Every plan carries its band (:mod:`planner.simulate.band`). Each plan is run with ``pipeplan
run --device cpu`` ``--rounds`` times (default 3), round robin over the plans so that
a slow spell of the machine falls on one run of several plans rather than on every run of
one. ``--order all`` (the default) profiles every model first and then runs every plan
round robin, minutes after some of the profiles; ``--order model`` profiles each model and
runs its plans at once, as a user runs what they just profiled (one run, 2026-11-28 10:35
UTC, helpers stopped: worst 27.6%, median 3.0%, demo 0.957-0.984; the mlp profile, taken
first, had a band of 125-210 ms and its rows 0.97-1.28: not adopted on that evidence).
Per row: the median measured iteration time over the rounds / the predicted one
(``ratio``), every round's (``round_ratios``), how many rounds fell inside the band
(``inside``), ``ratio_no_step`` (without the measured optimizer step) and ``compute`` (the
stages' own forward/backward against the profile, the largest stage ratio of ``run
--calibrate``).

``demo x5`` (row ``demo``): ``pipeplan demo`` (profile co-located, solve, run; gpt) five
times in a row, each a fresh profile: ``round_ratios`` lists the five measured / predicted,
``ratio`` the worst of them, ``inside`` how many fell inside their band.

Targets (issue 23): every demo within 0.9-1.1; over the rows, worst |ratio - 1| <= 10% and
median <= 5% (``worst_error``, ``median_error`` and ``demo_ratios`` in the summary). The
numbers are timings: run it on an otherwise idle machine (the load average at the start
and the end are recorded; the profile records the other work on the host before it).

Run::

    .venv/bin/python bench/prediction.py                  # table + bench/results/prediction.json
    .venv/bin/python bench/prediction.py --models mlp --rounds 1 --no-demo
    .venv/bin/python bench/prediction.py --quick          # mlp, solved + 1f1b, 1 round, 1 demo
    .venv/bin/python bench/prediction.py --alone          # profiles by one process alone
"""

from __future__ import annotations

import argparse
import io
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

from planner.profile.measure import MIN_TIME_S  # noqa: E402

CPU2 = (ROOT / "topologies" / "cpu.yaml").read_text()
"""The topology the plans are solved and run on: ``topologies/cpu.yaml`` itself (two
processes, one per core; its ``message_overhead`` included), as ``pipeplan demo`` uses it."""
# Microbatch sizes profiled per example: iterations of 0.1-1 s at 8 microbatches.
SIZES = {
    "mlp": [16, 32, 64],
    "cnn": [2, 4, 8],
    "gpt": [1, 2, 4],
    "hf_gpt2": [1, 2, 4],
    "hf_llama": [1, 2, 4],
}
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "2bw")
MICROBATCHES = 8
PROCESSES = 2
DEMO_RUNS = 5
# The examples' profiles are timed as `pipeplan profile` times by default (--min-time 2 s).
# Longer profiles vary less (sums of examples/hf_llama.py's layer times at microbatch 4,
# co-located, three of each: +-5% over 2 s, +-1.6% over 8 s) but did not predict better:
# one run with --min-time 8 (2026-11-28 07:51 UTC) had median error 7.9%, worst 15%, the
# mlp, cnn and gpt rows all 0.85-0.97 (profiled first), demo x5 0.906-0.947.
PROFILE_MIN_TIME_S = MIN_TIME_S


def available_models(names: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """The examples that can run here, and a skipped row for each that cannot."""
    import importlib.util

    keep, skipped = [], []
    for name in names:
        if name.startswith("hf_") and importlib.util.find_spec("transformers") is None:
            skipped.append({"model": name, "kind": "skipped: transformers is not installed"})
        else:
            keep.append(name)
    return keep, skipped


def profile_example(
    name: str, tmp: Path, colocate: int, timing: str | None = None, min_time_s: float = 2.0
) -> Path:
    """A fresh profile of the example, as ``pipeplan profile --colocate --min-time
    [--timing]`` writes it (``timing`` None: the device's default)."""
    from planner.profile.measure import profile_model

    out = tmp / f"{name}.json"
    sizes = SIZES.get(name, [1, 2, 4])
    path = ROOT / "examples" / f"{name}.py"
    profile_model(path, sizes, colocate=colocate, timing=timing, min_time_s=min_time_s).save(out)
    return out


def _best_pipeline(profile: Any, topo: Any, schedule: str, mbs: int) -> tuple[Any, Any]:
    """The fastest pipeline of ``schedule`` with one stage (interleaved: two chunks) per
    process, by the simulator: (result, stages)."""
    from itertools import combinations

    from planner.plan import parse_stages
    from planner.simulate import simulate

    n = profile.num_layers
    chunks = 2 * PROCESSES if schedule == "interleaved" else PROCESSES
    best = None
    for cuts in combinations(range(n - 1), chunks - 1):
        bounds = [-1, *cuts, n - 1]
        text = ";".join(
            f"{bounds[k] + 1}-{bounds[k + 1]}:cpu{k % PROCESSES}" for k in range(chunks)
        )
        stages = parse_stages(text)
        result = simulate(profile, topo, stages, schedule, MICROBATCHES, mbs)
        if best is None or result.iteration_ms < best[0].iteration_ms:
            best = (result, stages)
    assert best is not None
    return best


def make_plans(
    name: str, tmp: Path, colocate: int, timing: str | None = None, min_time_s: float = 2.0
) -> list[tuple[str, Path]]:
    """The example's plans (``solved`` and one per schedule), saved with their bands."""
    from planner.plan import FileRef, plan_from_simulation
    from planner.profile.schema import load_profile
    from planner.simulate.band import prediction_band
    from planner.solve import solve
    from planner.topology import load_topology

    profile_path = profile_example(name, tmp, colocate, timing, min_time_s)
    topo_path = tmp / "cpu2.yaml"
    topo_path.write_text(CPU2)
    profile, topo = load_profile(profile_path), load_topology(topo_path)
    solved = solve(
        profile,
        topo,
        num_microbatches=MICROBATCHES,
        time_limit=20,
        profile_path=str(profile_path),
        topology_path=str(topo_path),
    )
    plans = [("solved", solved)]
    for schedule in SCHEDULES:
        if schedule == "interleaved" and profile.num_layers < 2 * PROCESSES:
            continue
        result, stages = _best_pipeline(profile, topo, schedule, solved.microbatch_size)
        band = prediction_band(profile, topo, stages, result)
        plans.append(
            (
                schedule,
                plan_from_simulation(
                    result,
                    stages,
                    profile=FileRef.of_file(profile_path),
                    topology=FileRef.of_file(topo_path),
                    band_ms=band.as_list(),
                ),
            )
        )
    out = []
    for kind, plan in plans:
        path = tmp / f"{name}.{kind}.plan.json"
        plan.save(path)
        out.append((kind, path))
    return out


def measure(name: str, plan_path: Path, steps: int) -> dict[str, float]:
    """One ``run`` of the plan: its median step, optimizer step and compute ratio."""
    from planner.runtime import run_plan

    report = run_plan(
        plan_path, ROOT / "examples" / f"{name}.py", steps=steps, warmup=2, device="cpu",
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
    name: str, kind: str, plan_path: Path, runs: list[dict[str, float]]
) -> dict[str, Any]:
    """A row: the plan, its prediction and band, and the medians of its runs."""
    from planner.plan import Plan

    plan = Plan.load(plan_path)
    predicted = float(plan.predicted.iteration_ms)
    band = plan.predicted.iteration_band_ms or [predicted, predicted]
    measured = statistics.median(r["iteration_ms"] for r in runs)
    step = statistics.median(r["step_ms"] for r in runs)
    vs = plan.schedule.virtual_stages
    shape = f"{len(plan.stages)}st {plan.schedule.name}" + (f" v={vs}" if vs > 1 else "")
    return {
        "model": name,
        "kind": kind,
        "plan": f"{shape}, {plan.num_microbatches} x {plan.microbatch_size}",
        "predicted_ms": round(predicted, 3),
        "band_ms": [round(band[0], 3), round(band[1], 3)],
        "measured_ms": round(measured, 3),
        "ratio": round(measured / predicted, 3),
        "inside": f"{sum(band[0] <= r['iteration_ms'] <= band[1] for r in runs)}/{len(runs)}",
        "round_ratios": [round(r["iteration_ms"] / predicted, 3) for r in runs],
        "ratio_no_step": round((measured - step) / predicted, 3),
        "compute": round(statistics.median(r["compute_ratio"] for r in runs), 3),
        "stages": [[s.first, s.last, s.devices, s.recompute] for s in plan.stages],
    }


def demo_row(runs: int, tmp: Path) -> dict[str, Any]:
    """``pipeplan demo`` ``runs`` times: each run's measured / predicted and band verdict."""
    from rich.console import Console

    from planner.commands.demo import run_demo

    ratios, inside, plans = [], 0, []
    for k in range(runs):
        quiet = Console(file=io.StringIO(), width=100)
        ctx = run_demo("gpt", out_dir=tmp / f"demo{k}", console=quiet)
        report = ctx.results["run"]
        ratios.append(round(report.ratio, 3))
        inside += bool(report.inside_band)
        plan = ctx.results["plan"]
        plans.append(f"{len(plan.stages)}st {plan.schedule.name} mb {plan.microbatch_size}")
    worst = max(ratios, key=lambda r: abs(r - 1.0))
    return {
        "model": "gpt",
        "kind": f"demo x{runs}",
        "plan": ", ".join(sorted(set(plans))),
        "ratio": worst,
        "inside": f"{inside}/{runs}",
        "round_ratios": ratios,
    }


# How the profiles and runs are ordered (--order), as the report's note says it.
ORDERS = {"model": "each model run right after its profile", "all": "every profile first"}


def run_rounds(
    plans: list[tuple[str, str, Path]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each plan run ``args.rounds`` times, round robin, and summarised: a slow spell of the
    machine (seconds to minutes on a shared VM) then falls on one run of several plans,
    not on every run of one."""
    runs: list[list[dict[str, float]]] = [[] for _ in plans]
    for _ in range(args.rounds):
        for (name, _kind, path), into in zip(plans, runs, strict=True):
            into.append(measure(name, path, args.steps))
    return [
        summarise(name, kind, path, got)
        for (name, kind, path), got in zip(plans, runs, strict=True)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn,gpt,hf_gpt2,hf_llama")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each plan, round robin")
    ap.add_argument("--demo-runs", type=int, default=DEMO_RUNS)
    ap.add_argument("--no-demo", action="store_true", help="leave out the demo x5 row")
    ap.add_argument("--alone", action="store_true", help="profile by one process alone")
    ap.add_argument("--timing", default=None, help="profile --timing (default: the CPU's, layer)")
    ap.add_argument(
        "--min-time",
        type=float,
        default=PROFILE_MIN_TIME_S,
        help=f"profile --min-time of the examples' profiles (default {PROFILE_MIN_TIME_S:g})",
    )
    ap.add_argument(
        "--order",
        choices=("model", "all"),
        default="all",
        help="all: every profile first, then every plan round robin; model: each model "
        "profiled, then its plans run at once (as a user does)",
    )
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "prediction.json"))
    ap.add_argument("--quick", action="store_true", help="mlp: solved and 1f1b, 1 round, 1 demo")
    args = ap.parse_args()
    if args.quick:
        args.models, args.steps, args.rounds, args.demo_runs = "mlp", 3, 1, 1
        args.min_time = min(args.min_time, 2.0)
    load_before = os.getloadavg()[0]
    models, rows = available_models(args.models.split(","))
    colocate = 1 if args.alone else PROCESSES
    with tempfile.TemporaryDirectory() as tmp:

        def plans_of(name: str) -> list[tuple[str, str, Path]]:
            made = make_plans(name, Path(tmp), colocate, args.timing, args.min_time)
            return [
                (name, kind, path)
                for kind, path in made
                if not args.quick or kind in ("solved", "1f1b")
            ]

        if args.order == "model":  # profile, then run at once
            measured = [row for name in models for row in run_rounds(plans_of(name), args)]
        else:
            measured = run_rounds([p for name in models for p in plans_of(name)], args)
        demo = None if args.no_demo else demo_row(args.demo_runs, Path(tmp))
    rows = measured + ([demo] if demo is not None else []) + rows
    errors = sorted(abs(r["ratio"] - 1.0) for r in measured)
    print(f"{'model':<9} {'kind':<12} {'plan':<28} {'pred ms':>9} {'band':>17} {'meas ms':>9}")
    for r in rows:
        if "ratio" not in r:
            print(f"{r['model']:<9} {r['kind']}")
            continue
        band = "-" if "band_ms" not in r else f"{r['band_ms'][0]:.1f}-{r['band_ms'][1]:.1f}"
        pred = f"{r['predicted_ms']:.2f}" if "predicted_ms" in r else "-"
        meas = f"{r['measured_ms']:.2f}" if "measured_ms" in r else "-"
        print(
            f"{r['model']:<9} {r['kind']:<12} {r['plan'][:28]:<28} {pred:>9} {band:>17} "
            f"{meas:>9}  ratio {r['ratio']:.3f}  inside {r['inside']}  "
            f"rounds {', '.join(f'{x:.3f}' for x in r['round_ratios'])}"
        )
    result: dict[str, Any] = {
        "benchmark": "prediction",
        "note": (
            f"Profiles {'by one process alone' if args.alone else 'co-located (2 processes)'}"
            f" (--timing {args.timing or 'layer'}, --min-time {args.min_time:g}), "
            f"{ORDERS[args.order]}, "
            "2 CPU processes x 1 thread, "
            f"{MICROBATCHES} microbatches, {args.steps} steps after 2 warm-up, "
            f"{args.rounds} rounds; ratio = median measured / predicted."
        ),
        "device": "cpu",
        "device_name": platform.processor() or platform.machine(),
        "host": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "load_average_1min_before": round(load_before, 2),
        "load_average_1min_after": round(os.getloadavg()[0], 2),
        "worst_error": round(errors[-1], 3) if errors else None,
        "median_error": round(statistics.median(errors), 3) if errors else None,
        "demo_ratios": None if demo is None else demo["round_ratios"],
        "rows": rows,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"worst |ratio - 1| {result['worst_error']}, median {result['median_error']}; demo "
        f"{result['demo_ratios']}; wrote {args.output}"
    )


if __name__ == "__main__":
    main()
