"""The body of one ``run`` process: build its stages, run the steps, report back.

Every process loads ``model.py``, builds the model with the profiler's seed (so all ranks
start from the same weights), splits it with :func:`planner.profile.split.split_model` as
the profiler did, and keeps the stages of the plan devices it drives. Each step every
process draws the same global batch (``torch.manual_seed(step)``, then
``sample_batch(microbatch_size * num_microbatches)``) and slices microbatch ``k`` as rows
``k * mbs .. (k + 1) * mbs``; first stages use its inputs, last stages its targets.

Every rank checks the split against the plan's profile (layer names and count) before it
trains: the launcher itself never runs the user's code (its exits, crashes and hangs are
reported from outside). Rank 0 gathers the results (timings, losses, memory, optionally the
parameters) over a gloo group and writes them to the run directory.

What the launcher's watchdog reads in the run directory: ``alive-RANK`` (its phase,
``loading`` or ``training``; rewritten at every step: the heartbeat), ``error-RANK.json``
(one line naming the rank, its devices and the error, and for bad input found while loading
the model the InputError's parts), ``done-RANK`` (finished cleanly), ``crash-RANK.txt`` and
``stack-RANK.txt`` (Python stacks on a fatal signal and when asked,
:mod:`planner.profile.stack_dump`). A rank that fails writes its error and exits non-zero;
the watchdog then stops every other rank. While the model loads, a user's exit or a
``KeyboardInterrupt`` from its code is bad input (exit 2); once training runs, every
failure is a failed run (exit 1).

Example::

    config = read_record(WorkerConfig, json.loads(Path(run_dir, "config.json").read_text()),
                         file="config.json")
    worker_main(rank=0, config=config)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.allocator import keep_freed_memory
from planner.errors import InputError, RunFailed
from planner.interrupts import Interrupted, handle_signals, handling
from planner.precision import autocast
from planner.profile.batch_dependence import batch_dependent_modules
from planner.profile.isolated import die_with_parent
from planner.profile.loader import load_model_file
from planner.profile.model_check import check_split
from planner.profile.stack_dump import record_stacks
from planner.profile.tied import find_tied_parameters
from planner.records import read_record, record_dict
from planner.runtime.comm import P2P, RECV_AHEAD_BYTES, cut_specs, message_order, p2p_groups
from planner.runtime.environment import FAULT_ENV, parse_fault, torchrun_env
from planner.runtime.measured import CountedCollective, MeasuredEvent, RankResult, RunResult
from planner.runtime.mesh import refuse_parallel_ties, stage_meshes
from planner.runtime.placement import Placement
from planner.runtime.settings import WorkerConfig
from planner.schedule import as_stream
from planner.schedule.groups import is_grouped
from planner.schedule.tied import defer_tied_steps
from planner.tensors import slice_batch, to_device

if TYPE_CHECKING:
    from planner.plan import Plan

__all__ = ["LOADING", "TRAINING", "stream_2bw", "worker_entry", "worker_main"]

LOADING, TRAINING = "loading", "training"
"""A rank's phases after the rendezvous, as its heartbeat file ``alive-RANK`` names them."""


def worker_entry(rank: int, config_path: str, parent_pid: int | None = None) -> None:
    """Entry point of a spawned process: run, and on any error write it and exit 1.

    Example::

        python -m planner.runtime.worker 0 /tmp/run/config.json 4242   # what launch.py starts
    """
    die_with_parent(parent_pid)  # no rank outlives its launcher
    raw = json.loads(Path(config_path).read_text())
    run_dir = Path(raw["run_dir"])
    record_stacks(run_dir / f"crash-{rank}.txt", run_dir / f"stack-{rank}.txt")
    with handle_signals():  # a KeyboardInterrupt is then the user code's own
        try:
            worker_main(rank, read_record(WorkerConfig, raw, file=config_path))
            (run_dir / f"done-{rank}").write_text("")
        except BaseException as exc:  # report every failure, then end this process at once
            _write_error(run_dir, rank, raw["placement"], exc)
            _flush()
            os._exit(1)
    _flush()
    os._exit(0)


def _flush() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()


