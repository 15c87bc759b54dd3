"""Runtime overhead: pipeplan's executor against torch.distributed.pipelining, same work.

All sides train the same model on the same partition with the same schedule, microbatches,
optimizer (SGD) and data, on 2 CPU processes with one thread each over gloo:

* pipeplan: ``run_plan`` on a plan whose per-device action lists come from
  ``build_schedule`` (what ``pipeplan solve`` writes);
* torch: ``ScheduleGPipe`` / ``Schedule1F1B`` on a manual ``PipelineStage`` per process,
  the stage module being the same ``SplitModel.stage(first, last)`` (no zb row: torch's
  zero-bubble classes are multi-stage-per-rank schedules, not this shape);
* exported: the same plan through ``pipeplan export --to torch``: its ``schedule.csv`` run by
  torch's ``_PipelineScheduleRuntime`` (``format="compute_comms"``) on the same stages, i.e.
  the plan's exact action order under torch's runtime.

Both sides' workers keep freed memory alike (``planner.allocator.keep_freed_memory``, which
every pipeplan worker calls), so the comparison is of the executors, not of malloc.
Each side is timed per step as the slowest rank's time from a barrier to the end of its
step (optimizer included); medians over the measured steps. A round runs both sides back
to back (which goes first alternates); throughput ratio = the median over rounds of the
round's torch ms / pipeplan ms, i.e. pipeplan samples/s over torch's (target >= 1.0).

Run::

    .venv/bin/python bench/runtime_overhead.py    # table + bench/results/runtime_overhead.json
    .venv/bin/python bench/runtime_overhead.py --rounds 1 --steps 4
    .venv/bin/python bench/runtime_overhead.py --quick   # 1F1B, 1 round of 3 steps (all sides)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = ROOT / "examples" / "mlp.py"
STAGES = "0-2:cpu0;3-5:cpu1"
MICROBATCH = 16
MICROBATCHES = 8
LR = 0.01


PROFILE = ROOT / "profiles" / "mlp.json"  # the export names stages by its layer names


def _plan(schedule: str):  # type: ignore[no-untyped-def]
    from planner.plan import FileRef, Plan, parse_stages
    from planner.schedule import build_schedule

    stages = parse_stages(STAGES)
    return Plan(
        profile=FileRef.of_file(PROFILE),
        topology=FileRef("<none>", ""),
        microbatch_size=MICROBATCH,
        num_microbatches=MICROBATCHES,
        stages=stages,
        schedule=build_schedule(schedule, stages, MICROBATCHES),
    )


def run_pipeplan(schedule: str, steps: int, warmup: int) -> dict[str, float]:
    from planner.runtime import run_plan

    report = run_plan(
        _plan(schedule),
        MODEL,
        steps=steps,
        warmup=warmup,
        threads=1,
        optimizer="sgd",
        lr=LR,
        timeout_s=120,
    )
    return {"iteration_ms": report.iteration_ms, "samples_per_s": report.samples_per_s}


def run_torch(schedule: str, steps: int, warmup: int) -> dict[str, float]:
    return _run_workers("torch", schedule, steps, warmup)


def run_exported(schedule: str, steps: int, warmup: int) -> dict[str, float]:
    """The plan exported (``pipeplan export --to torch``) and run by torch's runtime."""
    from planner.export import export_plan

    with tempfile.TemporaryDirectory() as tmp:
        plan_path = Path(tmp, "plan.json")
        _plan(schedule).save(plan_path)
        result = export_plan(plan_path, "torch", Path(tmp, "export"))
        return _run_workers(f"exported:{result.out_dir}", schedule, steps, warmup)


