"""``pipeplan profile``: measure every layer of a model.py and write its profile.

Example::

    $ pipeplan profile examples/gpt.py -b 1,2,4
    $ pipeplan profile model.py --split-at 'transformer.h.*' -o profiles/mine.json --json
    $ pipeplan profile examples/gpt.py -b 1,2 --tensor-parallel 2,4,8 --sequence-parallel
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from planner.errors import InputError
from planner.outputs import Outputs
from planner.precision import check_precision
from planner.profile.analytic import analytic_profile, check_analytic_settings
from planner.profile.batch_dependence import batch_dependence_warning
from planner.profile.colocation import MAX_COLOCATE, check_colocate
from planner.profile.isolated import call_isolated
from planner.profile.loader import check_model_path, model_name
from planner.profile.measure import (
    MIN_TIME_S,
    check_device,
    check_min_time,
    check_timing,
    optimizer_state_bytes,
    parse_microbatch_sizes,
)
from planner.profile.shard_measure import profile_with_shards
from planner.profile.tensor_parallel import TensorParallelRequest, parse_tensor_parallel

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from planner.profile.schema import Measurement, Profile

__all__ = [
    "default_output",
    "pass_check_lines",
    "profile_table",
    "register",
    "run_analytic",
    "run_profile",
]


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
    info = profile.settings.analytic
    where = f"analytic for {info.gpu.name}" if info else f"on {profile.device}"
    caption = "bwd: whole backward; in, wt: its two halves; opt: optimizer step; act: saved for bwd"
    if info:
        flops = sum((t.forward_flops or 0) for t in m.layers)
        eff = ", ".join(f"{k} {v:g}" for k, v in info.efficiency.to_dict().items())
        caption += (
            f"; times are a roofline, not measured (efficiency {eff}); "
            f"forward {flops / 1e12:.4g} TFLOP per microbatch"
        )
    table = Table(
        title=f"{profile.model} {where}, {profile.precision}, microbatch size {size} "
        + ("(times in ms, means of the timed runs)" if _has_means(m) else "(times in ms)")
        + (f", captured with {profile.settings.capture}" if profile.settings.capture else ""),
        caption=caption,
    )
    for header in ("#", "layer", "fwd", "bwd", "in", "wt", "opt", "params", "act", "out"):
        table.add_column(header, justify="left" if header == "layer" else "right")
    # A roofline of a small model on a big GPU gives microseconds: keep three digits.
    ms = _short_ms if info else _fixed_ms
    for i, (layer, t) in enumerate(zip(profile.layers, m.layers, strict=True)):
        table.add_row(
            str(i),
            layer.name,
            ms(t.forward_ms),
            ms(t.backward_ms),
            ms(t.backward_input_ms),
            ms(t.backward_weight_ms),
            ms(layer.optimizer_ms),
            _size(layer.param_bytes),
            _size(t.saved_bytes),
            _size(t.output_bytes),
        )
    table.add_section()
    table.add_row(
        "",
        "total",
        ms(sum(t.forward_ms for t in m.layers)),
        ms(sum(t.backward_ms for t in m.layers)),
        ms(sum(t.backward_input_ms for t in m.layers)),
        ms(sum(t.backward_weight_ms for t in m.layers)),
        ms(sum(layer.optimizer_ms for layer in profile.layers)),
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
    tensor_parallel: TensorParallelRequest | None = None,
    console: Console | None = None,
    show_progress: bool = True,
    colocate: int = 1,
    min_time_s: float = MIN_TIME_S,
) -> tuple[Profile, Path]:
    """Validate the arguments, profile with a progress bar, write the profile atomically.

    Every check that needs no measuring happens first, so bad input writes nothing (the
    tensor-parallel plan is checked in the child, before anything is measured).

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
    check_min_time(min_time_s)
    outs = Outputs([("the model file", model)])
    outs.file(output, "-o")
    check_model_path(model)  # its code runs only in the child below
    if output is None:  # the default folder is created with the profile
        output = outs.file(default_output(model), None, make_folder=True)

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

        # The user's code runs in a child process: its exits, crashes and Ctrl-C never end
        # this one (planner.profile.isolated).
        profile = call_isolated(
            profile_with_shards,
            model,
            microbatch_sizes,
            model=model,
            doing="profiling",
            tensor_parallel=tensor_parallel,
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
            min_time_s=min_time_s,
        )
    outs.write_json(output, profile.to_dict())
    outs.commit()
    return profile, output


