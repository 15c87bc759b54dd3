"""``pipeplan import``: bring profiles measured by other tools into our format.

Example::

    $ pipeplan import pipedream ../shared/data/pipedream/vgg16/graph.txt \\
          -o profiles/pipedream-vgg16.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from planner.outputs import Outputs

if TYPE_CHECKING:
    from planner.profile.schema import Profile

__all__ = ["import_app", "register"]

import_app = typer.Typer(
    name="import",
    help=(
        "Convert profiles measured by other tools into pipeplan profiles.\n\n"
        "Example: pipeplan import pipedream vgg16/graph.txt -o profiles/pipedream-vgg16.json"
    ),
    no_args_is_help=True,
)


@import_app.command("pipedream")
def pipedream(
    graph: Path = typer.Argument(..., help="PipeDream profile (graph.txt).", show_default=False),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Profile JSON to write (default: profiles/pipedream-MODEL.json).",
        show_default=False,
    ),
    microbatch_size: int | None = typer.Option(
        None,
        "--microbatch-size",
        help=(
            "Minibatch size the file was measured at (times are not rescaled). Default: "
            "known for PipeDream's published vgg16 (128) and gnmt (32) profiles, else 1."
        ),
        show_default=False,
    ),
    optimizer: str = typer.Option(
        "adam", "--optimizer", help="Optimizer state to assume: adam, adamw (2x), momentum, sgd."
    ),
    device_name: str = typer.Option(
        "unknown: published PipeDream profile",
        "--device-name",
        help="Device the profile was measured on, recorded as the profile's device.",
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model name (default: the known name, else the file's folder name)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
) -> None:
    """Import a PipeDream profile (graph.txt: a DAG of timed layers) as a pipeplan profile.

    Every node becomes a layer in topological order (ties by node number), every edge an edge.

    The original node lines are kept in the profile's meta; see docs/import.md.

    Example: pipeplan import pipedream vgg16/graph.txt -o profiles/pipedream-vgg16.json
    """
    # lazy: `pipeplan --help` need not load the importer
    from planner.profile.import_pipedream import import_pipedream

    outs = Outputs([("the graph file", graph)])
    outs.file(output, "-o")
    profile = import_pipedream(
        graph,
        microbatch_size=microbatch_size,
        optimizer=optimizer,
        device_name=device_name,
        model=model,
    )
    target = output
    if target is None:
        target = outs.file(Path("profiles") / f"pipedream-{profile.model}.json", None)
    outs.write_json(target, profile.to_dict())
    outs.commit()
    _report(profile, target, as_json)


def _report(profile: Profile, target: Path, as_json: bool) -> None:
    m = profile.measurements[0]
    summary = {
        "output": str(target),
        "model": profile.model,
        "layers": profile.num_layers,
        "edges": len(profile.edge_list()),
        "microbatch_size": m.microbatch_size,
        "microbatch_size_source": profile.meta["pipedream"]["microbatch_size_source"],
        "forward_ms": round(sum(t.forward_ms for t in m.layers), 3),
        "backward_ms": round(sum(t.backward_ms for t in m.layers), 3),
        "param_count": sum(layer.param_count for layer in profile.layers),
    }
    if as_json:
        print(json.dumps(summary, indent=1))
        return
    from rich.table import Table

    from planner import terminal

    table = Table(title=f"PipeDream profile -> {target}", show_header=False)
    for key, value in summary.items():
        if key != "output":
            table.add_row(
                key.replace("_", " "), f"{value:,}" if isinstance(value, int) else str(value)
            )
    terminal.console(highlight=True).print(table)


def register(app: typer.Typer) -> None:
    """Add the ``import`` verb group to the ``pipeplan`` app."""
    app.add_typer(import_app, name="import")