def _write_error(run_dir: Path, rank: int, placement: Any, exc: BaseException) -> None:
    devices = read_record(Placement, placement, file=None).devices_of(rank)
    bad_input = None
    if isinstance(exc, InputError):
        text = exc.one_line()
        bad_input = [exc.message, exc.file, exc.field]
    elif isinstance(exc, RunFailed):
        text = str(exc)
    elif isinstance(exc, Interrupted):
        text = f"stopped by {exc.name}"
    else:
        text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:
            f = frames[-1]
            text += f" (at {Path(f.filename).name}:{f.lineno})"
    line = f"rank {rank} ({', '.join(devices)}): {text}"
    with contextlib.suppress(OSError):
        record = {"line": line, "input": bad_input}
        (run_dir / f"error-{rank}.json").write_text(json.dumps(record) + "\n")
    # Not printed: the launcher prints the one line that matters (the first failure).


@contextlib.contextmanager
def _model_code(model: str, training: bool) -> Iterator[None]:
    """Exits of the user's code outside its guarded calls (forward, hooks) named as such;
    once training runs, bad input is a failed run (exit 1), not exit 2."""
    doing = "training" if training else "loading the model"
    try:
        yield
    except InputError as exc:
        if training:
            raise RunFailed(exc.one_line()) from None
        raise
    except SystemExit as exc:
        code = "" if exc.code is None else repr(exc.code)
        raise _error(model, f"its code called sys.exit({code}) while {doing}", training) from None
    except KeyboardInterrupt:
        if not handling():
            raise
        raise _error(model, f"its code raised KeyboardInterrupt while {doing}", training) from None


def _error(model: str, text: str, training: bool) -> Exception:
    return RunFailed(f"{model}: {text}") if training else InputError(text, file=model)


def _fault(rank: int, step: int) -> None:
    fault = parse_fault(os.environ.get(FAULT_ENV))  # checked before the ranks started
    if fault is None or fault.rank != rank or fault.step != step:
        return
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "hang":
        time.sleep(1e6)
    raise RuntimeError(f"injected fault at step {step} ({FAULT_ENV})")


@dataclass
class _Stages:
    """This rank's stages, their optimizers, and the action lists it runs."""

    runtimes: dict[int, Any]  # stage id -> StageRuntime
    steppers: dict[int, Any]  # stage id -> PlainStep / TwoBufferedWeights / StreamedTwoBW
    syncs: dict[int, Any]  # stage id -> its ALLREDUCE (planner.runtime.grad_sync), or None
    names: dict[int, list[str]]  # canonical names of each stage's trainable parameters
    device_actions: Any  # plan device -> its action list (2bw: a continuous stream)
    two_bw: bool
    stream: bool


@dataclass
class _Measured:
    """What the steps of this rank measured."""

    step_seconds: list[float] = field(default_factory=list)
    losses: list[list[float]] = field(default_factory=list)
    stage_samples: dict[str, list[float]] = field(default_factory=dict)
    last_events: list[MeasuredEvent] = field(default_factory=list)
    collectives: list[CountedCollective] = field(default_factory=list)  # the last step's


