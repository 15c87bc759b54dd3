"""``pipeplan solve``: find the fastest plan that fits, write plan.json, compare with baselines.

Example::

    $ pipeplan solve --profile profiles/mlp.json --topology topologies/nvlink.yaml \\
          --global-batch 64 --time-limit 20 -o plan.json
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from planner import terminal
from planner.fileio import check_input_file, json_text
from planner.outputs import Outputs
from planner.profile import load_profile
from planner.simulate.colocation import plan_colocation_note
from planner.solve import solve
from planner.topology import load_topology
from planner.units import format_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from planner.plan import Plan, Prediction
    from planner.stages import StageSpec

__all__ = ["print_plan", "register", "solve_command"]


def solve_command(
    profile: Path = typer.Option(
        ..., "--profile", help="Profile JSON (from `pipeplan profile`).", show_default=False
    ),
    topology: Path = typer.Option(
        ..., "--topology", help="Topology YAML (see topologies/).", show_default=False
    ),
    global_batch: int | None = typer.Option(
        None,
        "--global-batch",
        help="Samples per iteration; the microbatch size is searched over the profiled sizes "
        "that divide it.",
        show_default=False,
    ),
    num_microbatches: int | None = typer.Option(
        None,
        "--microbatches",
        help="Number of microbatches per iteration (default: 2 x devices when no "
        "--global-batch is given).",
        show_default=False,
    ),
    schedule: str = typer.Option(
        "auto",
        "--schedule",
        help="auto (try 1f1b, gpipe, zb, interleaved), gpipe, 1f1b, interleaved, zb or 2bw.",
    ),
    time_limit: float = typer.Option(
        60.0,
        "--time-limit",
        help="Seconds the whole solve may take: then the best plan simulated so far is "
        "returned (solver status 'time limit'); the integer program gets half of what is "
        "left when it starts.",
    ),
    output: Path = typer.Option(Path("plan.json"), "-o", "--output", help="Plan JSON to write."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON on stdout."),
) -> None:
    """Find the fastest pipeline plan that fits in memory and write it to plan.json.

    Searches stages (layer ranges), devices per stage (replicas), recompute, microbatch
    size and schedule; the simulator judges every candidate. Prints the stages, predicted
    time, memory per device against its limit, the lower bound and the baselines.

    Example: pipeplan solve --profile profiles/mlp.json --topology topologies/nvlink.yaml
    --global-batch 64
    """
    check_input_file(profile, field="--profile")
    check_input_file(topology, field="--topology")
    outs = Outputs([("--profile", profile), ("--topology", topology)])
    outs.file(output, "-o")
    prof = load_profile(profile)
    topo = load_topology(topology)
    plan = solve(
        prof,
        topo,
        global_batch=global_batch,
        num_microbatches=num_microbatches,
        schedule=schedule,
        time_limit=time_limit,
        profile_path=str(profile),
        topology_path=str(topology),
    )
    # Relative inputs as the plan's folder sees them, so it finds them from anywhere.
    plan.profile, plan.topology = plan.profile.for_plan(output), plan.topology.for_plan(output)
    outs.write_json(output, plan.to_dict())
    outs.commit()
    note = plan_colocation_note(prof, topo, plan.stages)
    if as_json:
        print(json_text(plan.to_dict()), end="")
    else:
        print_plan(plan, [layer.name for layer in prof.layers], output=output)
    if note is not None:
        terminal.console(stderr=True).print(f"warning: {note}")


def print_plan(
    plan: Plan,
    layer_names: list[str],
    *,
    output: Path | None = None,
    console: Console | None = None,
) -> None:
    """Print a plan's stages, memory, prediction, solver status and baselines.

    Example::

        print_plan(plan, [layer.name for layer in profile.layers], output=Path("plan.json"))
    """
    from rich.table import Table

    console = console or terminal.console()
    sched, vs = plan.schedule.name, plan.schedule.virtual_stages
    title = (
        f"Plan: {len(plan.stages)} stages, schedule {sched}"
        + (f" (v={vs})" if vs > 1 else "")
        + f", {plan.num_microbatches} microbatches of {plan.microbatch_size}"
    )
    table = Table(title=title)
    # Tensor-parallel groups are written with '+', and a column says TP, SP and sharding
    # (only where a stage has them: plain plans print as they always did).
    parallel = not all(s.is_plain for s in plan.stages)
    for col in ("stage", "layers", "devices", "recompute") + (("parallelism",) if parallel else ()):
        table.add_column(col)
    for s in plan.stages:
        a, b = s.layers
        names = f"{a}-{b}" if a != b else f"{a}"
        span = f"{names}  ({layer_names[a]} .. {layer_names[b]})" if a != b else names
        devices = ", ".join("+".join(g) for g in s.replica_groups)
        row = [str(s.id), span, devices, "yes" if s.recompute else ""]
        table.add_row(*row, *((_parallelism(s),) if parallel else ()))
    console.print(table)
    if plan.predicted is not None:
        _print_prediction(console, plan.predicted)
    solver = plan.solver
    if solver is not None:
        line = f"Solver: {solver.method}, {solver.status}, {solver.seconds} s"
        ilp = solver.ilp
        if ilp is not None:
            shown = "-" if ilp.gap is None else f"{100.0 * ilp.gap:.2f}%"
            line += f"; ILP {ilp.status}, gap {shown}, {ilp.seconds} s"
        console.print(line)
        if solver.ties is not None and solver.ties > 1:
            tolerance = f"{100.0 * (solver.tie_tolerance or 0.0):.1f}%"
            fastest = (
                f"; the fastest was {solver.fastest_ms:.3f} ms"
                if solver.fastest_ms is not None
                else ""
            )
            console.print(
                f"Ties: {solver.ties} plans within {tolerance} of the fastest (the profile's "
                "noise); this one preferred (fewer devices, simpler schedule, fewer stages)"
                + fastest
            )

    _print_peers(console, plan)
    if output is not None:
        console.print(f"Wrote {output}")


def _parallelism(stage: StageSpec) -> str:
    """``TP2, SP, zero1``: a stage's parallelism beyond replicas (empty for a plain one)."""
    extra = [f"TP{stage.tensor_parallel}"] if stage.tensor_parallel > 1 else []
    if stage.sequence_parallel:
        extra.append("SP")
    if stage.sharding != "none":
        extra.append(stage.sharding)
    return ", ".join(extra)