def run_analytic(
    model: Path,
    sizes: str,
    *,
    output: Path | None,
    gpu: str | None,
    efficiency: str | None = None,
    optimizer: str = "adam",
    split_at: str | None = None,
    capture: str = "auto",
    precision: str = "fp32",
    threads: int = 1,
    measuring: dict[str, Any] | None = None,
    tensor_parallel: TensorParallelRequest | None = None,
    console: Console | None = None,
    show_progress: bool = True,
) -> tuple[Profile, Path]:
    """``pipeplan profile --analytic``: check everything, count the model built on the meta
    device (planner/profile/analytic.py), write the profile atomically.

    ``measuring`` holds the measuring flags given on the command line (``--device``,
    ``--repeat``, ...) with their values; any of them is refused, even at its default
    value: an analytic profile measures nothing.

    Example::

        profile, path = run_analytic(Path("examples/gpt.py"), "1,2", output=None,
                                     gpu="h100-sxm")
    """
    from rich.console import Console

    err = console or Console(stderr=True)
    if measuring:  # given at all: an analytic profile has nothing to apply it to
        flag = next(iter(measuring))
        raise InputError(
            f"an analytic profile runs the model on no device and times nothing; drop "
            f"{flag} (the GPU is named with --gpu)",
            field=flag,
        )
    if gpu is None:
        from planner.gpus import catalog_names

        raise InputError(
            f"name the GPU to plan for: one of {', '.join(catalog_names())}, or a YAML file "
            "with an entry of your own",
            field="--gpu",
        )
    microbatch_sizes = parse_microbatch_sizes(sizes)
    settings = check_analytic_settings(gpu, efficiency, precision, optimizer, capture, threads)
    gpu_file = gpu if gpu.endswith((".yaml", ".yml")) else None
    outs = Outputs([("the model file", model), ("--gpu", gpu_file)])
    outs.file(output, "-o")
    check_model_path(model)  # its code runs only in the child below
    if output is None:  # beside, never over, a measured profile of the model
        measured = default_output(model)
        output = outs.file(
            measured.with_name(f"{measured.stem}-{settings.gpu.name}.json"), None, make_folder=True
        )
    with (
        err.status(f"counting {model} for {settings.gpu.name}", spinner="dots")
        if show_progress and err.is_terminal
        else contextlib.nullcontext()
    ):
        # The user's code runs in a child process, as measured profiling's does.
        profile = call_isolated(
            analytic_profile,
            model,
            microbatch_sizes,
            model=model,
            doing="counting it",
            gpu=settings.gpu,
            efficiency=settings.efficiency,
            precision=precision,
            optimizer=optimizer,
            split_at=split_at,
            capture=capture,
            threads=threads,
            tensor_parallel=tensor_parallel,
        )
    outs.write_json(output, profile.to_dict())
    outs.commit()
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
    ctx: typer.Context,
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
    repeat: int = typer.Option(
        5, "--repeat", help="Timed runs per layer at least; times are medians."
    ),
    min_time: float = typer.Option(
        MIN_TIME_S,
        "--min-time",
        help="Seconds the timed runs go on for at least (more rounds than --repeat until "
        "then; the optimizer's steps as long again): a machine's speed drifts over seconds. "
        "0: exactly --repeat.",
    ),
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
    analytic: bool = typer.Option(
        False,
        "--analytic",
        help="Count instead of measuring: the model built on the meta device (no weights), "
        "FLOPs and bytes of every operation, times from the roofline of --gpu.",
    ),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help="With --analytic: the GPU to plan for (h100-sxm, a100-80gb-sxm, h200, b200, "
        "mi300x, l40s, ... or cpu: this machine, measured), or a YAML file with your own entry.",
        show_default=False,
    ),
    efficiency: str | None = typer.Option(
        None,
        "--efficiency",
        help="With --analytic: fractions of the GPU's peaks reached, e.g. "
        "'matmul=0.6,attention=0.5,memory=0.8' (default: the catalog's).",
        show_default=False,
    ),
    tensor_parallel: str | None = typer.Option(
        None,
        "--tensor-parallel",
        help="Also profile each layer's shard on a tensor-parallel group of these sizes, "
        "comma-separated (e.g. 2,4,8), split as model.py's tp_plan() or the Hugging Face "
        "model's own plan says; measured in one process on torch's fake process group "
        "(or counted, with --analytic).",
        show_default=False,
    ),
    sequence_parallel: bool = typer.Option(
        False,
        "--sequence-parallel",
        help="With --tensor-parallel: also each shard with sequence parallelism "
        "(tp_plan(sequence_parallel=True)).",
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
    --analytic --gpu NAME counts the model built without weights against a GPU's datasheet
    instead (docs/profile.md#analytic-profiles). --tensor-parallel 2,4,8 adds each layer's
    shard per degree (docs/profile.md#tensor-parallel-shards).

    Example: pipeplan profile examples/gpt.py -b 1,2,4 -o profiles/gpt.json
    """
    from rich.console import Console

    started = time.perf_counter()
    err = Console(stderr=True)
    request = parse_tensor_parallel(tensor_parallel, sequence_parallel=sequence_parallel)
    if analytic:
        result, path = run_analytic(
            model,
            sizes,
            output=output,
            gpu=gpu,
            efficiency=efficiency,
            optimizer=optimizer,
            split_at=split_at,
            capture=capture,
            precision=precision,
            threads=threads,
            measuring=_given(
                ctx,
                {
                    "--device": ("device", device),
                    "--repeat": ("repeat", repeat),
                    "--min-time": ("min_time", min_time),
                    "--warmup": ("warmup", warmup),
                    "--timing": ("timing", timing),
                    "--colocate": ("colocate", colocate),
                },
            ),
            tensor_parallel=request,
            console=err,
            show_progress=not quiet and not as_json,
        )
        _report(result, path, time.perf_counter() - started, as_json=as_json, quiet=quiet)
        return
    for flag, value in (("--gpu", gpu), ("--efficiency", efficiency)):
        if value is not None:
            raise InputError("applies to analytic profiles only; add --analytic", field=flag)
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
        tensor_parallel=request,
        console=err,
        show_progress=not quiet and not as_json,
        colocate=colocate,
        min_time_s=min_time,
    )
    _report(result, path, time.perf_counter() - started, as_json=as_json, quiet=quiet)


def _report(result: Profile, path: Path, seconds: float, *, as_json: bool, quiet: bool) -> None:
    from rich.console import Console

    if as_json:
        summary: dict[str, Any] = {"output": str(path), "seconds": round(seconds, 2)}
        summary["profile"] = result.to_dict()
        json.dump(summary, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if not quiet:
        Console().print(profile_table(result))
    err = Console(stderr=True)
    for line in pass_check_lines(result):
        err.print(f"warning: {line}")
    batch_dependence = batch_dependence_warning(list(result.settings.batch_dependent))
    if batch_dependence is not None:
        err.print(f"warning: {batch_dependence}")
    shards = ""
    if result.tensor_parallel is not None:
        shards = (
            f"; tensor-parallel shards {', '.join(result.tensor_parallel.keys())} "
            f"from {result.tensor_parallel.plan_source}"
        )
    err.print(f"wrote {path} ({result.num_layers} layers{shards}, {seconds:.1f} s)")


def _fixed_ms(value: float) -> str:
    return f"{value:.2f}"


def _short_ms(value: float) -> str:
    return f"{value:.2f}" if value >= 10 or value == 0 else f"{value:.3g}"


def _size(n: int) -> str:
    # Compact binary units: tables must fit an 80-column terminal.
    value = float(n)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit == "B" or value >= 100 else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"  # pragma: no cover


def _has_means(m: Measurement) -> bool:
    """Whether the measurement's times are means beside medians (planner.profile.means)."""
    return any(t.median for t in m.layers)


def _given(ctx: typer.Context, flags: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    """Of ``flags`` (flag: (parameter name, value)), those the command line gave, with
    their values, whatever the value (``--repeat 5`` is given, though 5 is the default).

    Example::

        _given(ctx, {"--repeat": ("repeat", 5)})   # {} for `pipeplan profile m.py --analytic`
    """
    return {
        flag: value
        for flag, (name, value) in flags.items()
        if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"
    }
