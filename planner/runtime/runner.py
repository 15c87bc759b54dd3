"""``run_plan``: check a plan against its model, launch the processes, build the report.

Before any process starts, the plan is refused (InputError, exit 2) when

* its schedule is not a valid, deadlock-free execution of its stages;
* the profile it was made from (``plan.profile.path``, found relative to the current
  folder or to the plan file) changed since (sha256), or was measured on another
  ``model.py`` (the profile's ``source_sha256`` against the given file's bytes);
* ``PIPEPLAN_FAULT`` or torchrun's variables are malformed
  (:mod:`planner.runtime.environment`).

This process never runs the user's code (its exits, crashes and hangs could not be told
from pipeplan's own): every rank loads the model and, before it trains, refuses with exit 2
a model that splits into other layers than the profile has, as many as the plan covers
(:mod:`planner.runtime.worker`). A profile that cannot be found is not an error (plans
travel between machines): the source check is skipped and the report says so.

Example::

    report = run_plan("plan.json", "examples/mlp.py", steps=5, device="cpu")
    report.iteration_ms, report.ratio
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from planner.errors import InputError
from planner.fileio import sha256_file
from planner.limits import MAX_RUN_STEPS, MAX_THREADS, check_int
from planner.optimizers import check_optimizer
from planner.plan import Plan
from planner.plan_inputs import check_unchanged, find_file
from planner.precision import check_fp16_schedule, check_precision
from planner.profile.colocation import busy_cores, colocation_note, load_note, profile_colocation
from planner.profile.loader import check_model_path
from planner.profile.model_check import ProfiledSplit, check_source
from planner.profile.schema import load_profile
from planner.runtime.collective_report import collective_summary
from planner.runtime.environment import FAULT_ENV, parse_fault, torchrun_env, wait_for_rendezvous
from planner.runtime.launch import launch_local
from planner.runtime.mesh import check_parallel_run
from planner.runtime.placement import Placement, place
from planner.runtime.report import RunReport, build_report, explain_gap
from planner.runtime.settings import RunSettings, Training, WorkerConfig
from planner.runtime.worker import stream_2bw, worker_main
from planner.schedule import as_stream, validate_schedule
from planner.simulate import simulate
from planner.simulate.one_device import one_device_prediction

if TYPE_CHECKING:
    from planner.profile.schema import Profile
    from planner.schedule.actions import Schedule

__all__ = [
    "check_plan",
    "check_stream",
    "check_run_options",
    "colocation_notes",
    "prepare_run",
    "run_plan",
    "run_precision",
    "run_this_rank",
]


def check_run_options(
    *,
    steps: int,
    warmup: int,
    timeout_s: float,
    threads: int | None,
    lr: float | None,
    cli: bool = False,
) -> None:
    """Refuse run settings that could only fail after the processes start.

    ``cli`` names the fields by their command-line flags (``--timeout``) instead of the
    Python parameters (``timeout_s``).

    Example::

        check_run_options(steps=5, warmup=1, timeout_s=300.0, threads=None, lr=1e-3)
    """
    import math

    def name(param: str, flag: str) -> str:
        return flag if cli else param

    check_int(steps, field=name("steps", "--steps"), high=MAX_RUN_STEPS)
    check_int(warmup, field=name("warmup", "--warmup"), low=0, high=MAX_RUN_STEPS)
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise InputError(
            f"expected a finite number of seconds > 0, got {timeout_s!r}",
            field=name("timeout_s", "--timeout"),
        )
    if threads is not None:
        check_int(threads, field=name("threads", "--threads"), high=MAX_THREADS)
    if lr is not None and (
        isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) or lr <= 0
    ):
        raise InputError(f"expected a finite number > 0, got {lr!r}", field=name("lr", "--lr"))


def check_plan(
    plan: Plan, model_path: str | os.PathLike[str], plan_source: str | None
) -> RunSettings:
    """Refuse a plan that does not fit ``model_path`` (its bytes: the model's code runs only
    in the ranks); returns the run's settings (the profile's optimizer, graph capture,
    precision, threads and layer names when the profile is found, and the notes for the
    report). ``plan`` is valid (``Plan.load`` or ``Plan.validate``).

    Example::

        settings = check_plan(Plan.load("plan.json"), "model.py", "plan.json")
    """
    where = plan_source or "<plan>"
    schedule = plan.schedule
    if schedule.iterations != 1:
        raise InputError(
            f"the schedule lists {schedule.iterations} iterations; run executes one "
            "iteration's lists per step (re-create the plan with one iteration)",
            file=where,
            field="schedule.iterations",
        )
    source_sha256 = sha256_file(check_model_path(model_path))
    settings = RunSettings(num_layers=max(s.last for s in plan.stages) + 1)
    found = find_file(plan.profile, plan_source)
    if found is None:
        settings.notes.append(f"profile {plan.profile.path!r} not found: model source not checked")
    else:
        check_unchanged(found, plan.profile, "profile", where)
        profile = load_profile(found)
        check_source(str(model_path), source_sha256, profile)
        settings.profile, settings.profile_path = profile, str(found)
        settings.training = Training(
            optimizer=profile.optimizer,
            precision=profile.precision,
            threads=profile.settings.threads,
            split=ProfiledSplit.of(profile),
        )
    return settings


def run_precision(
    settings: RunSettings,
    asked: str | None,
    plan_source: str | None = None,
    *,
    schedule: Schedule | None = None,
) -> str:
    """The precision a run trains at: the profile's; ``asked`` (``--precision``) must agree
    with it, and names it when the plan's profile is not at hand. fp16 trains with loss
    scaling agreed by every stage (:mod:`planner.runtime.loss_scale`), which needs a
    flush: fp16 with 2bw's stale weights (``schedule``: the plan's) is refused.

    Example::

        run_precision(RunSettings(6, Training(precision="bf16")), None)    # 'bf16'
    """
    profiled = settings.training.precision if settings.profile_path is not None else None
    if asked is not None:
        check_precision(asked)
        if profiled is not None and asked != profiled:
            raise InputError(
                f"the plan's profile {settings.profile_path} was measured at "
                f"{profiled}, not {asked}; profile again with --precision {asked} and solve",
                file=plan_source,
                field="--precision",
            )
    chosen = str(asked or settings.training.precision)
    if schedule is not None:
        check_fp16_schedule(chosen, schedule.name, schedule.flush, file=plan_source)
    return chosen


def prepare_run(
    plan: Plan | str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    *,
    device: str = "cpu",
    device_map: str | None = None,
    world_size: int | None = None,
    plan_source: str | None = None,
) -> tuple[Plan, RunSettings, Placement]:
    """Load and check the plan and place its devices: ``(plan, settings, placement)``.

    Example::

        plan, settings, placement = prepare_run("plan.json", "model.py", device="cpu")
    """
    if not isinstance(plan, Plan):
        plan_source = str(plan)
        plan = Plan.load(plan)
    else:  # built in memory: checked as Plan.load checks a file
        plan.validate(source=plan_source or "<plan>")
    settings = check_plan(plan, model_path, plan_source)
    placement = place(plan.stages, device, world_size=world_size, device_map=device_map)
    if placement.shared:
        shared = [
            f"rank {r}: {', '.join(placement.devices_of(r))}"
            for r in range(placement.world_size)
            if len(placement.devices_of(r)) > 1
        ]
        settings.notes.append(
            "devices shared: several plan devices run in one process (" + "; ".join(shared) + ")"
        )
    if plan.schedule.weight_versions == 2:
        _, stream = stream_2bw(plan.schedule, plan.stages, plan.num_microbatches, 2)
        how = (
            "iterations run as one continuous stream without a flush (the next one starts "
            "while the last drains), as the steady-state prediction assumes"
            if stream
            else "the plan's own (hand-made) lists run once per step"
        )
        settings.notes.append(
            "2bw: two weight versions, one-step-stale gradients "
            f"(W(t+1) = W(t) - lr * grad f(W(t-1))); {how}"
        )
    return plan, settings, placement


def worker_config(
    plan: Plan,
    settings: RunSettings,
    placement: Placement,
    model_path: str | os.PathLike[str],
    *,
    steps: int,
    warmup: int,
    timeout_s: float,
    run_dir: str,
    threads: int | None = None,
    lr: float | None = None,
    return_params: bool = False,
    plan_source: str | None = None,
    count_collectives: bool = False,
) -> WorkerConfig:
    """What every worker reads (as JSON, :meth:`WorkerConfig.to_dict`).

    Example::

        config = worker_config(plan, settings, placement, "model.py", steps=5, warmup=1,
                               timeout_s=60, run_dir="/tmp/run")
    """
    check_stream(plan, steps + warmup, plan_source)
    training = settings.training
    if threads is None:
        threads = training.threads or max(1, (os.cpu_count() or 1) // placement.world_size)
    return WorkerConfig(
        plan=plan,
        model=str(Path(model_path).resolve()),
        placement=placement,
        steps=steps,
        warmup=warmup,
        timeout_s=timeout_s,
        run_dir=run_dir,
        training=dataclasses.replace(training, threads=int(threads)),
        lr=lr,
        return_params=return_params,
        count_collectives=count_collectives,
        plan_source=plan_source,
    )


def check_stream(plan: Plan, iterations: int, plan_source: str | None = None) -> None:
    """Validate what the ranks will run, before any starts: a schedule without a flush
    (2bw) runs its generator's continuous stream of ``iterations`` iterations
    (:func:`~planner.runtime.worker.stream_2bw`), not the plan's one-iteration lists that
    loading the plan checked; those lists must be complete and deadlock free too, and each
    forward must come after the step that made its weights.

    Example::

        check_stream(plan, 6, "plan.json")   # InputError naming the first problem
    """
    if plan.schedule.flush or iterations < 2:
        return
    stream = as_stream(plan.schedule, plan.stages, iterations)
    if stream is None:
        return
    try:
        validate_schedule(stream, plan.stages, source=plan_source)
    except InputError as exc:
        raise InputError(
            f"the {plan.schedule.name} stream of {iterations} iterations that run would "
            f"execute is not runnable: {exc.message}",
            file=exc.file,
            field=exc.field,
        ) from None


def run_plan(
    plan: Plan | str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    *,
    steps: int = 5,
    warmup: int = 1,
    device: str = "cpu",
    timeout_s: float = 300.0,
    threads: int | None = None,
    lr: float | None = None,
    device_map: str | None = None,
    optimizer: str | None = None,
    precision: str | None = None,
    return_params: bool = False,
    count_collectives: bool = False,
) -> RunReport:
    """Train ``steps`` (+ ``warmup``) iterations exactly as the plan says; measured report.

    Raises InputError for a plan that does not fit the model, RunFailed when a rank fails.
    ``optimizer`` overrides the profile's (adam, adamw, sgd, momentum), ``lr`` its default
    rate; ``precision`` must be the profile's (:func:`run_precision`); ``return_params`` puts
    the trained parameters in ``report.parameters`` (a tensor-parallel or sharded one
    gathered whole); ``count_collectives`` puts the collectives each forward and backward of
    the last step issued in ``report.collectives`` (a check: it slows the steps).

    Example::

        report = run_plan("plan.json", "examples/mlp.py", steps=3, device="cpu")
        print(f"{report.iteration_ms:.1f} ms, {report.ratio:.2f}x the prediction")
    """
    check_run_options(steps=steps, warmup=warmup, timeout_s=timeout_s, threads=threads, lr=lr)
    plan_source = str(plan) if not isinstance(plan, Plan) else None
    plan, settings, placement = prepare_run(
        plan, model_path, device=device, device_map=device_map, plan_source=plan_source
    )
    settings.notes.extend(colocation_notes(settings.profile, placement))
    if optimizer is not None:  # checked here, before any process starts
        optimizer = check_optimizer(optimizer, field="optimizer")
        settings.training = dataclasses.replace(settings.training, optimizer=optimizer)
    chosen = run_precision(settings, precision, plan_source, schedule=plan.schedule)
    settings.training = dataclasses.replace(settings.training, precision=chosen)
    ties = settings.profile.tied_parameters if settings.profile is not None else []
    check_parallel_run(plan, placement, chosen, source=plan_source or "<plan>", ties=ties)
    parse_fault(os.environ.get(FAULT_ENV), placement.world_size)  # before any process starts
    run_dir = tempfile.mkdtemp(prefix="pipeplan-run-")
    try:
        config = worker_config(
            plan,
            settings,
            placement,
            model_path,
            steps=steps,
            warmup=warmup,
            timeout_s=timeout_s,
            run_dir=run_dir,
            threads=threads,
            lr=lr,
            return_params=return_params,
            plan_source=plan_source,
            count_collectives=count_collectives,
        )
        result = launch_local(
            config, placement.world_size, timeout_s=timeout_s, model_shown=str(model_path)
        )
        report = build_report(
            result,
            plan=plan,
            placement=placement,
            steps=steps,
            warmup=warmup,
            notes=settings.notes,
        )
        if return_params:
            import torch  # lazy: the launcher needs torch for nothing else

            report.parameters = torch.load(Path(run_dir) / "params.pt")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    report.profile_path = settings.profile_path
    if settings.profile is not None:
        _predict_one_gpu(report, settings.profile, plan, placement)
        explain_gap(report, settings.profile, plan)
    if count_collectives:
        report.collective_rows = collective_summary(report.collectives, plan, settings.profile)
    return report


def colocation_notes(profile: Profile | None, placement: Placement) -> list[str]:
    """On CPU: a note where the run puts another number of processes on this host than the
    profile saw (:mod:`planner.profile.colocation`), and one where the other work on the
    host (busy cores, sampled now, before any rank starts) differs from the profile's.

    Example::

        colocation_notes(load_profile("profiles/gpt.json"), placement)   # [] or notes
    """
    if profile is None or placement.device_type != "cpu" or not profile.device.startswith("cpu"):
        return []
    profiled = profile_colocation(profile)
    notes = [colocation_note(profiled, placement.world_size)]
    if profiled.busy_cores is not None:
        notes.append(load_note(profiled, busy_cores()))
    return [n for n in notes if n is not None]


def _predict_one_gpu(report: RunReport, profile: Profile, plan: Plan, placement: Placement) -> None:
    """Shared mode with every plan device on one GPU: the plan's prediction gave each plan
    device a GPU of its own; predict it as it runs here instead, the devices' work one after
    another and their memory added up (:mod:`planner.simulate.one_device`)."""
    if placement.device_type != "cuda" or placement.world_size != 1:
        return
    if len({d for st in plan.stages for d in st.devices}) < 2:
        return
    result = simulate(
        profile, None, plan.stages, plan.schedule, plan.num_microbatches, plan.microbatch_size
    )
    ms, nbytes = one_device_prediction(result)
    report.predicted_iteration_ms = ms
    report.predicted_band_ms = None  # the plan's band was of the plan's own prediction
    report.predicted_memory_bytes = dict.fromkeys(
        report.predicted_memory_bytes or report.placement, nbytes
    )
    report.notes.append(
        "all plan devices share one GPU: predicted with their work one action after another "
        f"and their memory added up ({ms:.2f} ms, {nbytes / 2**30:.2f} GiB), not the plan's "
        "one-GPU-per-device prediction"
    )


# run_this_rank takes run_plan's keywords (less device_map and optimizer, which torchrun's
# per-rank processes read from the plan): written out, not **kwargs, so a misspelt option
# is an error.
def run_this_rank(
    plan_path: str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    *,
    steps: int = 5,
    warmup: int = 1,
    device: str = "cpu",
    timeout_s: float = 300.0,
    threads: int | None = None,
    lr: float | None = None,
    precision: str | None = None,
    return_params: bool = False,
    count_collectives: bool = False,
) -> RunReport | None:
    """Under torchrun (:func:`planner.runtime.environment.torchrun_env`: ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set and well formed): this process is
    one rank of the plan's run; rank 0 returns the report, every other rank None.

    Example::

        # torchrun --nproc-per-node 2 -m planner.cli run plan.json --model model.py
        report = run_this_rank("plan.json", "model.py", steps=5)
    """
    import sys

    import torch

    env = torchrun_env()
    if env is None:
        raise InputError(
            "not set: run_this_rank runs one rank of a torchrun job",
            field="environment variable RANK",
        )
    rank, world = env.rank, env.world_size
    parse_fault(os.environ.get(FAULT_ENV), world)
    wait_for_rendezvous(env, timeout_s)  # one line, not torch's traceback, when unreachable
    source = str(plan_path)
    plan, settings, placement = prepare_run(
        plan_path, model_path, device=device, world_size=world, plan_source=source
    )
    chosen = run_precision(settings, precision, source, schedule=plan.schedule)
    settings.training = dataclasses.replace(settings.training, precision=chosen)
    ties = settings.profile.tied_parameters if settings.profile is not None else []
    check_parallel_run(plan, placement, chosen, source=source, ties=ties)
    run_dir = tempfile.mkdtemp(prefix=f"pipeplan-run-{rank}-")
    parameters = None
    try:
        config = worker_config(
            plan, settings, placement, model_path, steps=steps, warmup=warmup,
            timeout_s=timeout_s, run_dir=run_dir, threads=threads, lr=lr,
            plan_source=source, return_params=return_params,
            count_collectives=count_collectives,
        )  # fmt: skip
        result = worker_main(rank, dataclasses.replace(config, init_method="env://"))
        if result is not None and return_params:
            parameters = torch.load(Path(run_dir) / "params.pt")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if result is None:
        sys.stdout.flush()
        return None
    report = build_report(
        result, plan=plan, placement=placement, steps=steps, warmup=warmup, notes=settings.notes
    )
    report.profile_path = settings.profile_path
    report.parameters = parameters
    if count_collectives:
        report.collective_rows = collective_summary(report.collectives, plan, settings.profile)
    return report