def worker_main(rank: int, config: WorkerConfig) -> RunResult | None:
    """Run this rank's share of the plan; rank 0 returns (and writes) the gathered result.

    ``config`` is what :func:`planner.runtime.runner.worker_config` builds (its plan read
    and validated once, by ``read_record(WorkerConfig, ...)`` or the caller).

    Example::

        worker_main(rank, worker_config(plan, settings, placement, "model.py", steps=5, ...))
    """
    import torch

    from planner.profile.split import capture_model  # lazy: pulls torch
    from planner.runtime.shards import shard_stages, sharded_cut_specs

    run_dir = Path(config.run_dir)
    placement = config.placement
    device, control = _init_process(rank, config, placement)
    meshes = stage_meshes(config.plan.stages, placement, rank, device.type)  # every rank
    _heartbeat(run_dir, rank, LOADING)

    plan, schedule = config.plan, config.plan.schedule
    precision, expected = config.training.precision, config.training.split

    def mixed() -> Any:  # every forward and loss under the profile's autocast
        return autocast(device.type, precision)

    with _model_code(config.model, training=False):
        user = load_model_file(config.model)
        torch.manual_seed(0)  # the profiler's seed: identical weights on every rank
        model = user.build()
        model.train()
        batch_dependent = batch_dependent_modules(model)  # the report warns (BatchNorm)
        sample_inputs, _ = user.batch(plan.microbatch_size)
        grouped = is_grouped(plan.stages)
        if grouped:  # captured as the profile's shards were, this rank's stages sharded
            split = shard_stages(
                user, model, sample_inputs, stages=plan.stages, meshes=meshes,
                split_at=expected.split_at, capture=expected.capture,
            )  # fmt: skip
        else:
            split = capture_model(
                model, sample_inputs, expected.split_at, capture=expected.capture,
                source=config.model,
            )  # fmt: skip
        covered = max(s.last for s in plan.stages) + 1
        check_split(split, expected, model=config.model, covered=covered)
        # What crosses each cut, in the dtypes the stages will produce: one pass under this
        # device's autocast (a message of another dtype would stop the run at its send).
        inputs = split.flat_inputs(sample_inputs)
        with mixed():
            reshard = _reshard(plan, placement, rank, user, model) if grouped else None
            if grouped:  # a member's part of the activations: from the sharded stages
                specs = sharded_cut_specs(
                    split, plan.stages, inputs, meshes, placement, rank, group=control,
                    device=device, reshard=reshard,
                )  # fmt: skip
            else:
                specs = cut_specs(split, plan.stages, inputs, device=device)
                reshard = None
    names = {id(p): n for n, p in model.named_parameters()}
    stages = _build_stages(
        rank, config, plan, schedule, placement, split, names, user, device, meshes
    )
    for runtime in stages.runtimes.values():
        runtime.autocast = mixed
    executor, scaler = _executor(
        rank, config, plan, placement, split, stages, specs, device, reshard
    )

    def batches(step: int) -> tuple[list[Any] | None, list[Any] | None]:
        return _batches(step, user, split, plan, stages.runtimes, device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _heartbeat(run_dir, rank, TRAINING)
    with _model_code(config.model, training=True):
        measured = _train(rank, run_dir, executor, batches, stages.stream, config, control, plan)
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else _max_rss()
    mine = RankResult(
        rank=rank,
        devices=placement.devices_of(rank),
        torch_device=str(device),
        step_seconds=measured.step_seconds,
        losses=measured.losses,
        events=measured.last_events,
        # Means, as the profile's times the simulator adds up (planner.profile.means).
        stage_ms={k: statistics.fmean(v) for k, v in measured.stage_samples.items()},
        stage_count={k: len(v) for k, v in measured.stage_samples.items()},
        peak_memory_bytes=peak,
        memory_kind="cuda_max_allocated" if device.type == "cuda" else "max_rss",
        precision=precision,
        skipped=list(scaler.skipped) if scaler is not None else [],
        batch_dependent=batch_dependent,
        collectives=measured.collectives,
    )
    return _gather(rank, run_dir, config, placement, stages, mine, control)


def _init_process(rank: int, config: WorkerConfig, placement: Placement) -> tuple[Any, Any]:
    """Threads, allocator, this rank's device and the process group; returns the device and
    the gloo group for control messages (None: the default group is gloo already)."""
    import torch
    import torch.distributed as dist

    keep_freed_memory()  # as the profiler did: see planner.allocator
    assert config.training.threads is not None  # worker_config always sets them
    torch.set_num_threads(config.training.threads)
    env = torchrun_env() if config.init_method in (None, "env://") else None
    if placement.device_type == "cuda":
        local = env.local_rank if env is not None else None
        device = _cuda_device(rank, local, torch.cuda.device_count())
        torch.cuda.set_device(device)  # before the process group: NCCL uses this GPU
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        placement.backend,
        init_method=config.init_method or "env://",
        rank=rank,
        world_size=placement.world_size,
        timeout=datetime.timedelta(seconds=config.timeout_s),
    )
    control = dist.new_group(backend="gloo") if placement.backend != "gloo" else None
    return device, control


def _cuda_device(rank: int, local_rank: int | None, count: int) -> Any:
    """The GPU of ``rank``: ``cuda:LOCAL_RANK`` under torchrun, else ``cuda:rank`` (one
    host); one line when this host has no such GPU (torchrun's ``--nproc-per-node`` above
    the GPU count), not CUDA's invalid device ordinal at the first tensor.

    Example::

        _cuda_device(3, None, 8)   # device(type='cuda', index=3)
    """
    import torch

    index = rank if local_rank is None else local_rank
    if index >= count:
        raise InputError(
            f"rank {rank} runs on cuda:{index}, but this host has {count} GPUs "
            "(one process per GPU)",
            field="LOCAL_RANK" if local_rank is not None else "--device",
        )
    return torch.device("cuda", index)


