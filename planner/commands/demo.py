"""``pipeplan demo``: the whole chain on a bundled example, on this machine's CPU, no arguments.

The demo is a list of steps, :data:`DEMO_STEPS`; each step reads and extends a shared
:class:`DemoContext`: profile the model, solve for ``topologies/cpu.yaml`` (this machine's
CPU processes), run a few training steps with exactly that plan and print predicted against
measured. The steps work in a temporary folder; the profile and the plan land in ``--out``
together when every step has succeeded (:class:`planner.outputs.Outputs`), else neither.

Example::

    $ pipeplan demo
    $ pipeplan demo --model cnn --out out/demo
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

import planner
from planner.commands.profile import profile_table, run_profile
from planner.commands.solve import print_plan
from planner.errors import InputError
from planner.outputs import Outputs
from planner.simulate.colocation import cpu_processes_per_host
from planner.solve import solve
from planner.topology import load_topology

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "DEMO_STEPS",
    "DemoContext",
    "DemoStep",
    "examples_dir",
    "register",
    "run_demo",
]

BUNDLED = ("gpt", "mlp", "cnn")


@dataclass
class DemoContext:
    """What the demo's steps share: where to work, which model, and each step's results.

    ``results`` keys: ``profile`` (a Profile), ``profile_path``, ``plan`` (a Plan),
    ``plan_path`` (in ``work_dir`` while the steps run, in ``--out`` once written) and
    ``run`` (the runtime's RunReport).
    """

    console: Console
    work_dir: Path
    model: Path
    microbatch_sizes: list[int]
    steps: int = 6
    results: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


DemoStep = Callable[[DemoContext], None]


def _profile_step(ctx: DemoContext) -> None:
    """Profile the bundled model as the plan will run it (its processes co-located on this
    machine, as many as topologies/cpu.yaml has: planner.profile.colocation) and print it."""
    stem = ctx.model.stem
    profile, path = run_profile(
        ctx.model,
        ",".join(map(str, ctx.microbatch_sizes)),
        output=ctx.work_dir / f"{stem}.json",
        console=ctx.console,
        colocate=cpu_processes_per_host(load_topology(_cpu_topology())) or 1,
    )
    ctx.results["profile"] = profile
    ctx.results["profile_path"] = path
    ctx.console.print(profile_table(profile))


def _solve_step(ctx: DemoContext) -> None:
    """Solve for this machine's CPU processes (topologies/cpu.yaml) and print the plan."""
    profile = ctx.results["profile"]
    topology_path = _cpu_topology()
    topology = load_topology(topology_path)
    plan = solve(
        profile,
        topology,
        num_microbatches=2 * len(topology.devices),
        time_limit=20,
        profile_path=str(ctx.results["profile_path"]),
        topology_path=str(topology_path),
    )
    path = ctx.work_dir / "plan.json"
    plan.profile, plan.topology = plan.profile.for_plan(path), plan.topology.for_plan(path)
    plan.save(path)
    ctx.results["plan"] = plan
    ctx.results["plan_path"] = path
    print_plan(plan, [layer.name for layer in profile.layers], console=ctx.console)


def _run_step(ctx: DemoContext) -> None:
    """Train a few steps with exactly that plan on CPU processes; predicted vs measured."""
    # lazy: `pipeplan --help` need not load the runtime
    from planner.runtime import run_plan
    from planner.runtime.report import print_run_report

    report = run_plan(ctx.results["plan_path"], ctx.model, steps=ctx.steps, device="cpu")
    ctx.results["run"] = report
    print_run_report(report, ctx.console)


DEMO_STEPS: tuple[tuple[str, DemoStep], ...] = (
    ("profile", _profile_step),
    ("solve", _solve_step),
    ("run", _run_step),
)


def _cpu_topology() -> Path:
    return examples_dir().parent / "topologies" / "cpu.yaml"


def examples_dir() -> Path:
    """The bundled ``examples/`` folder (beside the ``planner`` package in a checkout).

    Example::

        examples_dir() / "gpt.py"
    """
    return Path(planner.__file__).resolve().parent.parent / "examples"


def run_demo(
    model: str = "gpt",
    *,
    out_dir: str | Path = "out/demo",
    microbatch_sizes: list[int] | None = None,
    steps: int = 6,
    console: Console | None = None,
) -> DemoContext:
    """Run every step of :data:`DEMO_STEPS` on a bundled example; returns the context.

    Example::

        ctx = run_demo("mlp", out_dir="out/demo")
        ctx.results["profile"].num_layers
    """
    from rich.console import Console

    if model not in BUNDLED:
        raise InputError(f"expected one of {', '.join(BUNDLED)}, got {model!r}", field="--model")
    source = examples_dir() / f"{model}.py"
    if not source.is_file():
        raise InputError(
            "bundled example not found; the demo needs a checkout of pipeplan (pip install -e .)",
            file=str(source),
        )
    out = Path(out_dir)
    outs = Outputs([("the bundled model", source)])
    outs.folder(out, "--out", make_folder=True)
    work = Path(tempfile.mkdtemp(prefix="pipeplan-demo-"))
    try:
        ctx = DemoContext(
            console=console or Console(),
            work_dir=work,
            model=source,
            microbatch_sizes=microbatch_sizes or [1, 2],
            steps=steps,
        )
        for name, step in DEMO_STEPS:
            ctx.console.rule(f"[bold]{name}")
            started = time.perf_counter()
            step(ctx)
            ctx.timings[name] = round(time.perf_counter() - started, 2)
        for path in _write_results(ctx, outs, out):
            ctx.console.print(f"wrote {path}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ctx


def _write_results(ctx: DemoContext, outs: Outputs, out: Path) -> list[Path]:
    """The profile and the plan, from the work folder into ``out`` (both or neither); the
    plan names the profile where it now lies."""
    profile_path = out / Path(ctx.results["profile_path"]).name
    plan_path = out / "plan.json"
    plan = ctx.results["plan"]
    plan.profile = replace(plan.profile, path=str(profile_path)).for_plan(plan_path)
    outs.write_bytes(profile_path, Path(ctx.results["profile_path"]).read_bytes())
    outs.write_json(plan_path, plan.to_dict())
    written = outs.commit()
    ctx.results["profile_path"], ctx.results["plan_path"] = profile_path, plan_path
    return written


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to ``app``."""
    app.command("demo")(demo)


def demo(
    model: str = typer.Option("gpt", "--model", help=f"Bundled example: {', '.join(BUNDLED)}."),
    out: Path = typer.Option(Path("out/demo"), "--out", help="Folder for the files it writes."),
    steps: int = typer.Option(6, "--steps", min=1, help="Training steps to run and time."),
    as_json: bool = typer.Option(
        False, "--json", help="Print what each step produced (files, seconds) as JSON."
    ),
) -> None:
    """Run the whole chain on a bundled model on this machine's CPU; no arguments needed.

    Profiles the model, solves for topologies/cpu.yaml (one process per core here), trains a
    few steps with exactly that plan and prints predicted against measured iteration time.

    Example: pipeplan demo --model mlp
    """
    from rich.console import Console

    console = Console(stderr=True) if as_json else Console()
    ctx = run_demo(model, out_dir=out, steps=steps, console=console)
    if as_json:
        files = {k: str(v) for k, v in ctx.results.items() if isinstance(v, Path)}
        result: dict[str, Any] = {"model": model, "files": files, "seconds": ctx.timings}
        if "run" in ctx.results:
            result["run"] = ctx.results["run"].to_dict()
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
