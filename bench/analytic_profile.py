"""Analytic profiles (issue 21): 405B on one core, the README's three commands, and analytic
against measured.

1. **Speed**: ``pipeplan profile --analytic --gpu h100-sxm --precision bf16`` of a
   Llama-3-405B-shaped model (126 layers of width 16384, 128 heads with 8 key/value heads,
   SwiGLU 53248, vocabulary 128256, sequence 8192) built from a hub-style ``config.json``
   by ``examples/llama3-70b/model.py``, at microbatch sizes 1, 2, 4, in a fresh process on
   one thread (``OMP_NUM_THREADS=1``). Reported: the process's CPU seconds (what one core
   spends: on a shared machine the wall clock also counts other processes' turns), its
   wall seconds and peak memory (RSS). Target: under 60 s and 2 GB.
2. **The README's three commands** (full run only): ``profile --analytic`` of
   ``examples/llama3-70b``, ``topology cluster --preset dgx-h100 --nodes 16``, ``solve``,
   each a fresh process; wall and CPU seconds. Target: under 2 minutes together.
3. **Analytic against measured on CPU** (the CPU form of issue 21's GPU comparison): per
   layer and microbatch size, the measured profile (``--repeat 5``, one thread) against the
   analytic one with ``--gpu cpu`` (this CPU's GEMM peak and copy bandwidth measured once,
   efficiencies 1): forward and whole backward, and their ratios. No target on CPU: the
   roofline knows nothing of the CPU's caches or of how far small products fall below the
   peak of a 1024-wide one.

``--gpu`` instead runs the GPU comparison (needs CUDA; the command docs/benchmarks.md
names): ``examples/gpt_large.py`` in bf16, measured on the GPU (pass timing) against the
analytic profile of the catalog GPU named by ``--catalog-gpu`` (default: guessed from
torch's device name), per layer, and per iteration: a one-stage 1F1B plan of 4
microbatches predicted from the analytic profile and run (target: within 15%).

Run::

    .venv/bin/python bench/analytic_profile.py          # table + bench/results/<name>.json
    .venv/bin/python bench/analytic_profile.py --quick  # 16 of the 405B's layers, gpt at -b 1
    python bench/analytic_profile.py --gpu              # on a CUDA machine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
PIPEPLAN = [sys.executable, "-m", "planner.cli"]
LLAMA_405B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_hidden_layers": 126,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
    "attention_dropout": 0.0,
    "torch_dtype": "bfloat16",
}
SEQ_405B = 8192


def _child_seconds() -> tuple[float, int]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def _timed(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``command`` to completion; its wall and CPU seconds (RSS: children's peak so far)."""
    cpu_before, _ = _child_seconds()
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    cpu_after, peak = _child_seconds()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu_after - cpu_before, 2),
        "peak_rss_bytes": peak,
        "stdout": done.stdout,
    }


def speed_405b(sizes: str, folder: Path, layers: int = 126) -> dict[str, Any]:
    """Part 1: the 405B-shaped model's analytic profile in a fresh one-thread process
    (``layers``: fewer than its 126 for a quick check that it works)."""
    model = folder / "llama3-405b"
    model.mkdir()
    config = dict(LLAMA_405B, num_hidden_layers=layers)
    (model / "config.json").write_text(json.dumps(config, indent=1))
    source = (ROOT / "examples" / "llama3-70b" / "model.py").read_text()
    (model / "model.py").write_text(source.replace("SEQ_LEN = 4096", f"SEQ_LEN = {SEQ_405B}"))
    code = (
        "import torch, json, sys\n"
        "torch.set_num_threads(1)\n"
        "from planner.profile.analytic import analytic_profile\n"
        f"p = analytic_profile({str(model / 'model.py')!r}, {sizes!r}, gpu='h100-sxm', "
        "precision='bf16')\n"
        "m = p.measurement(p.microbatch_sizes[0])\n"
        "print(json.dumps({'layers': p.num_layers, "
        "'parameters': sum(l.param_count for l in p.layers), "
        "'forward_tflop': sum(t.forward_flops or 0 for t in m.layers) / 1e12, "
        "'counted': p.settings.analytic.layers_counted, "
        "'from_twins': p.settings.analytic.layers_from_twins}))\n"
    )
    got = _timed([sys.executable, "-c", code], env={"OMP_NUM_THREADS": "1"})
    facts = json.loads(got.pop("stdout").strip().splitlines()[-1])
    return {"sizes": sizes, **got, **facts}


