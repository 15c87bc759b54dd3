"""Model coverage: 16 Hugging Face architectures profiled, solved and run as pipelines on CPU.

For each architecture of bench/hf_zoo.py (small configs built from config, dropout 0):
``pipeplan profile`` at microbatch sizes 1 and 2 (its time and capture recorded), then three
plans run for 3 steps of 4 microbatches of 2 with SGD on local CPU processes (gloo), each
compared with single-process training on the same batches
(:func:`planner.runtime.reference.train_single_process`):

- ``solved``: what ``pipeplan solve`` picks for 2 CPU processes;
- ``2-stage`` and ``3-stage``: the fastest 1F1B pipeline of that depth by the simulator.

A row passes when every loss is within 1e-5 relative of single-process training and every
parameter (tied ones included) within 1e-5 relative plus 1e-6 absolute, element by element
(``torch.allclose``; the absolute part covers values near zero such as attention key
biases, whose gradient is zero up to rounding). The table shows the largest absolute
parameter difference.

Run::

    .venv/bin/python bench/models.py            # all 16: table + bench/results/models.json
    .venv/bin/python bench/models.py --quick    # gpt2-tied and llama, 2-stage only
    .venv/bin/python bench/models.py llama t5   # some
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "models.json"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

STEPS, MICROBATCHES, MICROBATCH_SIZE, LR = 3, 4, 2, 0.05
TOLERANCE = 1e-5
TOPOLOGY = """schema: pipeplan.topology/v1
name: cpu-local-{n}
allreduce_efficiency: 0.2
devices:
  - {{name: "cpu{{0..{last}}}", memory: 4 GiB, speed: 1.0, host: localhost, kind: cpu}}
switches:
  - {{name: loopback, kind: loopback}}
links:
  - {{between: ["cpu{{0..{last}}}", loopback], bandwidth: 3 GB/s, latency: 35 us}}
