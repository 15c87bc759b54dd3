"""``pipeplan simulate``: time a partition given by hand, without solving.

Example::

    $ pipeplan simulate --profile profiles/mlp.json --topology topologies/nvlink.yaml \\
          --stages "0-2:gpu0,gpu1;3-5:gpu2" --schedule 1f1b --microbatches 8 -o plan.json
    $ pipeplan simulate --plan plan.json --schedule zb    # the same plan, another schedule
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from planner import terminal
from planner.datafile import read_data
from planner.errors import InputError, naming_file
from planner.fileio import check_input_file, json_text
from planner.limits import (
    MAX_LAYERS,
    MAX_MICROBATCH_SIZE,
    MAX_MICROBATCHES,
    MAX_TIME_MS,
    check_int,
    check_number,
    check_schedule_size,
)
from planner.outputs import InputFile, Outputs
from planner.plan import (
    FileRef,
    Plan,
    Prediction,
    StageSpec,
    check_schedule_data,
    check_schedule_name,
    parse_stages,
    plan_from_simulation,
    stages_from_data,
)
from planner.profile import load_profile
from planner.schedule import SCHEDULES, Schedule
from planner.simulate import simulate
from planner.simulate.band import Band, prediction_band
from planner.simulate.colocation import plan_colocation_note
from planner.stages import SHARDINGS, with_parallelism
from planner.topology import Topology, load_topology

if TYPE_CHECKING:
    from planner.profile.schema import Profile

__all__ = ["load_stages_arg", "register", "simulate_command"]


def load_stages_arg(text: str, recompute: list[int]) -> list[StageSpec]:
    """``--stages``: the shorthand ``"0-3:gpu0,gpu1;4-7:gpu2"`` or a JSON/YAML file.

    A file holds a list of ``{layers: [first, last], devices: [...], recompute: bool}``
    (or an object with that list under ``stages``, as in a plan).

    Example::

        load_stages_arg("0-3:gpu0;4-7:gpu1", [1])
    """
    path = Path(text)
    if path.suffix.lower() in (".json", ".yaml", ".yml") or _exists(path):
        check_input_file(path, field="--stages")
        data = _read_data(path, "--stages")
        if isinstance(data, dict):
            data = data.get("stages")
        return _marked(stages_from_data(data, source=text), recompute)
    return parse_stages(text, recompute=recompute)


def _schedule_arg(text: str) -> Any:
    """A schedule name, or the Schedule read from a JSON/YAML file."""
    if text in SCHEDULES:
        return text
    path = Path(text)
    looks_like_file = path.suffix.lower() in (".json", ".yaml", ".yml") or any(
        sep in text for sep in ("/", "\\")
    )
    if _exists(path):
        check_input_file(path, field="--schedule")
    elif looks_like_file:
        raise InputError(
            f"schedule file {text!r} does not exist (or give a schedule name: "
            f"{', '.join(SCHEDULES)})",
            field="--schedule",
        )
    if not _exists(path):
        raise InputError(
            f"unknown schedule {text[:60]!r}; expected one of {', '.join(SCHEDULES)} or a "
            "schedule file",
            field="--schedule",
        )
    data = _read_data(path, "--schedule")
    if isinstance(data, dict) and isinstance(data.get("schedule"), dict):
        data = data["schedule"]
    if isinstance(data, dict):
        check_schedule_data(data, source=text)
    return Schedule.from_dict(data, source=text)


def _exists(path: Path) -> bool:
    """Whether ``path`` names something on disk; False for text that cannot be a path (a
    name too long for the file system, a NUL byte): such text is read as stages or a name."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _read_data(path: Path, flag: str) -> Any:
    """A stages, schedule or plan file given to ``flag``, read strictly (planner.datafile);
    an error names the file and the flag, never quoting the file's content."""
    try:
        return read_data(path, what=f"a JSON or YAML file for {flag}")
    except InputError as exc:
        where = f"{flag}: {exc.field}" if exc.field else flag
        raise InputError(exc.message, file=str(path), field=where) from None