def _build_stages(
    rank: int,
    config: WorkerConfig,
    plan: Plan,
    schedule: Any,
    placement: Placement,
    split: Any,
    names: dict[int, str],
    user: Any,
    device: Any,
    meshes: dict[int, Any],
) -> _Stages:
    """This rank's stage modules (tied parameters copied, never shared; FSDP-sharded where
    the plan says), their gradient syncs and optimizers (2bw: weight versions; ZeRO-1: a
    replica's part) and the action lists to run."""
    # lazy: these pull torch
    from planner.profile.split import retarget_device
    from planner.runtime.grad_sync import fully_shard_stage, stage_sync
    from planner.runtime.optimizer import PlainStep, StreamedTwoBW, TwoBufferedWeights
    from planner.runtime.stage import StageRuntime
    from planner.runtime.tied import own_copies

    m = plan.num_microbatches
    local = placement.devices_of(rank)
    two_bw = schedule.weight_versions == 2
    total = config.warmup + config.steps
    device_actions, stream = schedule.devices, False
    if two_bw and total > 1:
        device_actions, stream = stream_2bw(schedule, plan.stages, m, total)
    out = _Stages({}, {}, {}, {}, device_actions, two_bw, stream)
    claimed: set[int] = set()  # parameters an earlier local stage holds: copy, never share
    for spec in (s for s in plan.stages if any(d in local for d in s.devices)):
        module = split.stage(spec.first, spec.last).to(device)
        retarget_device(module, device)
        out.names[spec.id] = [names[id(p)] for p in module.parameters() if p.requires_grad]
        module = own_copies(module, claimed)
        module.train()
        if spec.sharding == "fsdp":
            module = fully_shard_stage(module, meshes[spec.id])
        is_last = spec.id == len(plan.stages) - 1
        kind = StreamedTwoBW if stream else TwoBufferedWeights if two_bw else PlainStep
        sync, out.steppers[spec.id] = stage_sync(
            spec, module, meshes[spec.id], optimizer=config.training.optimizer, lr=config.lr,
            last_backward=_last_backward(device_actions, local, spec.id), step=kind,
        )  # fmt: skip
        out.syncs[spec.id] = sync
        out.runtimes[spec.id] = StageRuntime(
            module,
            stage_id=spec.id,
            is_last=is_last,
            recompute=spec.recompute,
            recompute_layers=spec.recompute_layers,
            num_microbatches=m,
            loss=user.loss if is_last else None,
            weights=out.steppers[spec.id].weights if stream else None,
            before_backward=getattr(sync, "before_backward", None),
        )
    return out


def _last_backward(device_actions: Any, local: list[str], stage: int) -> int:
    """The microbatch of the last backward of ``stage`` in this rank's lists (FSDP syncs
    the gradients there); -1 where it runs none."""
    last = -1
    for dev in local:
        for a in device_actions[dev]:
            if a.stage == stage and a.kind.value in ("B", "I"):
                last = a.microbatch
    return last


def _executor(
    rank: int,
    config: WorkerConfig,
    plan: Plan,
    placement: Placement,
    split: Any,
    stages: _Stages,
    specs: Any,
    device: Any,
    reshard: Any = None,
) -> tuple[Any, Any]:
    """The process groups (replicas, ties, fp16's overflow agreement: created on every rank
    in one order), the final action lists and the executor; also returns the loss scaler."""
    import torch.distributed as dist

    # lazy: these pull torch
    from planner.runtime.collective_count import CollectiveCounter
    from planner.runtime.executor import ProcessExecutor
    from planner.runtime.loss_scale import AgreedLossScaler
    from planner.runtime.tied import TiedExchange

    # The stages' groups exist (stage_meshes); then one group per tied parameter, in the
    # same order everywhere (planner.runtime.tied).
    ties = find_tied_parameters(split)
    refuse_parallel_ties(ties, plan.stages, config.plan_source or "the run's plan")
    tied = TiedExchange.create(ties, plan.stages, placement, rank, stages.names)
    # fp16: the loss scale, and the group of every rank that agrees on overflows (created
    # on every rank, after the tie groups).
    scaler, scale_group = None, None
    if config.training.precision == "fp16":
        scaler = AgreedLossScaler(device)
        if placement.world_size > 1:
            scale_group = dist.new_group(list(range(placement.world_size)))
    for runtime in stages.runtimes.values():
        runtime.scale_loss = scaler.scale if scaler is not None and runtime.is_last else None
    # Every gradient a STEP needs is complete at the device's first STEP (of a tie-holding
    # stage; of any stage in fp16, where every rank agrees on overflows there).
    deferred = frozenset(s.id for s in plan.stages) if scaler is not None else tied.holding
    if deferred:
        stages.device_actions = defer_tied_steps(
            stages.device_actions, deferred, plan.num_microbatches
        )
    order = message_order(stages.device_actions, plan.stages, placement.rank_of)
    # NCCL: a group per direction of each pair, created on every rank after those above.
    groups = p2p_groups(order, placement.backend, rank, device)
    local = placement.devices_of(rank)
    run_dir = Path(config.run_dir)
    executor = ProcessExecutor(
        rank,
        placement,
        plan.stages,
        stages.device_actions,
        stages.runtimes,
        stages.steppers,
        specs,
        P2P(
            rank,
            order,
            specs,
            device,
            threaded=device.type == "cpu" and len(local) > 1,
            ahead_bytes=RECV_AHEAD_BYTES if device.type == "cpu" else 0,
            pieces=reshard.specs if reshard is not None else None,
            groups=groups,
        ),
        stages.syncs,
        device,
        timeout_s=config.timeout_s,
        heartbeat=lambda: _heartbeat(run_dir, rank, TRAINING),
        tied=tied,
        scaler=scaler,
        scale_group=scale_group,
        counter=CollectiveCounter() if config.count_collectives else None,
        reshard=reshard,
    )
    return executor, scaler