"""


def _topology(tmp: Path, n: int) -> Path:
    path = tmp / f"cpu{n}.yaml"
    path.write_text(TOPOLOGY.format(n=n, last=n - 1))
    return path


def _deepest_plan(profile_path: Path, topo_path: Path, depth: int) -> Any:
    """The fastest ``depth``-stage 1F1B pipeline (one stage per process) by the simulator."""
    from itertools import combinations

    from planner.plan import FileRef, parse_stages, plan_from_simulation
    from planner.profile.schema import load_profile
    from planner.simulate import simulate
    from planner.topology import load_topology

    profile, topo = load_profile(profile_path), load_topology(topo_path)
    n = profile.num_layers
    best = None
    for cuts in combinations(range(n - 1), depth - 1):
        bounds = [0, *(c + 1 for c in cuts), n]
        text = ";".join(f"{bounds[i]}-{bounds[i + 1] - 1}:cpu{i}" for i in range(depth))
        stages = parse_stages(text)
        r = simulate(profile, topo, stages, "1f1b", MICROBATCHES, MICROBATCH_SIZE)
        if best is None or r.iteration_ms < best[0].iteration_ms:
            best = (r, stages)
    assert best is not None
    r, stages = best
    return plan_from_simulation(
        r, stages, profile=FileRef.of_file(profile_path), topology=FileRef.of_file(topo_path)
    )


def _solved_plan(profile_path: Path, topo_path: Path) -> Any:
    from planner.profile.schema import load_profile
    from planner.solve import solve
    from planner.topology import load_topology

    return solve(
        load_profile(profile_path),
        load_topology(topo_path),
        global_batch=MICROBATCHES * MICROBATCH_SIZE,
        time_limit=20,
        profile_path=str(profile_path),
        topology_path=str(topo_path),
    )


def _compare(report: Any, reference: Any) -> tuple[float, float, bool]:
    """Worst relative loss difference, worst absolute parameter difference, and whether
    every parameter is within ``TOLERANCE`` relative (plus 1e-6 absolute, for values near
    zero such as attention key biases, whose gradient is zero up to rounding)."""
    import torch

    losses = max(
        abs(a - b) / max(abs(b), 1e-12)
        for a, b in zip(report.losses, reference.losses, strict=True)
    )
    worst, close = 0.0, True
    for name, value in reference.parameters.items():
        got = report.parameters[name]
        worst = max(worst, float((got - value).abs().max()))
        close = close and bool(torch.allclose(got, value, rtol=TOLERANCE, atol=1e-6))
    return losses, worst, close


def check_architecture(name: str, tmp: Path, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """Profile architecture ``name``, run each kind of plan; one row per plan."""
    from hf_zoo import write_model_file

    from planner.profile.measure import profile_model
    from planner.runtime import run_plan
    from planner.runtime.reference import train_single_process

    model = write_model_file(name, tmp)
    t0 = time.perf_counter()
    profile = profile_model(model, [1, MICROBATCH_SIZE], repeat=3, warmup=1, min_time_s=0)
    profile_s = time.perf_counter() - t0
    profile_path = tmp / f"{name}.json"
    profile.save(profile_path)
    reference = train_single_process(
        model, steps=STEPS, batch_size=MICROBATCHES * MICROBATCH_SIZE, optimizer="sgd", lr=LR
    )
    tied = [t.name for t in profile.tied_parameters]
    rows = []
    for kind in kinds:
        if kind == "solved":
            plan = _solved_plan(profile_path, _topology(tmp, 2))
        else:
            depth = int(kind.split("-")[0])
            plan = _deepest_plan(profile_path, _topology(tmp, depth), depth)
        plan_path = tmp / f"{name}.{kind}.plan.json"
        plan.save(plan_path)
        t1 = time.perf_counter()
        report = run_plan(
            plan_path, model, steps=STEPS, warmup=0, timeout_s=300, optimizer="sgd", lr=LR,
            threads=1, return_params=True,
        )  # fmt: skip
        run_s = time.perf_counter() - t1
        loss_diff, param_diff, close = _compare(report, reference)
        rows.append(
            {
                "model": name,
                "capture": profile.settings.capture,
                "layers": profile.num_layers,
                "tied": ", ".join(tied) or "-",
                "profile_s": round(profile_s, 1),
                "plan": kind,
                "stages": " / ".join(
                    f"{s.first}-{s.last}:{','.join(s.devices)}" for s in plan.stages
                ),
                "schedule": plan.schedule.name,
                "run_s": round(run_s, 1),
                "loss_rel_diff": float(f"{loss_diff:.2e}"),
                "param_abs_diff": float(f"{param_diff:.2e}"),
                "equal": loss_diff <= TOLERANCE and close,
            }
        )
        print(
            f"{name:10s} {kind:8s} {rows[-1]['stages']:34s} loss {loss_diff:.1e} "
            f"params {param_diff:.1e} {'ok' if rows[-1]['equal'] else 'DIFFERS'}",
            flush=True,
        )
    return rows


DOC = ROOT / "docs" / "models.md"
BEGIN, END = "<!-- bench/models.py: begin -->", "<!-- bench/models.py: end -->"


def write_doc_table(result: dict[str, Any]) -> None:
    """Rewrite the table between the markers of docs/models.md: one row per architecture."""
    import platform

    import torch
    import transformers

    by_model: dict[str, dict[str, Any]] = {}
    for row in result["rows"]:
        entry = by_model.setdefault(row["model"], dict(row))
        entry[row["plan"]] = (
            f"{'equal' if row['equal'] else 'DIFFERS'} ({row['param_abs_diff']:.0e}; "
            f"{row['stages']})"
        )
    lines = [
        BEGIN,
        f"`python bench/models.py` on {platform.processor() or platform.machine()}, torch "
        f"{torch.__version__}, transformers {transformers.__version__}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: {result['plans_equal']} plans equal.",
        "",
        "| architecture | capture | layers | tied | profile s | solved (cpu x2) | 2-stage 1F1B "
        "| 3-stage 1F1B |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in by_model.items():
        lines.append(
            f"| {name} | {e['capture']} | {e['layers']} | {e['tied']} | {e['profile_s']} | "
            f"{e.get('solved', '-')} | {e.get('2-stage', '-')} | {e.get('3-stage', '-')} |"
        )
    for failure in result["failures"]:
        lines.append(f"\nFailed: {failure}")
    lines.append(END)
    text = DOC.read_text() if DOC.exists() else f"{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + "\n".join(lines) + tail)


GPT2_768 = '''"""A 12-block Hugging Face GPT-2 at width 768, sequence 128 (GPT-2 small)."""
import torch


def build_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=128, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return GPT2LMHeadModel(config)


def sample_batch(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, 50257, (batch_size, 129), generator=g)
    return {"input_ids": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()
'''


def gpt2_small_profile_seconds(tmp: Path, threads: int) -> float:
    """Wall time of ``pipeplan profile gpt2_768.py -b 1,2 --threads N`` (defaults otherwise)."""
    import subprocess

    model = tmp / "gpt2_768.py"
    model.write_text(GPT2_768)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "planner.cli", "profile", str(model), "-b", "1,2",
         "--threads", str(threads), "-o", str(tmp / "gpt2_768.json"), "--quiet"],
        check=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    return round(time.perf_counter() - t0, 1)


def main() -> int:
    from hf_zoo import ARCHITECTURES

    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return 0
    unknown = [a for a in sys.argv[1:] if a.startswith("-") and a != "--quick"]
    if unknown:
        print(f"bench/models.py: unknown option {unknown[0]}; see --help", file=sys.stderr)
        return 2
    quick = "--quick" in sys.argv
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or (
        ["gpt2-tied", "llama"] if quick else list(ARCHITECTURES)
    )
    kinds = ("2-stage",) if quick else ("solved", "2-stage", "3-stage")
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                rows += check_architecture(name, Path(tmp), kinds)
            except Exception as exc:  # a row that says why, not a lost run
                failures.append(f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
                print(failures[-1], flush=True)
    profile_gpt2: dict[str, float] = {}
    if not quick and len(names) == len(ARCHITECTURES):
        with tempfile.TemporaryDirectory() as tmp:
            for threads in (1, 2):
                profile_gpt2[f"threads_{threads}"] = gpt2_small_profile_seconds(Path(tmp), threads)
                print(f"GPT-2 768 x 12 profile -b 1,2 --threads {threads}: "
                      f"{profile_gpt2[f'threads_{threads}']} s", flush=True)  # fmt: skip
    result = {
        "benchmark": "models",
        "gpt2_small_profile_s": profile_gpt2,
        "note": (
            f"Each plan: {STEPS} steps of {MICROBATCHES} microbatches of {MICROBATCH_SIZE}, SGD "
            f"lr {LR}, against single-process training; equal = losses and parameters within "
            f"{TOLERANCE:g} relative."
        ),
        "architectures": len(set(r["model"] for r in rows)),
        "plans_equal": f"{sum(r['equal'] for r in rows)}/{len(rows)}",
        "failures": failures,
        "rows": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    if not quick and len(names) == len(ARCHITECTURES):
        write_doc_table(result)
    ok = not failures and all(r["equal"] for r in rows)
    print(f"{result['plans_equal']} plans equal to single-process training; wrote {OUT.name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
