"""What ``pipeplan profile`` costs and how repeatable its numbers are.

- Cost: wall seconds of the real command (``pipeplan profile examples/gpt.py -b 1,2,4``, a
  fresh process each time, so Python and torch start-up are included). Target: under 60 s
  on 2 CPU cores.
- Repeatability: two profiles of the same model, taken one after the other. For every layer
  and microbatch size whose median is over 1 ms, the relative difference of the two medians
  of forward_ms and backward_ms (``|a - b| / min(a, b)``). Target: all within 10%.

Run::

    .venv/bin/python bench/profile_cost.py                 # table + bench/results/profile_cost.json
    .venv/bin/python bench/profile_cost.py --runs 3 --model examples/cnn.py
    .venv/bin/python bench/profile_cost.py --quick         # mlp, -b 1, --repeat 3
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
from typing import Any

from planner.profile import Profile, load_profile

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "profile_cost.json"
PIPEPLAN = Path(sys.executable).with_name("pipeplan")
FIELDS = ("forward_ms", "backward_ms")


def profile_once(model: Path, sizes: str, output: Path, extra: list[str]) -> float:
    """Run the real command once; returns its wall seconds."""
    command = [str(PIPEPLAN), "profile", str(model), "-b", sizes, "-o", str(output), "-q"]
    started = time.perf_counter()
    subprocess.run([*command, *extra], check=True, cwd=ROOT)
    return time.perf_counter() - started


def machine_ms(seconds: float = 0.5) -> float:
    """The machine's speed now: median thread CPU ms of a fixed one-thread matmul.

    Taken before and after every profile, it shows whether two profiles that differ ran on
    a machine that was itself slower or faster (a shared VM has slow spells of seconds).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, b = torch.randn(256, 1024), torch.randn(1024, 512)
    samples: list[float] = []
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end or len(samples) < 5:
            t0 = time.thread_time()
            torch.mm(a, b)
            samples.append((time.thread_time() - t0) * 1e3)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(samples)


def compare(a: Profile, b: Profile, threshold_ms: float = 1.0) -> list[dict[str, Any]]:
    """Per layer, size and field over ``threshold_ms``: both medians and their difference."""
    rows = []
    for ma, mb in zip(a.measurements, b.measurements, strict=True):
        for layer, ta, tb in zip(a.layers, ma.layers, mb.layers, strict=True):
            for field in FIELDS:
                x, y = getattr(ta, field), getattr(tb, field)
                if min(x, y) <= threshold_ms:
                    continue
                rows.append(
                    {
                        "layer": layer.name,
                        "microbatch_size": ma.microbatch_size,
                        "field": field,
                        "first_ms": x,
                        "second_ms": y,
                        "difference": abs(x - y) / min(x, y),
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "examples" / "gpt.py")
    parser.add_argument("-b", "--sizes", default="1,2,4")
    parser.add_argument("--runs", type=int, default=2, help="profiles to take (>= 2)")
    parser.add_argument("--extra", default="", help="extra flags for pipeplan profile")
    parser.add_argument(
        "--quick", action="store_true", help="the MLP example at -b 1, 3 repeats per layer"
    )
    args = parser.parse_args()
    if args.quick:
        args.model, args.sizes = ROOT / "examples" / "mlp.py", "1"
        args.extra = args.extra or "--repeat 3 --warmup 1"

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    seconds: list[float] = []
    profiles: list[Profile] = []
    reference: list[tuple[float, float]] = []  # machine_ms() before and after each profile
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(max(2, args.runs)):
            path = Path(tmp) / f"run{run}.json"
            before = machine_ms()
            seconds.append(profile_once(args.model, args.sizes, path, args.extra.split()))
            reference.append((before, machine_ms()))
            profiles.append(load_profile(path))
    rows = compare(profiles[0], profiles[1])
    worst = max((r["difference"] for r in rows), default=0.0)
    within = sum(r["difference"] <= 0.10 for r in rows)
    pairs = []  # every consecutive pair, to show how much one pair's verdict is luck
    for i in range(len(profiles) - 1):
        pair_rows = compare(profiles[i], profiles[i + 1])
        pairs.append(
            {
                "runs": [i, i + 1],
                "compared": len(pair_rows),
                "within_10_percent": sum(r["difference"] <= 0.10 for r in pair_rows),
                "worst_difference": round(max((r["difference"] for r in pair_rows), default=0), 4),
                # How the second profile's times compare with the first's (median over rows),
                # and how the machine's own speed did (reference matmul, mean of before and
                # after): when the two move together, the machine moved, not the profiler.
                "median_time_ratio": round(
                    statistics.median(r["second_ms"] / r["first_ms"] for r in pair_rows), 3
                )
                if pair_rows
                else None,
                "machine_time_ratio": round(
                    statistics.mean(reference[i + 1]) / statistics.mean(reference[i]), 3
                ),
            }
        )

    print(f"pipeplan profile {args.model.name} -b {args.sizes}: {len(profiles)} runs")
    print(f"{'run':>4} {'wall s':>8} {'machine ms before/after':>24}")
    for i, s in enumerate(seconds):
        print(f"{i:>4} {s:>8.1f} {reference[i][0]:>11.3f} {reference[i][1]:>11.3f}")
    print(f"median wall seconds: {statistics.median(seconds):.1f} (target < 60)")
    print()
    print(f"{'layer':<12} {'b':>3} {'field':<12} {'run 0 ms':>9} {'run 1 ms':>9} {'diff':>7}")
    for r in rows:
        print(
            f"{r['layer']:<12} {r['microbatch_size']:>3} {r['field']:<12} "
            f"{r['first_ms']:>9.2f} {r['second_ms']:>9.2f} {r['difference']:>7.1%}"
        )
    print(f"layer times over 1 ms within 10%: {within}/{len(rows)}; worst {worst:.1%}")
    for pair in pairs:
        a, b = pair["runs"]
        print(
            f"runs {a} and {b}: {pair['within_10_percent']}/{pair['compared']} within 10%, "
            f"worst {pair['worst_difference']:.1%}; times x{pair['median_time_ratio']}, "
            f"machine reference x{pair['machine_time_ratio']}"
        )

    result = {
        "benchmark": "profile_cost",
        "command": f"pipeplan profile {args.model.relative_to(ROOT)} -b {args.sizes} {args.extra}",
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average_at_start": load,
        },
        "torch_threads": profiles[0].settings.threads,
        "clock": profiles[0].settings.clock,
        "wall_seconds": [round(s, 2) for s in seconds],
        "machine_reference_ms": {
            "what": "median thread ms of a 256x1024 @ 1024x512 matmul, 1 thread",
            "before_after_each_run": [[round(x, 4) for x in pair] for pair in reference],
        },
        "median_wall_seconds": round(statistics.median(seconds), 2),
        "repeatability": {
            "compared": len(rows),
            "within_10_percent": within,
            "worst_difference": round(worst, 4),
            "rows": rows,
            "pairs": pairs,
        },
        "load_average_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
