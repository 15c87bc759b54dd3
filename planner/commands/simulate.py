"""``pipeplan simulate``: time a partition given by hand, without solving.

Example::

    $ pipeplan simulate --profile profiles/mlp.json --topology topologies/nvlink.yaml \\
          --stages "0-3:gpu0,gpu1;4-7:gpu2" --schedule 1f1b --microbatches 8 -o plan.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from planner.plan import StageSpec

__all__ = ["load_stages_arg", "register", "simulate_command", "write_pictures"]


def load_stages_arg(text: str, recompute: list[int]) -> list[StageSpec]:
    """``--stages``: the shorthand ``"0-3:gpu0,gpu1;4-7:gpu2"`` or a JSON/YAML file.

    A file holds a list of ``{layers: [first, last], devices: [...], recompute: bool}``
    (or an object with that list under ``stages``, as in a plan).

    Example::

        load_stages_arg("0-3:gpu0;4-7:gpu1", [1])
    """
    from planner.errors import InputError
    from planner.plan import parse_stages, stages_from_data

    path = Path(text)
    if path.suffix.lower() in (".json", ".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise InputError("file does not exist", file=text, field="--stages")
        data = _read_data(path, "--stages")
        if isinstance(data, dict):
            data = data.get("stages")
        stages = stages_from_data(data, source=text)
        for sid in recompute:
            if not 0 <= sid < len(stages):
                raise InputError(f"stage {sid} does not exist", field="--recompute")
            stages[sid].recompute = True
        return stages
    return parse_stages(text, recompute=recompute)


def _schedule_arg(text: str) -> Any:
    """A schedule name, or the Schedule read from a JSON/YAML file."""
    from planner.errors import InputError
    from planner.schedule import SCHEDULES, Schedule

    if text in SCHEDULES:
        return text
    path = Path(text)
    if not path.is_file():
        raise InputError(
            f"unknown schedule {text!r}; expected one of {', '.join(SCHEDULES)} or a schedule file",
            field="--schedule",
        )
    data = _read_data(path, "--schedule")
    if isinstance(data, dict) and isinstance(data.get("schedule"), dict):
        data = data["schedule"]
    return Schedule.from_dict(data, source=text)


def _read_data(path: Path, flag: str) -> Any:
    from planner.errors import InputError

    raw = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            return json.loads(raw)
        import yaml

        return yaml.safe_load(raw)
    except Exception as exc:  # noqa: BLE001 - any parse error is the user's file
        raise InputError(f"cannot parse ({exc})", file=str(path), field=flag) from None


def _int_list(text: str | None, flag: str) -> list[int]:
    from planner.errors import InputError

    if not text:
        return []
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            f"expected comma-separated stage ids like 1,3, got {text!r}", field=flag
        ) from None


def write_pictures(
    result: Any,
    stages: list[StageSpec],
    *,
    svg: Path | None,
    html: Path | None,
    trace: Path | None,
    title: str,
) -> list[str]:
    """Write the requested SVG/HTML/trace files atomically; returns the paths written."""
    from planner.fileio import atomic_write_json, atomic_write_text
    from planner.render import render_html, render_svg, render_trace

    written = []
    if svg is not None:
        atomic_write_text(svg, render_svg(result, title=title))
        written.append(str(svg))
    if html is not None:
        atomic_write_text(html, render_html(result, title=title, stages=stages))
        written.append(str(html))
    if trace is not None:
        atomic_write_json(trace, render_trace(result))
        written.append(str(trace))
    return written


def simulate_command(
    profile: Path = typer.Option(
        ..., "--profile", help="Profile JSON (from `pipeplan profile`).", show_default=False
    ),
    topology: Path | None = typer.Option(
        None,
        "--topology",
        help="Topology YAML; without it communication is free and device names are free.",
        show_default=False,
    ),
    stages: str = typer.Option(
        ...,
        "--stages",
        help='Partition: "0-3:gpu0,gpu1;4-7:gpu2" (layers first-last inclusive, then the '
        "devices; several devices = data-parallel replicas) or a JSON/YAML stages file.",
        show_default=False,
    ),
    schedule: str = typer.Option(
        "1f1b",
        "--schedule",
        help="gpipe, 1f1b, interleaved, zb, 2bw or optimized; or a JSON/YAML file with an "
        "explicit per-device op order (a schedule object, or a plan holding one).",
    ),
    microbatches: int = typer.Option(8, "--microbatches", "-m", help="Microbatches per iteration."),
    microbatch_size: int | None = typer.Option(
        None,
        "--microbatch-size",
        "-b",
        help="Microbatch size (a profiled size; default the smallest).",
        show_default=False,
    ),
    recompute: str | None = typer.Option(
        None,
        "--recompute",
        help="Stage ids that recompute activations, e.g. 1,3.",
        show_default=False,
    ),
    virtual_stages: int = typer.Option(
        1, "--virtual-stages", help="Interleaved: chunks per device (inferred from --stages)."
    ),
    step_ms: float | None = typer.Option(
        None,
        "--step-ms",
        help="Optimizer step time per stage (ms); default: the profile's measured step.",
        show_default=False,
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Write the plan JSON here.", show_default=False
    ),
    svg: Path | None = typer.Option(
        None, "--svg", help="Write an SVG Gantt chart.", show_default=False
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Write an HTML report.", show_default=False
    ),
    trace: Path | None = typer.Option(
        None, "--trace", help="Write a Chrome/Perfetto trace JSON.", show_default=False
    ),
    no_gantt: bool = typer.Option(False, "--no-gantt", help="Skip the terminal Gantt chart."),
    as_json: bool = typer.Option(False, "--json", help="Print the predictions as JSON."),
) -> None:
    """Simulate a hand-given partition: iteration time, bubble, memory per device.

    Prints a table and a terminal Gantt chart; -o writes a plan.json (solver method
    "manual") that `pipeplan show` and `pipeplan run` accept.

    Example: pipeplan simulate --profile profiles/mlp.json --topology
    topologies/nvlink.yaml --stages "0-3:gpu0;4-7:gpu1" --schedule 1f1b --microbatches 8
    """
    from planner.errors import InputError
    from planner.fileio import check_output_path
    from planner.profile import load_profile
    from planner.simulate import plan_from_result, simulate

    for path, flag in ((output, "-o"), (svg, "--svg"), (html, "--html"), (trace, "--trace")):
        if path is not None:
            check_output_path(path, field=flag)
    if microbatches < 1:
        raise InputError(f"expected a positive integer, got {microbatches}", field="--microbatches")
    specs = load_stages_arg(stages, _int_list(recompute, "--recompute"))
    prof = load_profile(profile)
    topo = None
    if topology is not None:
        from planner.topology import load_topology

        topo = load_topology(topology)
    result = simulate(
        prof,
        topo,
        specs,
        _schedule_arg(schedule),
        microbatches,
        microbatch_size,
        virtual_stages=virtual_stages,
        step_ms=step_ms,
    )
    schedule = result.schedule.name
    title = (
        f"{schedule}: {len(specs)} stages, {microbatches} microbatches of {result.microbatch_size}"
    )
    if step_ms is not None:  # show re-simulates with the same override
        result.schedule.meta["step_ms"] = step_ms
    if output is not None:
        plan = plan_from_result(
            result,
            specs,
            profile_path=str(profile),
            topology_path=str(topology) if topology is not None else None,
        )
        plan.save(output)
    written = write_pictures(result, specs, svg=svg, html=html, trace=trace, title=title)
    if as_json:
        out = result.predicted()
        out["schedule"] = schedule
        out["stages"] = [s.to_dict() for s in specs]
        out["written"] = ([str(output)] if output else []) + written
        print(json.dumps(out, indent=1))
        return
    from rich.console import Console

    from planner.render import print_report

    console = Console(highlight=False)
    print_report(result, console, stages=specs, title=title, gantt=not no_gantt)
    for done in ([str(output)] if output else []) + written:
        console.print(f"wrote {done}")


def register(app: typer.Typer) -> None:
    """Add ``pipeplan simulate`` to the CLI."""
    app.command("simulate")(simulate_command)
