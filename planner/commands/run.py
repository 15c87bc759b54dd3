"""``pipeplan run``: train with a plan's exact partition, placement and action order.

Example::

    $ pipeplan run plan.json --model examples/mlp.py --steps 5 --device cpu
    $ pipeplan run plan.json --model model.py --device cuda --trace measured.json --json
    $ torchrun --nnodes 2 --nproc-per-node 8 ... -m planner.cli run plan.json --model model.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from planner.errors import InputError, naming_file
from planner.fileio import check_input_file
from planner.outputs import Outputs
from planner.plan import Plan
from planner.profile.schema import load_profile

if TYPE_CHECKING:
    from planner.runtime.report import RunReport

__all__ = ["register", "run_command"]


# The command's parameters are typer options, one declaration per flag; those of the
# commands look alike in shape (duplicates pairs them), not in names, defaults or help.
def register(app: typer.Typer) -> None:
    """Add the ``run`` command to ``app``."""
    app.command("run")(run_command)


def run_command(
    plan_path: Path = typer.Argument(..., help="The plan.json to execute.", show_default=False),
    model: Path = typer.Option(
        ..., "--model", "-m", help="The model.py the plan was made for.", show_default=False
    ),
    steps: int = typer.Option(5, "--steps", help="Measured training steps (after warm-up)."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed training steps first."),
    device: str = typer.Option(
        "cpu", "--device", help="cpu (gloo, one process per plan device) or cuda (NCCL)."
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        help="Write the measured last step as Chrome/Perfetto JSON.",
        show_default=False,
    ),
    calibrate: Path | None = typer.Option(
        None,
        "--calibrate",
        help="Write a profile corrected with the measured stage times.",
        show_default=False,
    ),
    timeout: float = typer.Option(
        300.0,
        "--timeout",
        help="Seconds a rank may wait (or make no progress) before the "
        "run is stopped on every rank.",
    ),
    device_map: str | None = typer.Option(
        None,
        "--device-map",
        help="Plan device to rank, e.g. 'gpu0=0,gpu1=0,gpu2=1' "
        "(several devices on one rank share its GPU).",
        show_default=False,
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        help="CPU threads per process (default: the profile's).",
        show_default=False,
    ),
    lr: float | None = typer.Option(
        None,
        "--lr",
        help="Learning rate (default: 1e-3 for adam, 0.01 for sgd/momentum).",
        show_default=False,
    ),
    precision: str | None = typer.Option(
        None,
        "--precision",
        help="A check: must be the precision the plan's profile was measured at.",
        show_default=False,
    ),
    save_params: Path | None = typer.Option(
        None,
        "--save-params",
        help="Write the trained parameters (torch.save of a dict: name in the original "
        "model -> tensor), as model.load_state_dict(..., strict=False) takes them.",
        show_default=False,
    ),
    count_collectives: bool = typer.Option(
        False,
        "--count-collectives",
        help="Count the collectives each tensor-parallel stage issues per microbatch (last "
        "step) and put them beside the profile's (a check: slows the steps).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Run a plan: one process per device, its action lists exactly, measured.

    Prints measured against predicted iteration time (and their ratio), samples/s, the loss.

    A plan whose profile or model source does not match --model is refused with the reason.

    Details (devices and ranks, shared GPUs, torchrun, failures) in docs/run.md.

    Example: pipeplan run plan.json --model examples/mlp.py --steps 5 --trace measured.json
    """
    # lazy: `pipeplan --help` need not load the runtime
    from planner.runtime.launch import in_torchrun
    from planner.runtime.runner import check_run_options

    check_run_options(
        steps=steps, warmup=warmup, timeout_s=timeout, threads=threads, lr=lr, cli=True
    )
    outs = _declare_outputs(plan_path, model, trace, calibrate, save_params)
    if in_torchrun():
        from planner.runtime.runner import run_this_rank

        with naming_file(str(plan_path)):  # a stage the model cannot run: the plan's field
            report = run_this_rank(
                plan_path, model, steps=steps, warmup=warmup, device=device, timeout_s=timeout,
                threads=threads, lr=lr, precision=precision,
                return_params=save_params is not None, count_collectives=count_collectives,
            )  # fmt: skip
        if report is None:  # not rank 0: rank 0 prints
            return
    else:
        from planner.runtime.runner import run_plan

        with naming_file(str(plan_path)):  # a stage the model cannot run: the plan's field
            report = run_plan(
                plan_path, model, steps=steps, warmup=warmup, device=device, timeout_s=timeout,
                threads=threads, lr=lr, device_map=device_map, precision=precision,
                return_params=save_params is not None, count_collectives=count_collectives,
            )  # fmt: skip
    # A failed rank (RunFailed) is exit 1 and Ctrl-C exit 130, in planner.cli.main.
    outputs = _write_outputs(outs, report, plan_path, trace, calibrate, save_params)
    if as_json:
        print(json.dumps(dict(report.to_dict(), outputs=outputs), indent=2))
        return
    from planner import terminal
    from planner.runtime.report import print_run_report

    console = terminal.console(highlight=True)
    print_run_report(report, console)
    for what, where in outputs.items():
        console.print(f"wrote {what.replace('_', ' ')}: {where}")