def readme_path(folder: Path) -> dict[str, Any]:
    """Part 2: the README's three commands, each a fresh process."""
    profile, topology, plan = folder / "llama.json", folder / "h100x16.yaml", folder / "p.json"
    steps = {
        "profile": [*PIPEPLAN, "profile", "examples/llama3-70b/model.py", "--analytic",
                    "--gpu", "h100-sxm", "--precision", "bf16", "-b", "1,2", "-o", str(profile),
                    "-q"],
        "topology": [*PIPEPLAN, "topology", "cluster", "--preset", "dgx-h100", "--nodes", "16",
                     "-o", str(topology)],
        "solve": [*PIPEPLAN, "solve", "--profile", str(profile), "--topology", str(topology),
                  "--global-batch", "64", "-o", str(plan), "--json"],
    }  # fmt: skip
    out: dict[str, Any] = {}
    for name, command in steps.items():
        got = _timed(command)
        stdout = got.pop("stdout")
        got.pop("peak_rss_bytes")
        out[name] = got
        if name == "solve":
            data = json.loads(stdout)
            out["plan"] = {
                "stages": len(data["stages"]),
                "schedule": data["schedule"]["name"],
                "microbatches": f"{data['num_microbatches']}x{data['microbatch_size']}",
                "iteration_s": round(data["predicted"]["iteration_ms"] / 1e3, 3),
            }
    out["total_wall_s"] = round(sum(out[k]["wall_s"] for k in steps), 2)
    out["total_cpu_s"] = round(sum(out[k]["cpu_s"] for k in steps), 2)
    return out


def cpu_rows(model: str, sizes: str, repeat: int, folder: Path) -> list[dict[str, Any]]:
    """Part 3: measured against analytic (``--gpu cpu``) per layer, on this CPU."""
    from planner.profile import load_profile

    measured, analytic = folder / "measured.json", folder / "analytic.json"
    _timed([*PIPEPLAN, "profile", model, "-b", sizes, "--repeat", str(repeat), "--warmup", "1",
            "-o", str(measured), "-q"])  # fmt: skip
    _timed([*PIPEPLAN, "profile", model, "--analytic", "--gpu", "cpu", "-b", sizes,
            "-o", str(analytic), "-q"])  # fmt: skip
    m, a = load_profile(measured), load_profile(analytic)
    rows = []
    for size in m.microbatch_sizes:
        for layer, tm, ta in zip(
            m.layers, m.measurement(size).layers, a.measurement(size).layers, strict=True
        ):
            rows.append(
                {
                    "model": Path(model).stem,
                    "layer": layer.name,
                    "mb": size,
                    "measured_fwd_ms": tm.forward_ms,
                    "analytic_fwd_ms": round(ta.forward_ms, 4),
                    "fwd_ratio": _ratio(ta.forward_ms, tm.forward_ms),
                    "measured_bwd_ms": tm.backward_ms,
                    "analytic_bwd_ms": round(ta.backward_ms, 4),
                    "bwd_ratio": _ratio(ta.backward_ms, tm.backward_ms),
                }
            )
    return rows


def _ratio(analytic: float, measured: float) -> float | None:
    return round(analytic / measured, 3) if measured > 0 else None


