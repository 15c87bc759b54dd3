"""``pipeplan show``: a plan's stages, predicted time and memory, and its schedule drawn.

The plan's own schedule (the per-device op order ``run`` executes) is re-simulated on
the plan's profile and topology; if either file changed since the plan was written
(sha256), show refuses and says which.

Example::

    $ pipeplan show plan.json --svg plan.svg --html plan.html --trace trace.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from planner.plan import Plan
    from planner.simulate import SimResult

__all__ = ["plan_inputs", "register", "resimulate", "show_command"]


def _locate(ref: dict[str, Any], key: str, plan_path: Path) -> Path | None:
    """The referenced file, tried as written and then beside the plan."""
    from planner.errors import InputError
    from planner.fileio import sha256_file

    raw = ref.get("path")
    if raw is None:
        return None
    if raw == "<memory>":
        raise InputError(
            f"the plan's {key} was never saved to a file, so the plan cannot be re-simulated",
            file=str(plan_path),
            field=f"{key}.path",
        )
    candidates = [Path(raw), plan_path.parent / raw]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise InputError(
            f"{key} file {raw!r} not found (looked in the current folder and beside the plan)",
            file=str(plan_path),
            field=f"{key}.path",
        )
    want = ref.get("sha256")
    if want and sha256_file(found) != want:
        raise InputError(
            f"{key} {str(found)!r} changed since the plan was made (sha256 differs); "
            "re-run `pipeplan solve` or `pipeplan simulate -o` to make a new plan",
            file=str(plan_path),
            field=f"{key}.sha256",
        )
    return found


def plan_inputs(
    plan: Plan, plan_path: Path, *, profile: bool = True, topology: bool = True
) -> dict[str, Any]:
    """What re-simulating ``plan`` needs, its files checked against their stored sha256.

    Keys: ``profile`` / ``profile_path`` and ``topology`` / ``topology_path`` (each None
    when not asked for, or no topology), ``schedule`` (the stored op order) and
    ``step_ms`` (an explicit ``simulate --step-ms`` kept in the schedule's meta).

    Example::

        got = plan_inputs(Plan.load("plan.json"), Path("plan.json"), topology=False)
        got["profile"].num_layers
    """
    from planner.profile import load_profile
    from planner.schedule import Schedule

    out: dict[str, Any] = {"profile": None, "profile_path": None}
    out.update(topology=None, topology_path=None)
    if profile:
        prof_path = _locate(plan.profile, "profile", plan_path)
        assert prof_path is not None
        out.update(profile=load_profile(prof_path), profile_path=prof_path)
    topo_path = _locate(plan.topology, "topology", plan_path) if topology else None
    if topo_path is not None:
        from planner.topology import load_topology

        out.update(topology=load_topology(topo_path), topology_path=topo_path)
    out["schedule"] = Schedule.from_dict(plan.schedule, source=str(plan_path))
    meta = plan.schedule.get("meta")
    out["step_ms"] = meta.get("step_ms") if isinstance(meta, dict) else None
    return out


def resimulate(plan: Plan, plan_path: Path) -> SimResult:
    """Time the plan's stored schedule on its (unchanged) profile and topology.

    Example::

        result = resimulate(Plan.load("plan.json"), Path("plan.json"))
    """
    from planner.schedule import validate_schedule
    from planner.simulate import simulate

    got = plan_inputs(plan, plan_path)
    validate_schedule(got["schedule"], plan.stages, source=str(plan_path))
    return simulate(
        got["profile"],
        got["topology"],
        plan.stages,
        got["schedule"],
        plan.num_microbatches,
        plan.microbatch_size,
        step_ms=got["step_ms"],
        validate=False,
    )


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
        help="Columns of the terminal Gantt chart (at least 20).",
        show_default=False,
    ),
    no_gantt: bool = typer.Option(False, "--no-gantt", help="Skip the terminal Gantt chart."),
    as_json: bool = typer.Option(False, "--json", help="Print the re-simulated predictions."),
) -> None:
    """Show a plan: stages, predicted time and memory per device, and a Gantt chart.

    Example: pipeplan show plan.json --svg plan.svg --trace trace.json
    """
    from planner.commands.simulate import write_pictures
    from planner.errors import InputError
    from planner.fileio import check_output_path
    from planner.plan import Plan
    from planner.render import MIN_GANTT_WIDTH

    if width is not None and width < MIN_GANTT_WIDTH:
        raise InputError(
            f"expected at least {MIN_GANTT_WIDTH} columns, got {width}", field="--width"
        )
    for path, flag in ((svg, "--svg"), (html, "--html"), (trace, "--trace")):
        if path is not None:
            check_output_path(path, field=flag)
    plan = Plan.load(plan_file)
    result = resimulate(plan, plan_file)
    name = plan.schedule.get("name", "?")
    title = (
        f"{plan_file.name}: {name}, {len(plan.stages)} stages, {plan.num_microbatches} "
        f"microbatches of {plan.microbatch_size}"
    )
    written = write_pictures(result, plan.stages, svg=svg, html=html, trace=trace, title=title)
    if as_json:
        out = result.predicted()
        out["stored_iteration_ms"] = plan.predicted.get("iteration_ms")
        out["written"] = written
        print(json.dumps(out, indent=1))
        return
    from rich.console import Console

    from planner.render import print_report

    console = Console(highlight=False)
    print_report(result, console, stages=plan.stages, title=title, gantt=not no_gantt, width=width)
    stored = plan.predicted.get("iteration_ms")
    if isinstance(stored, int | float) and abs(stored - result.iteration_ms) > 1e-6 * max(
        1.0, stored
    ):
        console.print(f"(the plan file predicted {stored:.3f} ms)")
    solver = plan.solver
    if solver:
        console.print(f"Solver: {solver.get('method')}, {solver.get('status')}")
    for b in plan.baselines:
        ms = b.get("iteration_ms")
        shown = f"{ms:.3f} ms" if isinstance(ms, int | float) else "-"
        config = f" ({b['configuration']})" if b.get("configuration") else ""
        console.print(
            f"  baseline {b.get('name')}: {shown}{config}"
            + ("" if b.get("feasible", True) else " (does not fit)")
        )
    for done in written:
        console.print(f"wrote {done}")


def register(app: typer.Typer) -> None:
    """Add ``pipeplan show`` to the CLI."""
    app.command("show")(show_command)