def _batches(
    step: int, user: Any, split: Any, plan: Plan, runtimes: dict[int, Any], device: Any
) -> tuple[list[Any] | None, list[Any] | None]:
    """Step ``step``'s microbatches: inputs for a first stage, targets for a last one."""
    import torch

    needs_inputs = 0 in runtimes
    needs_targets = len(plan.stages) - 1 in runtimes
    if not (needs_inputs or needs_targets):
        return None, None
    mbs, m = plan.microbatch_size, plan.num_microbatches
    torch.manual_seed(step)
    x, y = user.batch(mbs * m)
    ins = [
        split.flat_inputs(to_device(slice_batch(x, k * mbs, (k + 1) * mbs), device))
        for k in range(m)
    ]
    tgs = [to_device(slice_batch(y, k * mbs, (k + 1) * mbs), device) for k in range(m)]
    return (ins if needs_inputs else None), (tgs if needs_targets else None)


def _train(
    rank: int,
    run_dir: Path,
    executor: Any,
    batches: Any,
    stream: bool,
    config: WorkerConfig,
    control: Any,
    plan: Plan,
) -> _Measured:
    """Run the warm-up and measured steps (2bw: one continuous stream of them)."""
    import torch.distributed as dist

    warmup = config.warmup
    total = warmup + config.steps
    out = _Measured()
    if stream:
        # One continuous 2bw stream: the data of every iteration, then one run.
        _heartbeat(run_dir, rank, TRAINING)
        _fault(rank, 0)
        ins_all: list[Any] = []
        tgs_all: list[Any] = []
        for step in range(total):
            ins, tgs = batches(step)
            ins_all += ins or []
            tgs_all += tgs or []
        dist.barrier(group=control)
        result = executor.run_step(ins_all or None, tgs_all or None)
        split = _split_stream(result, plan.num_microbatches, warmup, total)
        out.step_seconds, out.losses, out.stage_samples, out.last_events = split
    for step in range(0 if stream else total):
        _heartbeat(run_dir, rank, TRAINING)
        _fault(rank, step)
        inputs, targets = batches(step)
        dist.barrier(group=control)
        result = executor.run_step(inputs, targets)
        out.losses.append(result.losses)
        if step >= warmup:
            out.step_seconds.append(result.seconds)
            for ev in result.events:
                key = f"{ev.kind}{ev.stage}"
                out.stage_samples.setdefault(key, []).append(ev.end_ms - ev.start_ms)
            out.last_events = list(result.events)
            out.collectives = result.collectives
    dist.barrier(group=control)
    return out