def _int_list(text: str | None, flag: str) -> list[int]:
    if not text:
        return []
    items = [x.strip() for x in text.split(",") if x.strip()]
    if len(items) > MAX_LAYERS or not all(x.isdecimal() and len(x) <= 9 for x in items):
        raise InputError(
            f"expected comma-separated stage ids like 1,3 (at most {MAX_LAYERS:,}), "
            f"got {text[:60]!r}",
            field=flag,
        )
    return [int(x) for x in items]


def _plan_microbatch_size(schedule: str) -> int | None:
    """A plan given as ``--schedule``: its microbatch size (the one its order was made for)."""
    path = Path(schedule)
    if path.suffix.lower() not in (".json", ".yaml", ".yml") or not _exists(path):
        return None
    try:
        data = _read_data(path, "--schedule")
    except Exception:  # noqa: BLE001 - _schedule_arg reports a bad file properly
        return None
    size = data.get("microbatch_size") if isinstance(data, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _marked(stages: list[StageSpec], recompute: list[int]) -> list[StageSpec]:
    """A copy of a plan's stages with ``--recompute`` ids switched on (a stage that
    recomputes already keeps its unit: each layer or the whole stage)."""
    out = list(stages)
    for sid in recompute:
        if not 0 <= sid < len(out):
            raise InputError(f"stage {sid} does not exist", field="--recompute")
        if not out[sid].recompute:
            out[sid] = out[sid].with_recompute(True)
    return out


def _plan_schedule(
    plan: Plan,
    stored: Schedule,
    specs: list[StageSpec],
    num_microbatches: int,
    microbatch_size: int | None,
    plan_file: Path,
) -> Any:
    """The plan's own op order, or (stages or microbatches overridden) its schedule rebuilt."""
    same = (
        [s.to_dict() for s in specs] == [s.to_dict() for s in plan.stages]
        and num_microbatches == plan.num_microbatches
        and microbatch_size == plan.microbatch_size
    )
    if same:
        return stored
    name = stored.name
    if name not in SCHEDULES:
        raise InputError(
            f"the plan's schedule {name!r} is an explicit order that cannot be rebuilt for "
            "other stages or microbatches; give --schedule",
            file=str(plan_file),
            field="schedule.name",
        )
    return name


@dataclass
class _Resolved:
    """What to simulate, from the flags and (with ``--plan``) the plan's own inputs."""

    profile: Profile
    profile_path: Path | None
    topology: Topology | None
    topology_path: Path | None
    stages: list[StageSpec]
    schedule: Any  # a schedule name or an explicit Schedule
    num_microbatches: int
    microbatch_size: int | None
    step_ms: float | None


def _resolve(
    profile: Path | None,
    topology: Path | None,
    stages: str | None,
    schedule: str | None,
    num_microbatches: int | None,
    microbatch_size: int | None,
    recompute: str | None,
    virtual_stages: int,
    step_ms: float | None,
    plan_file: Path | None,
    parallelism: tuple[bool, str | None] = (False, None),
    recompute_layers: bool = False,
) -> _Resolved:
    """The flags, completed from ``--plan`` (its files sha256-checked unless overridden)."""
    from planner.plan_inputs import plan_inputs  # lazy: not needed by `pipeplan --help`

    plan = Plan.load(plan_file) if plan_file is not None else None
    got = None
    if plan is not None and plan_file is not None:
        got = plan_inputs(plan, plan_file, profile=profile is None, topology=topology is None)
        num_microbatches = plan.num_microbatches if num_microbatches is None else num_microbatches
        microbatch_size = plan.microbatch_size if microbatch_size is None else microbatch_size
        step_ms = got.step_ms if step_ms is None else step_ms
    elif schedule is not None and microbatch_size is None:
        microbatch_size = _plan_microbatch_size(schedule)
    num_microbatches = 8 if num_microbatches is None else num_microbatches
    if num_microbatches < 1:
        raise InputError(
            f"expected a positive integer, got {num_microbatches}", field="--microbatches"
        )
    check_int(num_microbatches, field="--microbatches", high=MAX_MICROBATCHES)
    if microbatch_size is not None:
        check_int(microbatch_size, field="--microbatch-size", high=MAX_MICROBATCH_SIZE)
    if virtual_stages < 1:
        raise InputError(
            f"expected an integer >= 1, got {virtual_stages}", field="--virtual-stages"
        )
    check_int(virtual_stages, field="--virtual-stages", high=MAX_LAYERS)
    if step_ms is not None and not (math.isfinite(step_ms) and step_ms >= 0):
        raise InputError(f"expected a finite number >= 0, got {step_ms}", field="--step-ms")
    if step_ms is not None:
        check_number(step_ms, field="--step-ms", high=MAX_TIME_MS, unit=" ms")
    marks = _int_list(recompute, "--recompute")
    if stages is not None:
        specs = load_stages_arg(stages, marks)
    elif plan is not None:
        specs = _marked(plan.stages, marks)
    else:
        raise InputError("missing: give the partition (or --plan plan.json)", field="--stages")
    if recompute_layers:
        # The --recompute stages, or without it those that recompute already.
        layered = set(marks) or {st.id for st in specs if st.recompute}
        if not layered:
            raise InputError(
                "says how the --recompute stages checkpoint; give --recompute too",
                field="--recompute-layers",
            )
        specs = [st.with_recompute(True, layers=True) if st.id in layered else st for st in specs]
    sequence_parallel, sharding = parallelism
    if sequence_parallel or sharding is not None:
        specs = with_parallelism(specs, sequence_parallel=sequence_parallel, sharding=sharding)
    if profile is not None:
        prof = load_profile(profile)
    elif got is not None and got.profile is not None:
        prof, profile = got.profile, got.profile_path
    else:
        raise InputError("missing: give a profile (or --plan plan.json)", field="--profile")
    if microbatch_size is not None and microbatch_size not in prof.microbatch_sizes:
        raise InputError(
            f"microbatch size {microbatch_size} was not profiled; profiled sizes are "
            f"{list(prof.microbatch_sizes)}",
            file=str(profile),
            field="--microbatch-size",
        )
    topo = got.topology if got is not None else None
    if topology is not None:
        topo = load_topology(topology)
    elif got is not None:
        topology = got.topology_path
    if schedule is not None:
        chosen: Any = _schedule_arg(schedule)
        if isinstance(chosen, Schedule):
            check_schedule_name(chosen, specs, source=schedule)
    elif plan is not None and got is not None and plan_file is not None:
        chosen = _plan_schedule(
            plan, got.schedule, specs, num_microbatches, microbatch_size, plan_file
        )
    else:
        chosen = "1f1b"
    return _Resolved(
        prof, profile, topo, topology, specs, chosen, num_microbatches, microbatch_size, step_ms
    )


def simulate_command(
    profile: Path | None = typer.Option(
        None,
        "--profile",
        help="Profile JSON (from `pipeplan profile`); default with --plan: the plan's.",
        show_default=False,
    ),
    topology: Path | None = typer.Option(
        None,
        "--topology",
        help="Topology YAML; without it communication is free and device names are free.",
        show_default=False,
    ),
    stages: str | None = typer.Option(
        None,
        "--stages",
        help='Partition: "0-3:gpu0,gpu1;4-7:gpu2" (layers first-last inclusive, then the '
        "devices; several devices = data-parallel replicas; '+' joins a tensor-parallel "
        'group: "0-3:gpu0+gpu1,gpu2+gpu3") or a JSON/YAML stages file; default with '
        "--plan: the plan's.",
        show_default=False,
    ),
    sequence_parallel: bool = typer.Option(
        False,
        "--sequence-parallel",
        help="Sequence parallelism on every tensor-parallel stage (the profile's tpN-sp "
        "entries: reduce-scatter and all-gather instead of all-reduce).",
    ),
    sharding: str | None = typer.Option(
        None,
        "--sharding",
        help=f"Data-parallel sharding of every replicated stage: {', '.join(SHARDINGS)} "
        "(zero1: optimizer state; fsdp: parameters, gradients and optimizer state). Default: "
        "the stages' own (none).",
        show_default=False,
    ),
    schedule: str | None = typer.Option(
        None,
        "--schedule",
        help="gpipe, 1f1b, interleaved, zb, 2bw or optimized; or a JSON/YAML file with an "
        "explicit per-device op order (a schedule object, or a plan holding one). Default "
        "1f1b; with --plan the plan's own op order.",
        show_default=False,
    ),
    num_microbatches: int | None = typer.Option(
        None,
        "--microbatches",
        "-m",
        help="Microbatches per iteration (default 8; with --plan the plan's).",
        show_default=False,
    ),
    microbatch_size: int | None = typer.Option(
        None,
        "--microbatch-size",
        "-b",
        help="Microbatch size (a profiled size; default the plan's with --plan or a plan "
        "given as --schedule, else the smallest profiled).",
        show_default=False,
    ),
    recompute: str | None = typer.Option(
        None,
        "--recompute",
        help="Stage ids that recompute activations, e.g. 1,3.",
        show_default=False,
    ),
    recompute_layers: bool = typer.Option(
        False,
        "--recompute-layers",
        help="The --recompute stages (without it: the stages that recompute already) "
        "checkpoint each layer on its own (only the layers' inputs kept, one layer rebuilt at "
        "a time: Megatron-LM's full recompute) instead of the whole stage under one "
        "checkpoint.",
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
    plan_file: Path | None = typer.Option(
        None,
        "--plan",
        help="Evaluate an existing plan.json: profile, topology, stages, schedule and "
        "microbatches come from it (refused if its profile or topology changed); flags "
        "given explicitly override them.",
        show_default=False,
    ),
    no_gantt: bool = typer.Option(False, "--no-gantt", help="Skip the terminal Gantt chart."),
    as_json: bool = typer.Option(False, "--json", help="Print the predictions as JSON."),
) -> None:
    """Simulate a hand-given partition: iteration time, bubble, memory per device.

    Prints a table and a terminal Gantt chart; -o writes a plan.json (solver method
    "manual") that `pipeplan show` and `pipeplan run` accept.

    Example: pipeplan simulate --profile profiles/mlp.json --stages "0-2:gpu0;3-5:gpu1" -m 8

    Example: pipeplan simulate --plan plan.json --schedule zb
    """
    for path, flag in ((profile, "--profile"), (topology, "--topology"), (plan_file, "--plan")):
        if path is not None:
            check_input_file(path, field=flag)
    outs = Outputs(_given_files(profile, topology, plan_file, stages, schedule))
    for path, flag in ((output, "-o"), (svg, "--svg"), (html, "--html"), (trace, "--trace")):
        outs.file(path, flag)
    with naming_file(_stages_source(stages, plan_file)):
        got = _resolve(
            profile, topology, stages, schedule, num_microbatches, microbatch_size, recompute,
            virtual_stages, step_ms, plan_file, (sequence_parallel, sharding), recompute_layers,
        )  # fmt: skip
        outs.add_inputs([("the profile", got.profile_path), ("the topology", got.topology_path)])
        specs, step_ms = got.stages, got.step_ms
        if isinstance(got.schedule, str):  # before the schedule is built
            check_schedule_size(len(specs), got.num_microbatches, field="--microbatches")
        result = simulate(
            got.profile, got.topology, specs, got.schedule, got.num_microbatches,
            got.microbatch_size, virtual_stages=virtual_stages, step_ms=step_ms,
        )  # fmt: skip
    band = prediction_band(got.profile, got.topology, specs, result, step_ms=step_ms)
    if output is not None:
        outs.write_json(output, _plan_data(result, got, output, band))
    _emit(
        result, specs, outs, svg=svg, html=html, trace=trace, as_json=as_json, gantt=not no_gantt,
        band=band,
    )  # fmt: skip
    note = plan_colocation_note(got.profile, got.topology, specs)
    if note is not None:
        terminal.console(stderr=True).print(f"warning: {note}")


def _stages_source(stages: str | None, plan_file: Path | None) -> str | None:
    """What a stage's error names: the --stages file, the flag for a text, or the plan."""
    if stages is not None:
        path = Path(stages)
        return (
            stages
            if path.suffix.lower() in (".json", ".yaml", ".yml") or _exists(path)
            else "--stages"
        )
    return None if plan_file is None else str(plan_file)


def _given_files(
    profile: Path | None,
    topology: Path | None,
    plan_file: Path | None,
    stages: str | None,
    schedule: str | None,
) -> list[InputFile]:
    """The files the flags name (a --stages or --schedule text that is a file included)."""
    files: list[InputFile] = [("--profile", profile), ("--topology", topology)]
    files.append(("--plan", plan_file))
    for flag, text in (("--stages", stages), ("--schedule", schedule)):
        if text is not None and _exists(Path(text)) and Path(text).is_file():
            files.append((flag, Path(text)))
    return files


def _plan_data(result: Any, got: _Resolved, output: Path, band: Band) -> dict[str, Any]:
    """``-o``: the simulated partition as a plan (solver ``manual``), its inputs' sha256
    and its prediction's band."""
    topo = got.topology_path
    return plan_from_simulation(
        result,
        got.stages,
        profile=_file_ref(got.profile_path, output),
        topology=FileRef(None) if topo is None else _file_ref(topo, output),
        step_ms=got.step_ms,  # show re-simulates with the same override
        band_ms=band.as_list(),
    ).to_dict()


def _file_ref(path: Path | str | None, output: Path) -> FileRef:
    """The input file as the plan at ``output`` names it (found from any folder)."""
    assert path is not None  # a profile is required before anything is simulated
    return FileRef.of_file(path).for_plan(output)


def _emit(
    result: Any,
    specs: list[StageSpec],
    outs: Outputs,
    *,
    svg: Path | None,
    html: Path | None,
    trace: Path | None,
    as_json: bool,
    gantt: bool,
    band: Band,
) -> None:
    """Write the plan and the pictures asked for, all or none; print the predictions (JSON
    or table and chart) and the prediction's band."""
    from planner.render import print_report, render_pictures  # lazy: not needed by --help

    title = (
        f"{result.schedule.name}: {len(specs)} stages, {result.num_microbatches} microbatches "
        f"of {result.microbatch_size}"
    )
    render_pictures(outs, result, specs, svg=svg, html=html, trace=trace, title=title)
    files = [str(path) for path in outs.commit()]
    if as_json:
        out = Prediction.from_result(result, band_ms=band.as_list()).to_dict()
        out["schedule"] = result.schedule.name
        out["stages"] = [s.to_dict() for s in specs]
        out["written"] = files
        print(json_text(out), end="")
        return
    console = terminal.console()
    print_report(result, console, stages=specs, title=title, gantt=gantt)
    console.print(
        f"band: {band.low_ms:.3f}-{band.high_ms:.3f} ms (every layer at the low / high end "
        "of its profiled spread)"
    )
    for done in files:
        console.print(f"wrote {done}")


# The command's parameters are typer options, one declaration per flag; those of the
# commands look alike in shape (duplicates pairs them), not in names, defaults or help.
def register(app: typer.Typer) -> None:
    """Add ``pipeplan simulate`` to the CLI."""
    app.command("simulate")(simulate_command)