def gpu_comparison(
    catalog_gpu: str | None, sizes: str, device: str = "cuda", model: Path | None = None
) -> dict[str, Any]:
    """``--gpu``: examples/gpt_large.py in bf16 on this CUDA GPU, measured against analytic.

    ``device="cpu"`` (with a small ``model`` and ``catalog_gpu="cpu"``) runs the same code
    on the CPU, to check the script where no GPU is at hand; it measures nothing of a GPU.
    """
    import torch
    from gpu import _plan  # bench/gpu.py: a one-stage plan with the simulator's prediction

    from planner.plan import Plan
    from planner.profile import load_profile
    from planner.runtime import run_plan

    if device == "cuda" and not torch.cuda.is_available():
        print("bench/analytic_profile.py --gpu: skipped, no CUDA device")
        return {}
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    catalog_gpu = catalog_gpu or _guess(name)
    model = model or ROOT / "examples" / "gpt_large.py"
    folder = Path(tempfile.mkdtemp(prefix="analytic-gpu-"))
    measured, analytic = folder / "measured.json", folder / "analytic.json"
    _timed([*PIPEPLAN, "profile", str(model), "--device", device, "--precision", "bf16",
            "--timing", "pass", "-b", sizes, "-o", str(measured), "-q"])  # fmt: skip
    _timed([*PIPEPLAN, "profile", str(model), "--analytic", "--gpu", catalog_gpu,
            "--precision", "bf16", "-b", sizes, "-o", str(analytic), "-q"])  # fmt: skip
    m, a = load_profile(measured), load_profile(analytic)
    layers, iterations = [], []
    for size in m.microbatch_sizes:
        for layer, tm, ta in zip(
            m.layers, m.measurement(size).layers, a.measurement(size).layers, strict=True
        ):
            layers.append(
                {
                    "layer": layer.name,
                    "mb": size,
                    "measured_fwd_ms": tm.forward_ms,
                    "analytic_fwd_ms": ta.forward_ms,
                    "fwd_ratio": _ratio(ta.forward_ms, tm.forward_ms),
                    "measured_bwd_ms": tm.backward_ms,
                    "analytic_bwd_ms": ta.backward_ms,
                    "bwd_ratio": _ratio(ta.backward_ms, tm.backward_ms),
                }
            )
        path = folder / f"plan{size}.json"
        _plan(analytic, f"0-{a.num_layers - 1}:gpu0", size).save(path)
        report = run_plan(
            path, model, steps=5, warmup=2, device=device, timeout_s=600, device_map="gpu0=0"
        )
        predicted = Plan.load(path).predicted
        assert predicted is not None
        iterations.append(
            {
                "mb": size,
                "predicted_ms": round(predicted.iteration_ms, 3),
                "measured_ms": round(report.iteration_ms, 3),
                "measured_over_predicted": round(report.iteration_ms / predicted.iteration_ms, 3),
            }
        )
    shutil.rmtree(folder, ignore_errors=True)
    worst = max(abs(r["measured_over_predicted"] - 1) for r in iterations)
    return {
        "gpu": name,
        "catalog_gpu": catalog_gpu,
        "model": str(model),
        "iterations": iterations,
        "worst_iteration_error": round(worst, 4),
        "target": "whole iterations within 15%",
        "rows": layers,
    }


