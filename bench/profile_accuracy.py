"""Does the profiler attribute time to the right layers? A model with a known answer.

``bench/heavy_half_model.py`` has four layers of equal 512x512 matmuls (64 rows per
sample); the last two run four of them, the first two one, so the second half does exactly
4x the work of the first. The profile must show that: (forward + backward) of layers 2-3
over layers 0-1, and the forward alone, each within 30% of 4 (a timing target, so it lives
here and not in the tests; it was a test until the suite moved timing out), with each layer
timed on its own (``--timing layer``, the CPU default) and inside whole passes (``--timing
pass``, the CUDA default, here with the CPU clock); for the latter also how the layers'
medians add up against the whole pass timed on its own (on a GPU the target is 2%).

Run::

    .venv/bin/python bench/profile_accuracy.py     # table + bench/results/profile_accuracy.json
    .venv/bin/python bench/profile_accuracy.py --quick    # 3 repeats instead of 7
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from planner.profile.measure import profile_model

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "profile_accuracy.json"
MODEL = ROOT / "bench" / "heavy_half_model.py"
TARGET, TOLERANCE = 4.0, 0.30


def measure(repeat: int, warmup: int, timing: str) -> dict[str, Any]:
    """Profile the model at microbatch size 2; the two ratios of second half to first."""
    profile = profile_model(MODEL, [2], repeat=repeat, warmup=warmup, min_time_s=0, timing=timing)
    m = profile.measurements[0]
    t = m.layers

    def work(i: int) -> float:
        return t[i].forward_ms + t[i].backward_ms

    both = (work(2) + work(3)) / (work(0) + work(1))
    forward = (t[2].forward_ms + t[3].forward_ms) / (t[0].forward_ms + t[1].forward_ms)
    sums = {}
    if m.pass_forward_ms:  # --timing pass: the layers against the whole pass
        sums = {
            "layers_over_pass_forward": round(sum(x.forward_ms for x in t) / m.pass_forward_ms, 3),
            "layers_over_pass_backward": round(
                sum(x.backward_ms for x in t) / (m.pass_backward_ms or 1.0), 3
            ),
        }
    return {
        "timing": timing,
        "forward_plus_backward_ratio": round(both, 3),
        "forward_ratio": round(forward, 3),
        "within_target": all(abs(r / TARGET - 1) <= TOLERANCE for r in (both, forward)),
        "layer_ms": [[round(x.forward_ms, 3), round(x.backward_ms, 3)] for x in t],
        **sums,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, 1 warm-up")
    args = parser.parse_args()
    repeat, warmup = (3, 1) if args.quick else (7, 2)
    result = {
        "benchmark": "profile_accuracy",
        "command": "python bench/profile_accuracy.py" + (" --quick" if args.quick else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "target": f"both ratios within {TOLERANCE:.0%} of {TARGET:g}",
        "repeat": repeat,
        "rows": [measure(repeat, warmup, timing) for timing in ("layer", "pass")],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print("| timing | fwd+bwd ratio (layers 2-3 / 0-1) | fwd ratio | layers / whole pass |")
    print("|---|---|---|---|")
    for run in result["rows"]:
        sums = "-"
        if "layers_over_pass_forward" in run:
            sums = f"fwd {run['layers_over_pass_forward']}, bwd {run['layers_over_pass_backward']}"
        print(
            f"| {run['timing']} | {run['forward_plus_backward_ratio']} | "
            f"{run['forward_ratio']} | {sums} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
