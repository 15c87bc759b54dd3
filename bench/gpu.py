"""GPU: profiles against runs on one CUDA GPU, in fp32 and bf16 (``python -m bench --gpu``).

On ``examples/gpt_large.py`` (12 blocks of width 1024, sequence 512), for each precision:

1. **profile** at microbatch sizes 1, 2, 4, 8 twice back to back (pass timing, the default
   on CUDA). *Repeatability*: of the layer times (forward and backward of every layer and
   size) over 0.5 ms in either profile, the share on which the two agree within 5%.
   *Pass sums*: each size's layers against the whole forward and backward (target 2%).
2. **plans** made without the solver (``parse_stages`` + ``build_schedule``, as
   tests/test_runtime.py does), 4 microbatches of each size: one stage on ``gpu0`` (1F1B),
   and 4 stages on ``gpu0..gpu3`` (1F1B) that ``run`` executes in shared mode on the one GPU.
   Predicted: the simulator's iteration and peak memory; in shared mode the GPU runs the
   plan devices' work one after another, so the prediction is the sum of every simulated
   F/B/I/W and of each stage's STEP, and the memory the peak over time of the devices'
   simulated levels added up. Measured: ``run_plan`` (median step of 5 after 2 warm-up
   steps; ``torch.cuda.max_memory_allocated`` of the process).
3. **plain PyTorch**: the same model, batches, gradient accumulation over the same
   microbatches, Adam and autocast, in a loop of this process; against the one-stage run
   (target within 5%), and bf16 against fp32.

Targets (issue 12): measured/predicted within 5% mean and 10% worst, memory within 10%.
Writes ``bench/results/gpu.json`` (rows of a precision not run this time are kept); ``python
-m bench --gpu`` also writes its section of docs/benchmarks.md. Without CUDA it says so in
one line and exits 0.

Run::

    python bench/gpu.py                        # fp32 and bf16, sizes 1,2,4,8 (~5-10 min)
    python bench/gpu.py --precisions bf16      # one precision (merged into the JSON)
    python bench/gpu.py --quick                # bf16, sizes 1,2, short runs: does it work

``--device cpu --model tests/models/skip.py`` runs the same code on CPU with gloo (the
tests do, to check the script, not to measure anything: CPU memory is the process's RSS).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = ROOT / "examples" / "gpt_large.py"
MICROBATCHES = 4
THRESHOLD_MS = 0.5  # repeatability: layer times over this
AGREE = 0.05  # ... agreeing within this

__all__ = [
    "compare_profiles",
    "four_stages",
    "main",
    "render_markdown",
]


def four_stages(num_layers: int) -> str:
    """Four contiguous stages of near-equal layer counts on gpu0..gpu3.

    Example::

        four_stages(14)   # '0-3:gpu0;4-6:gpu1;7-9:gpu2;10-13:gpu3'
    """
    bounds = [round(i * num_layers / 4) for i in range(5)]
    return ";".join(f"{bounds[i]}-{bounds[i + 1] - 1}:gpu{i}" for i in range(4))


def compare_profiles(a: Any, b: Any) -> dict[str, Any]:
    """Layer times (forward and backward, every size) over ``THRESHOLD_MS`` in either
    profile, and how many of them agree within ``AGREE``.

    Example::

        compare_profiles(first, second)["share"]   # e.g. 0.97
    """
    compared = within = 0
    worst = 0.0
    for ma in a.measurements:
        mb = b.measurement(ma.microbatch_size)
        for ta, tb in zip(ma.layers, mb.layers, strict=True):
            for x, y in ((ta.forward_ms, tb.forward_ms), (ta.backward_ms, tb.backward_ms)):
                if max(x, y) <= THRESHOLD_MS:
                    continue
                compared += 1
                diff = abs(y - x) / min(x, y) if min(x, y) > 0 else float("inf")
                within += diff <= AGREE
                worst = max(worst, diff)
    return {
        "compared": compared,
        "within": within,
        "share": round(within / compared, 4) if compared else None,
        "worst": round(worst, 4),
    }


def _plan(profile_path: Path, text: str, mbs: int) -> Any:
    """The plan of ``text`` (1F1B, ``MICROBATCHES``) with its prediction filled in."""
    import dataclasses

    from planner.plan import FileRef, Plan, Prediction, parse_stages
    from planner.profile.schema import load_profile
    from planner.schedule import build_schedule
    from planner.simulate import simulate
    from planner.simulate.one_device import one_device_prediction

    stages = parse_stages(text)
    schedule = build_schedule("1f1b", stages, MICROBATCHES)
    result = simulate(load_profile(profile_path), None, stages, schedule, MICROBATCHES, mbs)
    predicted = Prediction.from_result(result)
    if len(stages) > 1:
        ms, nbytes = one_device_prediction(result)
        note = "all plan devices on one GPU: work serialised, memory added up"
        predicted = dataclasses.replace(
            predicted, iteration_ms=ms, memory_bytes={"gpu0": nbytes}, extra={"note": note}
        )
    return Plan(
        profile=FileRef.of_file(profile_path),
        topology=FileRef("<one GPU>", ""),
        microbatch_size=mbs,
        num_microbatches=MICROBATCHES,
        stages=stages,
        schedule=schedule,
        predicted=predicted,
    )


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def plain_loop(
    model_path: Path, device_type: str, precision: str, mbs: int, steps: int, warmup: int
) -> dict[str, Any]:
    """Plain PyTorch: the global batch of each step (seeded as ``run`` seeds it) in
    ``MICROBATCHES`` microbatches, gradients accumulated, one Adam step; the median step."""
    import torch

    from planner.optimizers import make_optimizer
    from planner.precision import autocast
    from planner.profile.export_graph import call_for_training
    from planner.profile.loader import load_model_file
    from planner.tensors import slice_batch, to_device

    cuda = device_type == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    user = load_model_file(model_path)
    torch.manual_seed(0)
    model = user.build().to(device)
    model.train()
    opt = make_optimizer("adam", model.parameters())
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(warmup + steps):
        torch.manual_seed(step)
        x, y = user.batch(mbs * MICROBATCHES)
        parts = [
            to_device(slice_batch((x, y), k * mbs, (k + 1) * mbs), device)
            for k in range(MICROBATCHES)
        ]
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for xk, yk in parts:
            with autocast(device_type, precision):
                loss = user.loss(call_for_training(model, xk), yk) / MICROBATCHES
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if cuda:
            torch.cuda.synchronize(device)
        if step >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    peak = int(torch.cuda.max_memory_allocated(device)) if cuda else 0
    del model, opt
    _free(device_type)
    return {"iteration_ms": statistics.median(times), "peak_memory_bytes": peak}


def _run(plan_path: Path, args: argparse.Namespace) -> Any:
    """``run`` of the plan with every plan device on rank 0 (shared mode for several)."""
    from planner.plan import Plan
    from planner.runtime import run_plan

    devices = sorted({d for s in Plan.load(plan_path).stages for d in s.devices})
    return run_plan(
        plan_path, args.model, steps=args.steps, warmup=args.warmup, device=args.device,
        timeout_s=600, device_map=",".join(f"{d}=0" for d in devices),
    )  # fmt: skip


def bench_precision(
    precision: str, sizes: list[int], args: argparse.Namespace, tmp: Path
) -> dict[str, list[dict[str, Any]]]:
    """Profiles, plans, runs and plain loops of one precision."""
    from planner.profile import profile_model

    out: dict[str, list[dict[str, Any]]] = {"rows": [], "plain": [], "profiles": []}
    started = time.perf_counter()
    settings = {"device": args.device, "precision": precision, "repeat": args.repeat}
    if args.device == "cpu":
        settings["timing"] = "pass"  # what CUDA uses by default
    first = profile_model(args.model, sizes, warmup=2, **settings)
    profile_s = time.perf_counter() - started
    _free(args.device)
    second = profile_model(args.model, sizes, warmup=2, **settings)
    _free(args.device)
    path = tmp / f"profile.{precision}.json"
    first.save(path)
    sums = {m.microbatch_size: m.pass_ratios() for m in first.measurements}
    out["profiles"].append(
        {
            "precision": precision,
            "seconds": round(profile_s, 1),
            "repeatability": compare_profiles(first, second),
            "pass_sums": {
                str(k): None if v is None else [round(v[0], 4), round(v[1], 4)]
                for k, v in sums.items()
            },
        }
    )
    n = first.num_layers
    texts = {"1 stage": f"0-{n - 1}:gpu0", "4 stages shared": four_stages(n)}
    for mbs in sizes:
        plain = plain_loop(args.model, args.device, precision, mbs, args.steps, args.warmup)
        for kind, text in texts.items():
            plan = _plan(path, text, mbs)
            plan_path = tmp / f"{precision}.{mbs}.{kind.replace(' ', '_')}.plan.json"
            plan.save(plan_path)
            report = _run(plan_path, args)
            predicted_mem = int(plan.predicted.memory_bytes["gpu0"])
            measured_mem = int(report.peak_memory_bytes["gpu0"])
            out["rows"].append(
                {
                    "precision": precision,
                    "plan": kind,
                    "microbatches": f"{MICROBATCHES} x {mbs}",
                    "predicted_ms": round(float(plan.predicted.iteration_ms), 3),
                    "measured_ms": round(report.iteration_ms, 3),
                    "ratio": round(report.iteration_ms / float(plan.predicted.iteration_ms), 4),
                    "predicted_gib": round(predicted_mem / 2**30, 3),
                    "measured_gib": round(measured_mem / 2**30, 3),
                    "memory_ratio": round(measured_mem / predicted_mem, 4),
                    "compute_ratio": report.compute_ratio,
                }
            )
            if kind == "1 stage":
                out["plain"].append(
                    {
                        "precision": precision,
                        "microbatches": f"{MICROBATCHES} x {mbs}",
                        "plain_ms": round(plain["iteration_ms"], 3),
                        "runtime_ms": round(report.iteration_ms, 3),
                        "runtime_over_plain": round(report.iteration_ms / plain["iteration_ms"], 4),
                        "plain_gib": round(plain["peak_memory_bytes"] / 2**30, 3),
                    }
                )
        print(f"{precision} microbatch {mbs}: {out['rows'][-2:]}", flush=True)
    return out


def summarise(data: dict[str, Any]) -> dict[str, Any]:
    """Per precision: mean and worst |ratio - 1| of the runs, worst memory ratio, and bf16's
    speed-up over fp32 (plain loop and runtime) where both ran."""
    summary: dict[str, Any] = {}
    for precision in sorted({r["precision"] for r in data["rows"]}):
        rows = [r for r in data["rows"] if r["precision"] == precision]
        errs = [abs(r["ratio"] - 1) for r in rows]
        mem = [abs(r["memory_ratio"] - 1) for r in rows]
        summary[precision] = {
            "mean_time_error": round(statistics.mean(errs), 4),
            "worst_time_error": round(max(errs), 4),
            "worst_memory_error": round(max(mem), 4),
        }
    plain = {(p["precision"], p["microbatches"]): p for p in data["plain"]}
    speedups = []
    for (precision, mb), p in plain.items():
        if precision == "bf16" and ("fp32", mb) in plain:
            fp32 = plain[("fp32", mb)]
            speedups.append(
                {
                    "microbatches": mb,
                    "plain_fp32_over_bf16": round(fp32["plain_ms"] / p["plain_ms"], 3),
                    "runtime_fp32_over_bf16": round(fp32["runtime_ms"] / p["runtime_ms"], 3),
                }
            )
    summary["bf16_speedup"] = speedups
    return summary


def render_markdown(data: dict[str, Any], *, command: str, date: str, seconds: float) -> str:
    """The GPU section of docs/benchmarks.md from a ``gpu.json``.

    Example::

        text = render_markdown(json.loads(Path("bench/results/gpu.json").read_text()),
                               command="python -m bench --gpu", date="...", seconds=500.0)
    """
    took = f", {seconds:.0f} s" if seconds else ""
    lines = [
        "## GPU: predicted against measured on one GPU (generated)",
        "",
        f"`{command}` on {data['device_name']} (torch {data['torch']}, CUDA "
        f"{data['cuda']}), {date}{took}. Model {data['model']}; {data['note']}",
        "",
    ]
    for precision, s in data.get("summary", {}).items():
        if precision == "bf16_speedup":
            continue
        lines.append(
            f"- {precision}: measured/predicted off by {s['mean_time_error']:.1%} on average, "
            f"{s['worst_time_error']:.1%} at worst; memory off by "
            f"{s['worst_memory_error']:.1%} at worst"
        )
    for p in data.get("profiles", []):
        rep = p["repeatability"]
        lines.append(
            f"- {p['precision']} profile ({p['seconds']} s): {rep['within']}/{rep['compared']} "
            f"layer times over {THRESHOLD_MS} ms agree within {AGREE:.0%} in a second profile "
            f"(worst {rep['worst']:.1%}); layers over whole passes (forward, backward) per "
            f"size: {p['pass_sums']}"
        )
    lines.append("")
    tables = [
        ("Runs", data.get("rows", [])),
        ("Runtime against a plain PyTorch loop", data.get("plain", [])),
        ("bf16 against fp32", data.get("summary", {}).get("bf16_speedup", [])),
    ]
    for title, rows in tables:
        if not rows:
            continue
        cols = list(rows[0])
        lines += [f"**{title}**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |" for r in rows]
        lines.append("")
    return "\n".join(lines) + "\n"


def _merge(old: dict[str, Any], new: dict[str, Any], precisions: list[str]) -> dict[str, Any]:
    """Keep an earlier run's rows of the precisions not run now (same GPU only)."""
    if old.get("device_name") != new["device_name"]:
        return new
    for key in ("rows", "plain", "profiles"):
        kept = [r for r in old.get(key, []) if r["precision"] not in precisions]
        new[key] = kept + new[key]
    return new


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="profile repeats")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "gpu.json"))
    ap.add_argument("--quick", action="store_true", help="bf16, sizes 1,2, short runs")
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to check the script")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu.py: skipped, no CUDA device here (torch.cuda.is_available() is False)")
        return 0
    if args.quick:
        args.precisions, args.sizes, args.steps, args.warmup, args.repeat = "bf16", "1,2", 2, 1, 2
    precisions = args.precisions.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    data: dict[str, Any] = {"rows": [], "plain": [], "profiles": []}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in precisions:
            part = bench_precision(precision, sizes, args, Path(tmp))
            for key in data:
                data[key] += part[key]
    cuda = args.device == "cuda"
    data.update(
        benchmark="gpu",
        device=args.device,
        device_name=torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor()})",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        host=platform.platform(),
        model=_shown(args.model),
        date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        note=f"{MICROBATCHES} microbatches per step, Adam, {args.steps} measured steps after "
        f"{args.warmup}; sizes {args.sizes}; profiles with --repeat {args.repeat}.",
    )
    out = Path(args.output)
    if out.exists():
        data = _merge(json.loads(out.read_text()), data, precisions)
    data["summary"] = summarise(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data["summary"], indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