def _declare_outputs(
    plan_path: Path, model: Path, trace: Path | None, calibrate: Path | None, params: Path | None
) -> Outputs:
    """The outputs asked for, checked before any process starts: writable, not a folder, not
    the plan, the model or the plan's profile or topology, not each other; --calibrate
    only with the plan's profile found."""
    from planner.plan_inputs import find_file, plan_files  # lazy: `pipeplan --help`

    wanted = {"--trace": trace, "--calibrate": calibrate, "--save-params": params}
    if all(path is None for path in wanted.values()):
        return Outputs()
    check_input_file(plan_path)
    outs = Outputs([("the plan", plan_path), ("--model", model)])
    for flag, path in wanted.items():
        outs.file(path, flag)
    plan = Plan.load(plan_path)
    outs.add_inputs(plan_files(plan, plan_path))
    if calibrate is not None and find_file(plan.profile, plan_path) is None:
        raise InputError(
            "the plan's profile was not found, so there is nothing to calibrate",
            file=str(plan_path),
            field="--calibrate",
        )
    grouped = [st.id for st in plan.stages if st.tensor_parallel > 1]
    if calibrate is not None and grouped:
        raise InputError(
            f"stage {grouped[0]} is tensor parallel: its measured times hold the group's "
            "collectives, which the simulator adds from the topology, so scaling the "
            "profile's shard times by them would count the collectives twice; calibrate "
            "with a plan without tensor parallelism",
            file=str(plan_path),
            field="--calibrate",
        )
    return outs


def _write_outputs(
    outs: Outputs,
    report: RunReport,
    plan_path: Path,
    trace: Path | None,
    calibrate: Path | None,
    params: Path | None,
) -> dict[str, str]:
    """Write what --trace, --calibrate and --save-params ask for, all or none; returns
    what was written."""
    outputs: dict[str, str] = {}
    if trace is not None:
        # lazy: `pipeplan --help` need not load the runtime or the renderer
        from planner.runtime.report import trace_with_prediction

        outs.write_json(trace, trace_with_prediction(report, Plan.load(plan_path), plan_path))
        outputs["trace"] = str(trace)
    if calibrate is not None:
        outs.write_json(calibrate, _calibrated(plan_path, report))
        outputs["calibrated_profile"] = str(calibrate)
    if params is not None:
        outs.write_bytes(params, _params_bytes(report.parameters or {}))
        outputs["parameters"] = str(params)
    outs.commit()
    return outputs


def _params_bytes(parameters: dict[str, Any]) -> bytes:
    """``torch.save`` of the trained parameters, as bytes."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(parameters, buffer)
    return buffer.getvalue()


def _calibrated(plan_path: Path, report: RunReport) -> dict[str, Any]:
    """The plan's profile corrected with the measured stage times, as JSON data."""
    from planner.runtime.calibrate import calibrated_profile  # lazy: not needed by --help

    if report.profile_path is None:
        raise InputError(
            "the plan's profile was not found, so there is nothing to calibrate",
            field="--calibrate",
        )
    plan = Plan.load(plan_path)
    return calibrated_profile(load_profile(report.profile_path), plan, report.stage_ms).to_dict()
