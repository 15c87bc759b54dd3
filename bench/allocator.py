"""What keeping freed memory (``planner.allocator``) does to step times on this machine.

Two kinds of work, each in a fresh process with glibc's default malloc and in one with
:func:`planner.allocator.keep_freed_memory` (what ``pipeplan profile`` and every ``run``
worker do), one thread, thread CPU time:

* ``adam_step``: Adam's step plus ``zero_grad`` over the MLP example's 4.7 M parameters
  (what the runtime's ``STEP`` runs; it allocates temporaries the size of each weight);
* ``gpt_stage``: forward and backward of the GPT example's first three layers at
  microbatch 4, with two microbatches in flight (as 1F1B keeps them).

Per kind: the median ms per iteration and the minor page faults per iteration
(``getrusage``), after warm-up.

Run::

    .venv/bin/python bench/allocator.py            # table + bench/results/allocator.json
    .venv/bin/python bench/allocator.py --quick    # adam_step only, 5 iterations
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "allocator.json"
KINDS = ("adam_step", "gpt_stage")


def _measure(kind: str, keep: bool, iterations: int) -> dict[str, Any]:
    """In this process: time ``iterations`` of ``kind``; returns ms and faults medians."""
    import resource
    import time

    import torch

    sys.path.insert(0, str(ROOT))
    from planner.allocator import keep_freed_memory
    from planner.profile.loader import load_model_file

    allocator = keep_freed_memory() if keep else "default"
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if kind == "adam_step":
        from planner.optimizers import make_optimizer

        params = list(load_model_file(ROOT / "examples" / "mlp.py").build().parameters())
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        optimizer = make_optimizer("adam", params)

        def work() -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)

    else:
        from planner.profile.split import split_model

        user = load_model_file(ROOT / "examples" / "gpt.py")
        inputs, _ = user.batch(4)
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        stage = split_model(user.build(), len(inputs)).stage(0, 2)

        def work() -> None:
            outs = [stage(*inputs) for _ in range(2)]
            for out in outs:
                roots = [t for t in out if isinstance(t, torch.Tensor) and t.requires_grad]
                torch.autograd.backward(roots, [torch.full_like(t, 0.5) for t in roots])

    times, faults = [], []
    for i in range(iterations + 3):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.thread_time()
        work()
        ms = (time.thread_time() - t0) * 1e3
        if i >= 3:
            times.append(ms)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return {
        "kind": kind,
        "allocator": allocator,
        "median_ms": round(statistics.median(times), 3),
        "median_faults": int(statistics.median(faults)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="adam_step only, 5 iterations")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "KEEP", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, keep, n = args.child
        print(json.dumps(_measure(kind, keep == "1", int(n))))
        return
    n = 5 if args.quick else 20
    kinds = KINDS[:1] if args.quick else KINDS
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    rows = []
    for kind in kinds:
        # Alternate default and kept twice, so a slow spell of the machine shows as a
        # disagreement between the two runs of one setting rather than as an effect.
        for keep in ("0", "1", "0", "1"):
            command = [sys.executable, __file__, "--child", kind, keep, str(n)]
            done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{'kind':<10} {'allocator':<14} {'median ms':>10} {'faults/iter':>12}")
    for r in rows:
        name = "kept" if r["allocator"] != "default" else "default"
        print(f"{r['kind']:<10} {name:<14} {r['median_ms']:>10.2f} {r['median_faults']:>12}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "benchmark": "allocator",
                "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
                "iterations": n,
                "threads": 1,
                "clock": "thread_time",
                "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