def _print_prediction(console: Console, pred: Prediction) -> None:
    """Memory per device, the predicted iteration and its lower bounds."""
    from rich.table import Table

    mem = Table(title="Memory per device")
    mem.add_column("device")
    mem.add_column("peak", justify="right")
    mem.add_column("limit", justify="right")
    mem.add_column("use", justify="right")
    limits = pred.memory_limit_bytes
    for dev, used in pred.memory_bytes.items():
        limit = limits.get(dev, 0)
        share = f"{100.0 * used / limit:.0f}%" if limit else "-"
        mem.add_row(dev, format_bytes(used), format_bytes(limit), share)
    console.print(mem)

    it, lb = pred.iteration_ms, pred.lower_bound_ms
    gap = f"{100.0 * (it / lb - 1):.1f}%" if lb else "-"
    band = pred.iteration_band_ms
    within = f" (band {band[0]:.3f}-{band[1]:.3f})" if band else ""
    console.print(
        f"Predicted iteration: {it:.3f} ms{within}  ({pred.samples_per_s:.1f} samples/s, "
        f"bubble {100.0 * pred.bubble_fraction:.1f}%)"
    )
    console.print(f"Lower bound: {lb:.3f} ms  (this plan; gap {gap})")
    glb = pred.global_lower_bound_ms
    if glb is not None and glb > 0:
        console.print(
            f"Global lower bound: {glb:.3f} ms  (any plan; gap {100.0 * (it / glb - 1):.1f}%)"
        )


def _print_peers(console: Console, plan: Plan) -> None:
    """The tuned peers (each at its best configuration), what the search found before
    their plans joined its pool, and the peer defaults (one stage per device)."""
    from rich.table import Table

    it = plan.predicted.iteration_ms if plan.predicted is not None else 0.0

    def ratio(ms: float | None) -> str:
        return f"{ms / it:.2f}x" if ms and it else "-"

    tuned = [b for b in plan.baselines if b.tuned]
    # Plans written before tuned peers existed have rows without a kind: peer defaults.
    defaults = [b for b in plan.baselines if not b.tuned]
    without = plan.solver.without_peers if plan.solver is not None else None
    alone = without.iteration_ms if without is not None else None
    if tuned:
        table = Table(title="Peers at their best (same profile, topology, batch and simulator)")
        for col, justify in (("peer", "left"), ("best configuration", "left")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        table.add_column("iteration ms", justify="right")
        table.add_column("vs pipeplan", justify="right")
        table.add_row("pipeplan", "", f"{it:.3f}", "1.00x")
        if alone is not None:
            table.add_row("pipeplan, search alone", "(no peer seeds)", f"{alone:.3f}", ratio(alone))
        for row in tuned:
            ms = row.iteration_ms
            shown = f"{ms:.3f}" if ms is not None else "-"
            what = row.configuration or f"none: {row.reason or ''}"
            table.add_row(row.name, what, shown, ratio(ms))
        console.print(table)
    if defaults:
        base = Table(title="Peer defaults (one stage per device, device order)")
        base.add_column("plan")
        base.add_column("iteration ms", justify="right")
        base.add_column("vs pipeplan", justify="right")
        base.add_column("fits")
        for row in defaults:
            ms = row.iteration_ms
            shown = f"{ms:.3f}" if ms is not None else "-"
            fits = "yes" if row.feasible else "no"
            if row.reason:
                fits = f"no: {row.reason}"
            base.add_row(row.name, shown, ratio(ms), fits)
        console.print(base)


def register(app: typer.Typer) -> None:
    """Add ``pipeplan solve`` to the CLI.

    Example::

        register(app)
    """
    app.command(
        "solve",
        help=(
            "Find the fastest pipeline plan that fits in memory; write plan.json.\n\n"
            "Example: pipeplan solve --profile profiles/mlp.json "
            "--topology topologies/nvlink.yaml --global-batch 64"
        ),
    )(solve_command)
