"""``pipeplan show``: a plan's stages, predicted time and memory, and its schedule drawn.

The plan's own schedule (the per-device op order ``run`` executes) is re-simulated on
the plan's profile and topology; if either file changed since the plan was written
(sha256), show refuses and says which.

Example::

    $ pipeplan show plan.json --svg plan.svg --html plan.html --trace trace.json
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from planner import terminal
from planner.errors import InputError
from planner.fileio import check_input_file, json_text
from planner.limits import MAX_GANTT_WIDTH, check_int
from planner.outputs import Outputs
from planner.plan import Plan, Prediction

__all__ = ["naming_plan", "register", "show_command"]


def show_command(
    plan_file: Path = typer.Argument(..., help="plan.json from solve or simulate -o."),
    svg: Path | None = typer.Option(
        None, "--svg", help="Write an SVG Gantt chart.", show_default=False
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Write an HTML report.", show_default=False
    ),
    trace: Path | None = typer.Option(
        None, "--trace", help="Write a Chrome/Perfetto trace JSON.", show_default=False
    ),
    width: int | None = typer.Option(
        None,
        "--width",
        help="Columns of the terminal Gantt chart (20 to 10000).",
        show_default=False,
    ),
    no_gantt: bool = typer.Option(False, "--no-gantt", help="Skip the terminal Gantt chart."),
    as_json: bool = typer.Option(False, "--json", help="Print the re-simulated predictions."),
) -> None:
    """Show a plan: stages, predicted time and memory per device, and a Gantt chart.

    Example: pipeplan show plan.json --svg plan.svg --trace trace.json
    """
    # lazy: `pipeplan --help` need not load plan_inputs or the renderer
    from planner.plan_inputs import plan_files, resimulate
    from planner.render import MIN_GANTT_WIDTH, render_pictures

    if width is not None and width < MIN_GANTT_WIDTH:
        raise InputError(
            f"expected at least {MIN_GANTT_WIDTH} columns, got {width}", field="--width"
        )
    if width is not None:
        check_int(width, field="--width", low=MIN_GANTT_WIDTH, high=MAX_GANTT_WIDTH)
    outs = Outputs([("the plan", check_input_file(plan_file))])
    for path, flag in ((svg, "--svg"), (html, "--html"), (trace, "--trace")):
        outs.file(path, flag)
    with naming_plan(plan_file):
        plan = Plan.load(plan_file)
        outs.add_inputs(plan_files(plan, plan_file))
        result = resimulate(plan, plan_file)
    name = plan.schedule.name
    title = (
        f"{plan_file.name}: {name}, {len(plan.stages)} stages, {plan.num_microbatches} "
        f"microbatches of {plan.microbatch_size}"
    )
    render_pictures(outs, result, plan.stages, svg=svg, html=html, trace=trace, title=title)
    written = [str(path) for path in outs.commit()]
    stored = plan.predicted.iteration_ms if plan.predicted is not None else None
    if as_json:
        out = Prediction.from_result(result).to_dict()
        out["stored_iteration_ms"] = stored
        out["written"] = written
        print(json_text(out), end="")
        return
    from planner.render import print_report

    console = terminal.console()
    print_report(result, console, stages=plan.stages, title=title, gantt=not no_gantt, width=width)
    if stored is not None and abs(stored - result.iteration_ms) > 1e-6 * max(1.0, stored):
        console.print(f"(the plan file predicted {stored:.3f} ms)")
    solver = plan.solver
    if solver is not None:
        console.print(f"Solver: {solver.method}, {solver.status}")
    for b in plan.baselines:
        ms = b.iteration_ms
        shown = f"{ms:.3f} ms" if ms is not None else "-"
        config = f" ({b.configuration})" if b.configuration else ""
        console.print(
            f"  baseline {b.name}: {shown}{config}" + ("" if b.feasible else " (does not fit)")
        )
    for done in written:
        console.print(f"wrote {done}")


@contextmanager
def naming_plan(plan_file: Path) -> Iterator[None]:
    """Name the plan file in an InputError that names no file (a stage on a device the
    topology lacks, a microbatch size the profile lacks): every error of ``show`` names
    the file it came from.

    Example::

        with naming_plan(Path("plan.json")):
            resimulate(plan, plan_file)
    """
    try:
        yield
    except InputError as exc:
        if exc.file is not None:
            raise
        raise type(exc)(exc.message, file=str(plan_file), field=exc.field) from None


def register(app: typer.Typer) -> None:
    """Add ``pipeplan show`` to the CLI."""
    app.command("show")(show_command)