def _run_workers(side: str, schedule: str, steps: int, warmup: int) -> dict[str, float]:
    from planner.runtime.launch import free_port, worker_env

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--torch-worker",
                    str(rank),
                    str(port),
                    side,
                    schedule,
                    str(steps),
                    str(warmup),
                    tmp,
                ],
                env=worker_env(),
            )  # fmt: skip
            for rank in range(2)
        ]
        try:
            for p in procs:
                if p.wait(timeout=600) != 0:
                    raise RuntimeError(f"torch worker failed with {p.returncode}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        per_rank = [json.loads(Path(tmp, f"{r}.json").read_text()) for r in range(2)]
    step_ms = [max(a, b) for a, b in zip(per_rank[0], per_rank[1], strict=True)]
    ms = statistics.median(step_ms)
    return {"iteration_ms": ms, "samples_per_s": MICROBATCH * MICROBATCHES / ms * 1e3}


def torch_worker(
    rank: int, port: int, side: str, schedule: str, steps: int, warmup: int, out: str
) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from planner.allocator import keep_freed_memory
    from planner.plan import parse_stages
    from planner.profile.loader import load_model_file
    from planner.profile.split import split_model

    keep_freed_memory()  # as pipeplan's workers do: compare the executors, not malloc
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=120),
    )
    user = load_model_file(MODEL)
    torch.manual_seed(0)
    model = user.build()
    sample, _ = user.batch(MICROBATCH)
    split = split_model(model, len(sample))
    spec = parse_stages(STAGES)[rank]
    module = split.stage(spec.first, spec.last)
    with torch.no_grad():
        example = sample if rank == 0 else tuple(split.stage(0, spec.first - 1)(*sample))
    stage = PipelineStage(module, rank, 2, torch.device("cpu"), input_args=example)
    if side.startswith("exported:"):
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

        def loss(outputs, targets):  # type: ignore[no-untyped-def]
            return user.loss(outputs, targets) / MICROBATCHES  # as train_pipeline.py does

        pipe = _PipelineScheduleRuntime([stage], MICROBATCHES, loss_fn=loss, scale_grads=False)
        pipe._load_csv(str(Path(side[9:], "schedule.csv")), format="compute_comms")
    else:
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        pipe = cls(stage, n_microbatches=MICROBATCHES, loss_fn=user.loss)
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    times = []
    for step in range(warmup + steps):
        torch.manual_seed(step)
        x, y = user.batch(MICROBATCH * MICROBATCHES)
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            pipe.step(*x)
        else:
            pipe.step(target=y, losses=[])
        opt.step()
        opt.zero_grad(set_to_none=False)
        if step >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    Path(out, f"{rank}.json").write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def _row(schedule: str, rounds: int, steps: int, warmup: int) -> dict[str, object]:
    """One schedule: every side once per round, in an order that rotates each round (a slow
    spell of the machine, seconds to minutes here, then hits the sides alike)."""
    sides = {"pipeplan": run_pipeplan, "exported": run_exported}
    if schedule in ("gpipe", "1f1b"):  # torch has single-stage classes of these two only
        sides["torch"] = run_torch
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(sides[name](schedule, steps, warmup)["iteration_ms"])
    ours = times["pipeplan"]
    row: dict[str, object] = {"schedule": schedule}
    for name in ("pipeplan", "torch", "exported"):
        got = times.get(name)
        row[f"{name}_ms"] = round(statistics.median(got), 3) if got else None
    for name in ("pipeplan", "torch", "exported"):
        got = times.get(name)
        row[f"{name}_rounds_ms"] = [round(x, 3) for x in got] if got else None
    theirs = times.get("torch")
    per_round = [b / a for a, b in zip(ours, theirs, strict=True)] if theirs else None
    row["round_ratios"] = [round(x, 3) for x in per_round] if per_round else None
    row["throughput_ratio"] = round(statistics.median(per_round), 3) if per_round else None
    exported = [b / a for a, b in zip(ours, times["exported"], strict=True)]
    row["exported_ratio"] = round(statistics.median(exported), 3)
    return row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        r, port, side, sched, steps, warmup, out = sys.argv[2:9]
        torch_worker(int(r), int(port), side, sched, int(steps), int(warmup), out)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "-o", "--output", default=str(ROOT / "bench" / "results" / "runtime_overhead.json")
    )
    ap.add_argument(
        "--quick", action="store_true", help="1F1B only, 1 round of 3 steps after 1 warm-up"
    )
    args = ap.parse_args()
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "zb")
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 3, 1
        schedules = ("1f1b",)
    rows = [_row(schedule, args.rounds, args.steps, args.warmup) for schedule in schedules]
    print(f"model {MODEL.name}, stages {STAGES}, {MICROBATCHES} x {MICROBATCH}, 2 procs x 1 thread")
    print(f"{'schedule':<9} {'pipeplan ms':>12} {'torch ms':>10} {'exported ms':>12} {'ratio':>7}")
    for row in rows:
        torch_ms = "-" if row["torch_ms"] is None else f"{row['torch_ms']:.2f}"
        ratio = "-" if row["throughput_ratio"] is None else f"{row['throughput_ratio']:.3f}"
        print(
            f"{row['schedule']:<9} {row['pipeplan_ms']:>12.2f} {torch_ms:>10} "
            f"{row['exported_ms']:>12.2f} {ratio:>7}"
        )
    result = {
        "benchmark": "runtime_overhead",
        "model": MODEL.name,
        "stages": STAGES,
        "microbatch_size": MICROBATCH,
        "num_microbatches": MICROBATCHES,
        "optimizer": f"sgd lr={LR}",
        "processes": 2,
        "threads_per_process": 1,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "host": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "load_average_1min": os.getloadavg()[0],
        "rows": rows,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