def _gather(
    rank: int,
    run_dir: Path,
    config: WorkerConfig,
    placement: Placement,
    stages: _Stages,
    mine: RankResult,
    control: Any,
) -> RunResult | None:
    """Rank 0 gathers every rank's figures (and parameters) and writes them; all return."""
    import torch
    import torch.distributed as dist

    from planner.runtime.grad_sync import full_tensor

    trained: dict[str, Any] = {}
    if config.return_params:  # a shard's whole tensor: every member gathers, stage by stage
        for s, rt in sorted(stages.runtimes.items()):
            tensors = stages.steppers[s].state() if stages.two_bw else rt.params
            for name, t in zip(stages.names[s], tensors, strict=True):
                trained[name] = full_tensor(t).detach().to("cpu").clone()
    gathered: list[Any] = [None] * placement.world_size if rank == 0 else []
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0, group=control)
    gathered_params: list[Any] = [None] * placement.world_size if rank == 0 else []
    if config.return_params:
        dist.gather_object(trained, gathered_params if rank == 0 else None, dst=0, group=control)
    out = None
    if rank == 0:
        out = RunResult(gathered)
        (run_dir / "result.json").write_text(json.dumps(record_dict(out)))
        if config.return_params:
            merged: dict[str, Any] = {}
            for part in gathered_params:
                for k, v in part.items():
                    merged.setdefault(k, v)
            torch.save(merged, run_dir / "params.pt")
    dist.barrier(group=control)
    dist.destroy_process_group()
    return out


def stream_2bw(
    schedule: Any, stages: Any, num_microbatches: int, iterations: int
) -> tuple[Any, bool]:
    """A schedule without a flush: when the plan's lists are its generator's, run its
    continuous stream of ``iterations`` iterations (iteration i+1 starts while i drains), as 2BW
    does (:func:`planner.schedule.as_stream`).

    Returns ``(device action lists, True)``, or the plan's own lists and False.

    Example::

        actions, stream = stream_2bw(schedule, plan.stages, plan.num_microbatches, 10)
    """
    stream = as_stream(schedule, stages, iterations)
    if stream is None:
        return schedule.devices, False  # a hand-made order: run it as given, step by step
    return stream.devices, True


def _split_stream(
    result: Any, num_microbatches: int, warmup: int, iterations: int
) -> tuple[list[float], list[list[float]], dict[str, list[float]], list[MeasuredEvent]]:
    """Per-iteration figures of one 2bw stream: an iteration ends with this rank's last STEP
    of it; the measured events are those of the last iteration."""
    ends = [0.0] * iterations
    for ev in result.events:
        if ev.kind == "STEP":
            ends[ev.iteration] = max(ends[ev.iteration], ev.end_ms)
    for i in range(1, iterations):
        ends[i] = max(ends[i], ends[i - 1])
    bounds = [0.0, *ends]
    seconds = [(bounds[i + 1] - bounds[i]) / 1e3 for i in range(warmup, iterations)]
    losses: list[list[float]] = [[] for _ in range(iterations)]
    for k, value in zip(result.loss_microbatches, result.losses, strict=True):
        losses[k // num_microbatches].append(value)

    def iteration(ev: Any) -> int:
        return ev.microbatch // num_microbatches if ev.microbatch >= 0 else ev.iteration

    samples: dict[str, list[float]] = {}
    for ev in result.events:
        if iteration(ev) >= warmup:
            samples.setdefault(f"{ev.kind}{ev.stage}", []).append(ev.end_ms - ev.start_ms)
    last = [ev for ev in result.events if iteration(ev) == iterations - 1]
    t0 = min((ev.start_ms for ev in last), default=0.0)
    events = [
        dataclasses.replace(ev, start_ms=ev.start_ms - t0, end_ms=ev.end_ms - t0) for ev in last
    ]
    return seconds, losses, samples, events


def _reshard(plan: Plan, placement: Placement, rank: int, user: Any, model: Any) -> Any:
    """The plan's resharded cuts (:class:`~planner.runtime.reshard.Reshard`, along the
    sequence dimension of the model's sequence-parallel ``tp_plan``), None without any."""
    from planner.profile.tp_plan import tensor_parallel_plan
    from planner.runtime.reshard import Reshard, sequence_dim

    reshard = Reshard(plan.stages, placement, rank)
    if not reshard.any_cut():
        return None
    styles = tensor_parallel_plan(user, model, sequence_parallel=True).styles
    reshard.dim = sequence_dim(styles)
    return reshard


def _heartbeat(run_dir: Path, rank: int, phase: str) -> None:
    # The launcher reads the file's time (progress) and its text (the phase).
    with contextlib.suppress(OSError):
        (run_dir / f"alive-{rank}").write_text(phase)


def _max_rss() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


if __name__ == "__main__":  # python -m planner.runtime.worker RANK CONFIG PARENT (launch.py)
    worker_entry(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