def _guess(device_name: str) -> str:
    lowered = device_name.lower()
    for key, name in (("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"),
                      ("b200", "b200"), ("a100", "a100-80gb-sxm"), ("l40s", "l40s"),
                      ("mi300x", "mi300x")):  # fmt: skip
        if key in lowered:
            return name
    raise SystemExit(f"no catalog entry for {device_name!r}; pass --catalog-gpu NAME")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="405B at one size, gpt at -b 1")
    ap.add_argument("--gpu", action="store_true", help="the GPU comparison (needs CUDA)")
    ap.add_argument("--catalog-gpu", help="with --gpu: the catalog entry of this GPU")
    ap.add_argument("--device", default="cuda", help="with --gpu: cpu checks the script only")
    ap.add_argument("--model", type=Path, help="with --gpu: default examples/gpt_large.py")
    ap.add_argument("--sizes", default="1,2,4,8", help="with --gpu: microbatch sizes")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.gpu:
        result = gpu_comparison(args.catalog_gpu, args.sizes, args.device, args.model)
        if result:
            print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
        if result and args.device == "cuda":  # the CPU form checks the script only
            (RESULTS / "analytic_profile_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
        return
    folder = Path(tempfile.mkdtemp(prefix="analytic-bench-"))
    try:
        speed = speed_405b("1" if args.quick else "1,2,4", folder, 16 if args.quick else 126)
        print(
            f"405B-shaped ({speed['layers'] - 3} decoder layers), -b {speed['sizes']}: "
            f"{speed['cpu_s']} s CPU, {speed['wall_s']} s wall, "
            f"{speed['peak_rss_bytes'] / 2**30:.2f} GiB peak (target < 60 s, < 2 GB); "
            f"{speed['counted']} layers counted, {speed['from_twins']} from twins"
        )
        readme = None if args.quick else readme_path(folder)
        if readme:
            print(f"README path: {readme['total_wall_s']} s wall, {readme['total_cpu_s']} s CPU")
        rows = cpu_rows(
            "examples/gpt.py", "1" if args.quick else "1,4", 2 if args.quick else 5, folder
        )
        if not args.quick:
            rows += cpu_rows("examples/hf_llama.py", "1,4", 5, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for r in rows:
        print(
            f"{r['model']:<9} {r['layer'][:28]:<28} {r['mb']:>2} fwd {r['measured_fwd_ms']:>8.3f} "
            f"{r['analytic_fwd_ms']:>8.3f} x{r['fwd_ratio']}  bwd {r['measured_bwd_ms']:>8.3f} "
            f"{r['analytic_bwd_ms']:>8.3f} x{r['bwd_ratio']}"
        )
    blocks = [r for r in rows if r["layer"].startswith(("blocks.", "model.layers."))]
    payload: dict[str, Any] = {
        "benchmark": "analytic_profile",
        "note": (
            "Speed of pipeplan profile --analytic (CPU seconds of a one-thread process: what one "
            "core spends; wall seconds also count other processes' turns on a shared machine) "
            "and, per layer, analytic times on this CPU (--gpu cpu: its GEMM peak and copy "
            "bandwidth measured once) against the measured profile: ratios analytic/measured, "
            "no target on CPU."
        ),
        "machine": f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}",
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "llama_405b_sizes": speed["sizes"],
        "llama_405b_cpu_s": speed["cpu_s"],
        "llama_405b_wall_s": speed["wall_s"],
        "llama_405b_peak_gib": round(speed["peak_rss_bytes"] / 2**30, 3),
        "llama_405b_parameters": speed["parameters"],
        "llama_405b_decoder_layers": speed["layers"] - 3,  # embedding, norm and head besides
        "llama_405b_layers_counted": speed["counted"],
        "llama_405b_layers_from_twins": speed["from_twins"],
        "speed_target": "under 60 s CPU and 2 GB",
        "speed_ok": speed["cpu_s"] < 60 and speed["peak_rss_bytes"] < 2e9 and not args.quick,
        "median_block_fwd_ratio": statistics.median(
            r["fwd_ratio"] for r in blocks if r["fwd_ratio"]
        ),
        "median_block_bwd_ratio": statistics.median(
            r["bwd_ratio"] for r in blocks if r["bwd_ratio"]
        ),
        "rows": rows,
    }
    if readme:
        payload["readme_total_wall_s"] = readme["total_wall_s"]
        payload["readme_total_cpu_s"] = readme["total_cpu_s"]
        payload["readme_steps"] = {k: readme[k] for k in ("profile", "topology", "solve", "plan")}
    (RESULTS / "analytic_profile.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {RESULTS / 'analytic_profile.json'}")


if __name__ == "__main__":
    main()
