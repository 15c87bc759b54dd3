"""``pipeplan profile``: measure every layer of a model.py and write its profile.

Example::

    $ pipeplan profile examples/gpt.py -b 1,2,4
    $ pipeplan profile model.py --split-at 'transformer.h.*' -o profiles/mine.json --json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from planner.errors import InputError
from planner.fileio import check_output_path
from planner.precision import check_precision
from planner.profile.colocation import MAX_COLOCATE, check_colocate
from planner.profile.loader import load_model_file, model_name
from planner.profile.measure import (
    check_device,
    check_timing,
    optimizer_state_bytes,
    parse_microbatch_sizes,
    profile_model,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from planner.profile.schema import Profile

__all__ = ["default_output", "pass_check_lines", "profile_table", "register", "run_profile"]


def default_output(model_path: str | Path) -> Path:
    """``profiles/<model>.json`` in the current folder.

    Example::

        default_output("examples/gpt.py")   # Path('profiles/gpt.json')
    """
    return Path("profiles") / f"{model_name(model_path)}.json"


def profile_table(profile: Profile, microbatch_size: int | None = None) -> Table:
    """A rich table of one microbatch size (default: the largest) of ``profile``.

    Example::

        Console().print(profile_table(load_profile("profiles/gpt.json")))
    """
    from rich.table import Table

    size = microbatch_size if microbatch_size is not None else profile.microbatch_sizes[-1]
    m = profile.measurement(size)
    table = Table(
        title=f"{profile.model} on {profile.device}, {profile.precision}, microbatch size {size} "
        "(times in ms)"
        + (f", captured with {profile.meta['capture']}" if profile.meta.get("capture") else ""),
        caption="bwd: whole backward; in, wt: its two halves; opt: optimizer step; "
        "act: saved for bwd",
    )
    for header in ("#", "layer", "fwd", "bwd", "in", "wt", "opt", "params", "act", "out"):
        table.add_column(header, justify="left" if header == "layer" else "right")
    for i, (layer, t) in enumerate(zip(profile.layers, m.layers, strict=True)):
        table.add_row(
            str(i),
            layer.name,
            f"{t.forward_ms:.2f}",
            f"{t.backward_ms:.2f}",
            f"{t.backward_input_ms:.2f}",
            f"{t.backward_weight_ms:.2f}",
            f"{layer.optimizer_ms:.2f}",
            _size(layer.param_bytes),
            _size(t.saved_bytes),
            _size(t.output_bytes),
        )
    table.add_section()
    table.add_row(
        "",
        "total",
        f"{sum(t.forward_ms for t in m.layers):.2f}",
        f"{sum(t.backward_ms for t in m.layers):.2f}",
        f"{sum(t.backward_input_ms for t in m.layers):.2f}",
        f"{sum(t.backward_weight_ms for t in m.layers):.2f}",
        f"{sum(layer.optimizer_ms for layer in profile.layers):.2f}",
        _size(sum(layer.param_bytes for layer in profile.layers)),
        _size(sum(t.saved_bytes for t in m.layers)),
        "",
    )
    return table


def run_profile(
    model: Path,
    sizes: str,
    *,
    output: Path | None,
    device: str = "cpu",
    repeat: int = 5,
    warmup: int = 2,
    threads: int = 1,
    optimizer: str = "adam",
    split_at: str | None = None,
    capture: str = "auto",
    precision: str = "fp32",
    timing: str | None = None,
    console: Console | None = None,
    show_progress: bool = True,
    colocate: int = 1,
) -> tuple[Profile, Path]:
    """Validate the arguments, profile with a progress bar, write the profile atomically.

    Every check that needs no measuring happens first, so bad input writes nothing.

    Example::

        profile, path = run_profile(Path("examples/mlp.py"), "1,8", output=None)
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.profile.split import CAPTURES  # lazy: pulls torch

    err = console or Console(stderr=True)
    microbatch_sizes = parse_microbatch_sizes(sizes)
    check_precision(precision)
    if capture not in CAPTURES:
        raise InputError(
            f"expected one of {', '.join(CAPTURES)}, got {capture!r}", field="--capture"
        )
    optimizer_state_bytes(0, optimizer)
    checked_device = check_device(device)
    check_timing(timing, checked_device.split(":")[0])
    check_colocate(colocate, checked_device.split(":")[0])
    if output is not None:
        check_output_path(output, field="-o")
    load_model_file(model)  # path, import and the contract's functions, before the bar starts
    if output is None:  # the default folder is created, but only for a loadable model
        output = default_output(model)
        output.parent.mkdir(parents=True, exist_ok=True)
        check_output_path(output)

    with Progress(
        TextColumn("[bold]profiling[/] {task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not show_progress or not err.is_terminal,  # no stray lines in logs
    ) as bar:
        task = bar.add_task("loading", total=None)

        def progress(done: int, total: int, description: str) -> None:
            bar.update(task, completed=done, total=total, description=description)

        profile = profile_model(
            model,
            microbatch_sizes,
            repeat=repeat,
            warmup=warmup,
            device=device,
            threads=threads,
            optimizer=optimizer,
            split_at=split_at,
            capture=capture,
            precision=precision,
            timing=timing,
            progress=progress,
            colocate=colocate,
        )
    profile.save(output)
    return profile, output


def pass_check_lines(profile: Profile, tolerance: float = 0.02) -> list[str]:
    """One line per microbatch size whose layers do not add up to the whole pass within
    ``tolerance`` (pass timing only; an empty list when they all do).

    Example::

        for line in pass_check_lines(profile): print(line)
    """
    lines = []
    for m in profile.measurements:
        ratios = m.pass_ratios()
        if ratios is None:
            continue
        forward, backward = ratios
        if abs(forward - 1) > tolerance or abs(backward - 1) > tolerance:
            lines.append(
                f"microbatch size {m.microbatch_size}: the layers add up to {forward:.3f}x the "
                f"whole forward ({m.pass_forward_ms:.3f} ms) and {backward:.3f}x the whole "
                f"backward ({m.pass_backward_ms:.3f} ms), more than {tolerance:.0%} off"
            )
    return lines


def register(app: typer.Typer) -> None:
    """Add the ``profile`` command to ``app``."""
    app.command("profile")(profile)


def profile(
    model: Path = typer.Argument(..., help="The model.py to profile.", show_default=False),
    sizes: str = typer.Option(
        "1,2,4", "-b", "--microbatch-sizes", help="Microbatch sizes to measure, comma-separated."
    ),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (cuda:N for a given GPU)."),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="Profile JSON to write (default: profiles/MODEL.json; the folder must exist).",
        show_default=False,
    ),
    split_at: str | None = typer.Option(
        None,
        "--split-at",
        help=(
            "Module-name globs that start a layer, comma-separated (e.g. 'blocks.*'). Default: "
            "an nn.Sequential's children, a Hugging Face model's own pipeline plan, else the "
            "blocks of the largest ModuleList (and of a second stack of similar size)."
        ),
        show_default=False,
    ),
    capture: str = typer.Option(
        "auto",
        "--capture",
        help="How to capture forward(): fx, export (torch.export), or auto (fx, else export).",
    ),
    precision: str = typer.Option(
        "fp32",
        "--precision",
        help="fp32, or bf16 / fp16 mixed precision (torch.autocast; fp32 master weights).",
    ),
    timing: str | None = typer.Option(
        None,
        "--timing",
        help="pass: layers timed inside whole passes (default on CUDA); layer: each layer "
        "timed on its own (default on CPU).",
        show_default=False,
    ),
    repeat: int = typer.Option(5, "--repeat", help="Timed runs per layer; times are medians."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed runs per layer before timing."),
    threads: int = typer.Option(1, "--threads", help="CPU threads (torch.set_num_threads)."),
    colocate: int = typer.Option(
        1,
        "--colocate",
        help="CPU: time the layers while N-1 companion processes run the model beside this "
        "one, as a plan's N processes on this host will (use the plan's processes per host, "
        f"e.g. 2 for topologies/cpu.yaml; 1 to {MAX_COLOCATE}).",
    ),
    optimizer: str = typer.Option(
        "adam", "--optimizer", help="Optimizer state to count: adam, adamw (2x), momentum, sgd."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the profile (and where it was written) as JSON on stdout."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table."),
) -> None:
    """Measure each layer's forward and backward times and memory; write a profile JSON.

    Layers: an nn.Sequential's children; any other model is captured with torch.fx or, where
    fx fails (Hugging Face models), torch.export, and cut at module boundaries: --split-at,
    the model's own pipeline plan, or between the blocks of its largest ModuleList.

    Times are medians of --repeat runs; details and the file format in docs/profile.md.

    Example: pipeplan profile examples/gpt.py -b 1,2,4 -o profiles/gpt.json
    """
    from rich.console import Console

    started = time.perf_counter()
    err = Console(stderr=True)
    result, path = run_profile(
        model,
        sizes,
        output=output,
        device=device,
        repeat=repeat,
        warmup=warmup,
        threads=threads,
        optimizer=optimizer,
        split_at=split_at,
        capture=capture,
        precision=precision,
        timing=timing,
        console=err,
        show_progress=not quiet and not as_json,
        colocate=colocate,
    )
    seconds = time.perf_counter() - started
    if as_json:
        summary: dict[str, Any] = {"output": str(path), "seconds": round(seconds, 2)}
        summary["profile"] = result.to_dict()
        json.dump(summary, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if not quiet:
        Console().print(profile_table(result))
    for line in pass_check_lines(result):
        err.print(f"warning: {line}")
    err.print(f"wrote {path} ({result.num_layers} layers, {seconds:.1f} s)")


def _size(n: int) -> str:
    # Compact binary units: tables must fit an 80-column terminal.
    value = float(n)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit == "B" or value >= 100 else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"  # pragma: no cover
