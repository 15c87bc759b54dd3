"""``pipeplan export``: a plan for torch.distributed.pipelining or torchtitan.

Example::

    $ pipeplan export plan.json --to torch -o plan-torch --model examples/gpt.py
    $ torchrun --nproc-per-node 2 plan-torch/train_pipeline.py
    $ pipeplan export plan.json --to torchtitan -o plan-torchtitan
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer

__all__ = ["export_command", "register"]


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to ``app``."""
    app.command("export")(export_command)


def export_command(
    plan_path: Path = typer.Argument(..., help="The plan.json to export.", show_default=False),
    to: str = typer.Option(
        ..., "--to", help="torch (torch.distributed.pipelining) or torchtitan.", show_default=False
    ),
    out: Path | None = typer.Option(
        None, "-o", "--output", help="Folder to write (default: PLAN-TO).", show_default=False
    ),
    model: Path | None = typer.Option(
        None,
        "--model",
        "-m",
        help="The model.py the plan was made for: checked against the profile and named in "
        "pipeline.json for train_pipeline.py.",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write what torch.distributed.pipelining (or torchtitan) needs to run exactly this plan.

    --to torch: schedule.csv (per-rank actions for _PipelineScheduleRuntime), pipeline.json
    (split points, stage modules, ranks, microbatches) and train_pipeline.py (builds the
    stages and the schedule and trains; run it with torchrun).

    --to torchtitan: torchtitan_config.py (a torchtitan 0.3 config: BASE, your model's
    torchtitan config, with the plan's parallelism), torchtitan.toml (the same fields to
    paste into a torchtitan 0.2.x job config) and the schedule CSV both name.

    Plans torch cannot run exactly (2bw, recompute, tied weights across stages, unequal
    replica counts, ...) are refused with one line. Details in docs/export.md.

    Example: pipeplan export plan.json --to torch --model examples/gpt.py
    """
    from planner.export import export_plan  # lazy: `pipeplan --help` need not load export

    result = export_plan(plan_path, to, out, model=model, isolate=True)  # model.py in a child
    if as_json:
        print(
            json.dumps(
                {
                    "target": result.target,
                    "out_dir": str(result.out_dir),
                    "files": [str(f) for f in result.files],
                    "pp_degree": result.pp_degree,
                    "dp_degree": result.dp_degree,
                    "tp_degree": result.tp_degree,
                    "world_size": result.world_size,
                    "notes": result.notes,
                },
                indent=2,
            )
        )
        return
    for path in result.files:
        print(f"wrote {path}")
    for note in result.notes:
        print(f"note: {note}")
    if result.target == "torch":
        script = result.out_dir / "train_pipeline.py"
        print(f"run: torchrun --nproc-per-node {result.world_size} {shlex.quote(str(script))}")
    else:
        print(
            f"torchtitan 0.3: PYTHONPATH={shlex.quote(str(result.out_dir))} torchrun "
            f"--nproc-per-node {result.world_size} -m torchtitan.train --module "
            "torchtitan_config --config pipeplan  (BASE in torchtitan_config.py: your "
            "model's torchtitan config)"
        )
        toml = result.out_dir / "torchtitan.toml"
        if toml in result.files:
            print(f"torchtitan 0.2.x: paste {toml} into your job config")
