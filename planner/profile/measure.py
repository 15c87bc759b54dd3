"""Measuring each layer of a split model: times, activation sizes, parameter and state sizes.

For every microbatch size the layers run one after another on the real sample batch; each
layer is measured in isolation on the (detached) values that cross the cut before it
(the timed runs go round robin over all layers and sizes):

- ``forward_ms``: the layer's forward with autograd recording (the last layer includes the loss);
- ``backward_ms``: gradients w.r.t. its floating inputs and its parameters together, the
  parameters' added into their ``.grad`` as in training (gradient accumulation);
- ``backward_input_ms`` / ``backward_weight_ms``: the same graph, gradients w.r.t. the inputs
  only, then w.r.t. the parameters only (the two halves zero-bubble schedules separate);
- ``saved_bytes``: distinct storages autograd keeps for the backward (saved-tensor hooks),
  parameters and buffers excluded; ``output_bytes``: every tensor crossing the next cut;
- ``workspace_bytes`` (CUDA only): peak memory of forward plus backward beyond those;
- ``optimizer_ms`` (per layer, independent of the microbatch size): one step of the profile's
  optimizer over the layer's parameters, holding real gradients (from the smallest
  microbatch size), followed by ``zero_grad(set_to_none=False)`` -- what the runtime's
  ``STEP`` does. The weights are restored afterwards.

Each time is the median of the timed rounds after ``warmup`` untimed ones, as the profile
format says, with the rounds' mean beside it (``mean``), which the planner adds up (a run's
steps add up every layer's runs, the machine's slow spells included, which a median leaves
out: :mod:`planner.profile.means`); ``spread`` keeps the quartiles. A profile times at
least ``repeat`` rounds and goes on, round by round, until its timed rounds have lasted
``min_time_s`` (the optimizer's steps the same, on their own): a shared machine's speed
drifts over seconds, and a profile timed in a fraction of a second catches one moment of
it, which a run seconds later does not see (issue 23: six consecutive 0.2 s profiles of
examples/mlp.py spread 24.2-35.2 ms; timed over 2.5 s, 26.6-28.8 ms). ``meta.rounds``
records how many rounds the layers got.
Two timing methods (``timing``, recorded in ``Profile.settings.timing``):

- ``layer`` (the default on CPU): each layer measured in isolation as above, each interval
  timed on its own (on CUDA with events after a synchronisation);
- ``pass`` (the default on CUDA): each layer timed inside uninterrupted passes over the
  whole model, one synchronisation per pass (:mod:`planner.profile.pass_timing`), so that
  kernels queue as in a run; each measurement also records the whole forward and
  backward (``pass_forward_ms``, ``pass_backward_ms``) the layers must add up to. On CUDA
  memory is then read off the caching allocator inside a whole pass: ``saved_bytes`` is
  what each layer's forward leaves allocated until its backward (saved tensors, autocast
  casts, its outputs, rounded to allocator blocks), ``workspace_bytes`` the transient peak
  beyond all that is held, and each layer's ``optimizer_workspace_bytes`` the transient
  memory of its optimizer step.

On CPU intervals are read from a monotonic clock with a fixed number of threads. With
``colocate`` above 1, companion processes run the model's training step beside the
measuring one while everything is timed, as a plan's other processes will in its run, and
the clock is the run's ``perf_counter`` (:mod:`planner.profile.colocation`).

Example::

    profile = profile_model("examples/gpt.py", [1, 2, 4], repeat=5, warmup=2)
    profile.save("profiles/gpt.json")
"""

from __future__ import annotations

import datetime as _dt
import functools
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from planner.allocator import keep_freed_memory
from planner.errors import InputError
from planner.limits import (
    MAX_MICROBATCH_SIZE,
    MAX_MIN_TIME_S,
    MAX_REPEATS,
    MAX_THREADS,
    check_int,
)
from planner.optimizers import make_optimizer, optimizer_state_bytes
from planner.precision import autocast as precision_autocast
from planner.precision import check_precision
from planner.profile.batch_dependence import batch_dependent_modules
from planner.profile.colocation import Colocation, busy_cores, check_colocate
from planner.profile.companions import CompanionConfig, Companions, check_companion_memory
from planner.profile.loader import UserModel, load_model_file
from planner.profile.means import measured, spike_free_mean
from planner.profile.pass_timing import (
    CudaClock,
    CudaMemory,
    LayerMemory,
    ModelPasses,
    PassClock,
    PassSample,
    WallClock,
    time_calls,
)
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.profile.settings import ProfileSettings
from planner.profile.tied import find_tied_parameters
from planner.tensors import detach, tensors, to_device

__all__ = [
    "MIN_TIME_S",
    "TIMING_METHODS",
    "check_device",
    "check_min_time",
    "check_timing",
    "ProgressFn",
    "optimizer_state_bytes",
    "parse_microbatch_sizes",
    "profile_model",
    "measure_layer",
]

MIN_TIME_S = 2.0
"""Seconds a profile's timed rounds last at least by default (``--min-time``; the optimizer's
steps as long again): long enough to see the machine's speed over seconds, not one moment."""

TIMING_METHODS = ("pass", "layer")
"""``pass``: layers timed inside whole passes; ``layer``: each layer on its own (see above)."""

ProgressFn = Callable[[int, int, str], None]
"""Called as ``progress(done, total, description)`` after each timed repeat of all layers."""


@functools.cache
def _split_backward_fns() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """The zero-bubble backward halves of torch.distributed.pipelining (private, but the very
    code the runtime's zero-bubble schedules run); None where this torch lacks them."""
    try:
        from torch.distributed.pipelining import _backward
    except ImportError:  # pragma: no cover - older torch: halves via plain autograd.grad
        return None
    fns = (
        getattr(_backward, "stage_backward_input", None),
        getattr(_backward, "stage_backward_weight", None),
    )
    if fns[0] is None or fns[1] is None:  # pragma: no cover
        return None
    return fns[0], fns[1]


_TIMINGS = ("forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms")


def parse_microbatch_sizes(text: str | Sequence[int]) -> list[int]:
    """``"1,2,4"`` (or a list of ints) as sorted distinct positive sizes.

    Example::

        parse_microbatch_sizes("4, 1,2")   # [1, 2, 4]
    """
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    sizes: list[int] = []
    for item in items:
        try:
            value = int(item)
        except (TypeError, ValueError):
            value = None
        if value is None or isinstance(item, bool) or value <= 0 or str(value) != str(item):
            raise InputError(
                f"expected positive whole numbers separated by commas (e.g. 1,2,4), got {item!r}",
                field="-b",
            )
        sizes.append(check_int(value, field="-b", high=MAX_MICROBATCH_SIZE))
    if not sizes:
        raise InputError("expected at least one microbatch size (e.g. 1,2,4)", field="-b")
    return sorted(set(sizes))


@dataclass
class _Settings:
    device: Any  # torch.device
    repeat: int
    warmup: int
    threads: int = 1
    precision: str = "fp32"  # forward (and loss) under torch.autocast: see planner.precision
    timing: str = "layer"  # TIMING_METHODS
    colocate: int = 1  # processes computing on the host while timing (planner.profile.colocation)
    min_time_s: float = 0.0  # timed rounds go on until they have lasted this long
    rounds: int = 0  # the layers' timed rounds, as measured (meta.rounds)

    def rounds_of(self) -> Iterator[int]:
        """The timed rounds: ``repeat`` at least, then more until ``min_time_s`` has passed
        since the first began (at most ``MAX_REPEATS``).

        Example::

            list(_Settings(torch.device("cpu"), 3, 0).rounds_of())   # [0, 1, 2]
        """
        start = time.perf_counter()
        r = 0
        while r < self.repeat or (
            r < MAX_REPEATS and time.perf_counter() - start < self.min_time_s
        ):
            yield r
            r += 1

    def autocast(self) -> Any:
        """The forward's autocast context (none for fp32)."""
        return precision_autocast(self.device.type, self.precision)

    @property
    def clock(self) -> str:
        """How intervals are timed (recorded in the profile's meta)."""
        if self.device.type == "cuda":
            return "cuda_events"
        if self.colocate > 1:
            # Co-located: the companions take cores and caches as the run's processes will,
            # and the run times its actions with perf_counter; measure on that clock.
            return "perf_counter"
        # One thread does all the work (autograd runs CPU backward on the calling thread), so
        # its CPU time is the layer's cost without the time other processes took the core
        # from it; with more threads only the wall clock sees all the work.
        return "thread_time" if self.threads == 1 else "perf_counter"

    def pass_clock(self) -> PassClock:
        """The clock of the pass timing: CUDA events, or this CPU clock."""
        if self.device.type == "cuda":
            return CudaClock(self.device)
        if self.clock == "thread_time":
            return WallClock(time.thread_time, "thread_time")
        return WallClock(time.perf_counter, "perf_counter")


def profile_model(
    path: str | os.PathLike[str],
    microbatch_sizes: Sequence[int] | str,
    *,
    repeat: int = 5,
    warmup: int = 2,
    device: str = "cpu",
    threads: int = 1,
    optimizer: str = "adam",
    split_at: str | None = None,
    capture: str = "auto",
    precision: str = "fp32",
    timing: str | None = None,
    progress: ProgressFn | None = None,
    colocate: int = 1,
    min_time_s: float = MIN_TIME_S,
) -> Profile:
    """Load ``model.py`` at ``path``, split it into layers and measure every layer.

    On CPU, ``threads`` is pinned with ``torch.set_num_threads`` for the run (and restored).
    With one thread, intervals are that thread's CPU time (``time.thread_time``): on a shared
    machine, time other processes take the core from it is not charged to the layer. With
    more threads, the wall clock. On CUDA, CUDA events. ``Profile.settings.clock`` records which.
    ``capture`` picks torch.fx or torch.export (``auto``: see
    :func:`planner.profile.split.capture_model`); ``Profile.settings.capture`` records which ran.
    ``precision`` (``fp32``, ``bf16``, ``fp16``) runs every forward and the loss under
    ``torch.autocast`` (:mod:`planner.precision`), so activation and cut sizes come out in
    the autocast dtype; parameters, gradients and optimizer state stay fp32. ``timing``
    (``pass`` or ``layer``; None: ``pass`` on CUDA, ``layer`` on CPU) picks how layers are
    timed (see the module docstring); ``Profile.settings.timing`` records it. ``colocate``
    (CPU): the processes computing on the host while the layers are timed, this one
    included; above 1, ``colocate - 1`` companions (:mod:`planner.profile.companions`) run
    the model's training step beside it and intervals are read from ``perf_counter``, the
    run's clock; ``Profile.settings.colocation`` records it (:mod:`planner.profile.colocation`).
    Timed rounds: ``repeat`` at least, and more until they have lasted ``min_time_s``
    (module docstring; 0: exactly ``repeat``).

    Example::

        profile = profile_model("examples/mlp.py", [1, 8], repeat=3, warmup=1, min_time_s=0)
        profile = profile_model("examples/gpt.py", [1, 2], colocate=2)   # as 2 processes run
        [layer.name for layer in profile.layers]
    """
    import torch

    sizes = parse_microbatch_sizes(microbatch_sizes)
    torch_device = _device(device)
    settings = _Settings(
        torch_device,
        _positive(repeat, "--repeat"),
        _count(warmup),
        _positive(threads, "--threads"),
        check_precision(precision),
        check_timing(timing, torch_device.type),
        check_colocate(colocate, torch_device.type),
        check_min_time(min_time_s),
    )
    optimizer_state_bytes(0, optimizer)  # validates the name
    # Other work on the host, sampled before any of this profile's own (co-located only).
    busy = busy_cores() if settings.colocate > 1 else None
    user = load_model_file(path)
    keep_freed_memory()  # as every run worker does: see planner.allocator
    started = time.perf_counter()
    old_threads = torch.get_num_threads()
    if settings.device.type == "cpu":
        torch.set_num_threads(threads)
    # Co-located: the companions start now and warm up while this process prepares.
    beside = _companions(user, sizes, threads, optimizer, settings)
    try:
        split, model = _prepare(user, sizes[0], settings, split_at, capture)
        params = split.layer_parameters()
        layers = [
            Layer(
                name=name,
                param_count=sum(p.numel() for p in ps),
                param_bytes=(pb := sum(p.numel() * p.element_size() for p in ps)),
                optimizer_state_bytes=optimizer_state_bytes(pb, optimizer),
            )
            for name, ps in zip(split.names, params, strict=True)
        ]
        prepared = [_prepare_size(user, split, size, settings, split_at) for size in sizes]
        if beside is not None:
            beside.wait_ready()
        if progress is not None:  # loaded and checked at every size: the measuring starts
            progress(0, settings.repeat, "measuring")

        def after_repeat(r: int) -> None:
            settings.rounds = r + 1
            if progress is not None:
                total = max(settings.repeat, r + 1)
                progress(min(r + 1, total), total, f"round {r + 1}")

        if settings.timing == "pass":
            measurements = _measure_in_passes(prepared, settings, after_repeat)
        else:
            # Every size and layer in one round robin: the machine's slow spells (seconds
            # long on a shared VM) then fall on a few samples of each, not on all of one.
            everything = [run for size in prepared for run in size.runners]
            samples = iter(_time_runners(everything, settings, after_repeat))
            measurements = [
                Measurement(
                    size.size,
                    size.input_bytes,
                    [_timing(next(samples), *facts) for facts in size.facts],
                )
                for size in prepared
            ]
        # The step does not depend on the microbatch size: time it once.
        step_workspace = [0] * len(layers)
        steps = _time_optimizer(prepared[0].runners, optimizer, settings, step_workspace)
        for layer, ms, ws in zip(layers, steps, step_workspace, strict=True):
            layer.optimizer_ms = ms
            layer.optimizer_workspace_bytes = ws
        if beside is not None:
            beside.check()  # each computed beside every timed run
    finally:
        torch.set_num_threads(old_threads)
        if beside is not None:
            beside.stop()
    return Profile(
        model=user.name,
        layers=layers,
        measurements=measurements,
        source_sha256=user.source_sha256,
        device=str(settings.device),
        dtype=_dtype(model),
        torch_version=torch.__version__,
        optimizer=optimizer,
        precision=settings.precision,
        meta=_meta(settings, split, time.perf_counter() - started),
        tied_parameters=find_tied_parameters(split),
        settings=ProfileSettings(
            capture=split.capture,
            split_at=split_at,
            threads=threads if settings.device.type == "cpu" else None,
            clock=settings.clock,
            timing=settings.timing,
            # The modules that make the model's result depend on the microbatch size.
            batch_dependent=tuple(batch_dependent_modules(model)),
            colocation=Colocation(
                settings.colocate, "companions" if settings.colocate > 1 else "alone", busy
            ),
        ),
    )


def _companions(
    user: UserModel, sizes: list[int], threads: int, optimizer: str, settings: _Settings
) -> Companions | None:
    """The started companions of a co-located profile (None for one process)."""
    if settings.colocate <= 1:
        return None
    check_companion_memory(settings.colocate - 1)
    config = CompanionConfig(
        str(user.path), sizes, threads, settings.precision, optimizer, settings.warmup + 1
    )
    return Companions(config, settings.colocate - 1).start()


def measure_layer(
    layer: Any,
    values: Sequence[Any],
    *,
    device: str = "cpu",
    repeat: int = 5,
    warmup: int = 2,
    loss: Callable[[Any], Any] | None = None,
    threads: int | None = None,
) -> tuple[LayerTiming, tuple[Any, ...] | Any]:
    """Measure one layer on the values entering it; returns its timing and its outputs.

    ``loss`` (for the last layer) turns the layer's output into the scalar to differentiate.
    ``threads`` is the CPU thread count in force (default: torch's current one); it picks the
    clock (see :func:`profile_model`).

    Example::

        timing, outputs = measure_layer(split.layers[1], (mask, hidden), repeat=3)
    """
    import torch

    count = torch.get_num_threads() if threads is None else _positive(threads, "--threads")
    settings = _Settings(_device(device), _positive(repeat, "--repeat"), _count(warmup), count)
    return _measure(layer, values, settings, loss)


@dataclass
class _PreparedSize:
    """One microbatch size, ready to time: a runner per layer and what one untimed pass saw."""

    size: int
    input_bytes: int
    runners: list[_Runner]
    facts: list[tuple[int, int, int]]  # per layer: output, saved and workspace bytes
    passes: ModelPasses  # the whole model on this size's batch, for the pass timing


def _prepare_size(
    user: UserModel, split: Any, size: int, settings: _Settings, split_at: str | None
) -> _PreparedSize:
    from planner.profile.split import tensor_bytes  # lazy: pulls torch

    inputs, targets = user.batch(size)
    inputs = to_device(inputs, settings.device)
    targets = to_device(targets, settings.device)
    split = _split_for(user, split, inputs, split_at)
    values: Any = split.flat_inputs(inputs)
    passes = ModelPasses(
        split.layers,
        values,
        lambda out: user.loss(out, targets),
        clock=settings.pass_clock(),
        autocast=settings.autocast,
    )
    runners: list[_Runner] = []
    facts: list[tuple[int, int, int]] = []
    for k, layer in enumerate(split.layers):
        is_last = k == split.num_layers - 1
        loss = (lambda out: user.loss(out, targets)) if is_last else None
        run = _Runner.for_layer(layer, values, loss, settings)
        outputs, saved, workspace = run.inspect()
        facts.append((tensor_bytes(outputs), saved, workspace))
        values = detach(outputs)
        runners.append(run)
    for p in passes.all_params:  # the isolated runs leave no gradients; the passes do
        p.grad = None
    return _PreparedSize(size, tensor_bytes(inputs), runners, facts, passes)


def _measure_in_passes(
    prepared: Sequence[_PreparedSize],
    settings: _Settings,
    after_repeat: Callable[[int], None] | None = None,
) -> list[Measurement]:
    """Every size timed in whole passes (:mod:`planner.profile.pass_timing`), round robin
    over the sizes; on CUDA each layer's memory read off the allocator after the warm-up."""
    for _ in range(settings.warmup):
        for size in prepared:
            size.passes.sample()
    memory: list[list[LayerMemory] | None] = [None] * len(prepared)
    if settings.device.type == "cuda":
        memory = [size.passes.memory(CudaMemory(settings.device)) for size in prepared]
    samples: list[list[PassSample]] = [[] for _ in prepared]
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as in _time_runners
    try:
        for r in settings.rounds_of():
            for size, into in zip(prepared, samples, strict=True):
                into.append(size.passes.sample())
            if after_repeat is not None:
                after_repeat(r)
    finally:
        if gc_was_enabled:
            gc.enable()
    out = []
    for size, got, mem in zip(prepared, samples, memory, strict=True):
        timings = []
        for k, (output, saved, workspace) in enumerate(size.facts):
            if mem is not None:  # CUDA: as the caching allocator holds it
                saved, workspace = mem[k].held_bytes, mem[k].workspace_bytes
            per_layer = {
                "forward_ms": [s.forward_ms[k] for s in got],
                "backward_ms": [s.backward_ms[k] for s in got],
                "backward_input_ms": [s.backward_input_ms[k] for s in got],
                "backward_weight_ms": [s.backward_weight_ms[k] for s in got],
            }
            timings.append(_timing(per_layer, output, saved, workspace))
        out.append(
            Measurement(
                size.size,
                size.input_bytes,
                timings,
                pass_forward_ms=_round(statistics.fmean(s.whole_forward_ms for s in got)),
                pass_backward_ms=_round(statistics.fmean(s.whole_backward_ms for s in got)),
            )
        )
        for p in size.passes.all_params:
            p.grad = None
    return out


def _time_optimizer(
    runners: Sequence[_Runner],
    optimizer: str,
    settings: _Settings,
    workspace: list[int] | None = None,
) -> list[float]:
    """Median time of one optimizer step (and the runtime's gradient zeroing) per layer;
    on CUDA ``workspace`` (if given) receives the transient memory of each layer's step.

    Each layer's parameters get their real gradients from one backward; before every step
    they are put back (untimed), so every timed step sees real gradients. With ``layer``
    timing each step is timed on its own, round robin over the layers as the other timings
    are; with ``pass`` timing all layers' steps run back to back, marks between them, as
    a stage's step runs over its layers. The weights are restored at the end, so the steps
    leave the model as it was.
    """
    jobs = [_OptimizerJob(run, optimizer) if run.params else None for run in runners]
    samples: list[list[float]] = [[] for _ in runners]
    present = [(j, into) for j, into in zip(jobs, samples, strict=True) if j is not None]
    gc_was_enabled = gc.isenabled()

    def steps() -> list[float]:
        if settings.timing == "pass":
            for job, _ in present:
                job.restore_grads()
            return time_calls([job.step for job, _ in present], settings.pass_clock())
        times = []
        for job, _ in present:
            job.restore_grads()
            times.append(job.run._timed(job.step)[1])
        return times

    try:
        # One untimed step first: Adam and momentum create their state on the first step.
        steps()
        if settings.device.type == "cuda" and workspace is not None:  # the state exists now
            workspace[:] = [0 if job is None else job.workspace_bytes() for job in jobs]
        for _ in range(settings.warmup):
            steps()
        gc.disable()  # as in _time_runners: no collection inside a timed step
        for _ in settings.rounds_of():
            for (_, into), ms in zip(present, steps(), strict=True):
                into.append(ms)
    finally:
        if gc_was_enabled:
            gc.enable()
        for maybe in jobs:
            if maybe is not None:
                maybe.restore_weights()
    return [_round(spike_free_mean(ms)) if ms else 0.0 for ms in samples]


class _OptimizerJob:
    """The profile's optimizer over one layer's parameters, with that layer's real gradients."""

    def __init__(self, run: _Runner, optimizer: str):
        import torch

        self.run = run
        params = run.params
        _, roots = run.forward()
        grads = None if run.loss is not None else run.grads
        found = torch.autograd.grad(roots, params, grads, allow_unused=True)
        self.grads = [
            g.detach() if g is not None else torch.zeros_like(p)
            for g, p in zip(found, params, strict=True)
        ]
        self.weights = [p.detach().clone() for p in params]
        for p, g in zip(params, self.grads, strict=True):
            p.grad = g.clone()
        self.optimizer = make_optimizer(optimizer, params)

    def restore_grads(self) -> None:
        import torch

        with torch.no_grad():
            for p, g in zip(self.run.params, self.grads, strict=True):
                p.grad.copy_(g)

    def step(self) -> None:
        # What the runtime's STEP runs (planner.runtime.optimizer.PlainStep.step).
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)

    def workspace_bytes(self) -> int:
        """CUDA: the step's peak allocation beyond what was allocated before it (the
        temporaries of a foreach step), the state already created by an earlier step."""
        probe = CudaMemory(self.run.settings.device)
        self.restore_grads()
        before = probe.allocated()
        probe.reset_peak()
        self.step()
        return max(0, probe.peak() - before)

    def restore_weights(self) -> None:
        import torch

        with torch.no_grad():
            for p, w in zip(self.run.params, self.weights, strict=True):
                p.copy_(w)
                p.grad = None


def _measure(
    layer: Any, values: Sequence[Any], settings: _Settings, loss: Callable[[Any], Any] | None
) -> tuple[LayerTiming, Any]:
    from planner.profile.split import tensor_bytes  # lazy: pulls torch

    run = _Runner.for_layer(layer, values, loss, settings)
    outputs, saved, workspace = run.inspect()
    samples = _time_runners([run], settings)[0]
    return _timing(samples, tensor_bytes(outputs), saved, workspace), detach(outputs)


def _time_runners(
    runners: Sequence[_Runner],
    settings: _Settings,
    after_repeat: Callable[[int], None] | None = None,
) -> list[dict[str, list[float]]]:
    """Round robin: repeat r of every layer before repeat r + 1 of any, so a slow spell of the
    machine (another process, a clock change) falls on all layers alike, not on one."""
    for _ in range(settings.warmup):
        for run in runners:
            run.once()
    samples: list[dict[str, list[float]]] = [{name: [] for name in _TIMINGS} for _ in runners]
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection in the middle of a timed interval is pure noise
    try:
        for r in settings.rounds_of():
            for run, into in zip(runners, samples, strict=True):
                for name, ms in zip(_TIMINGS, run.once(), strict=True):
                    into[name].append(ms)
            if after_repeat is not None:
                after_repeat(r)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def _timing(
    samples: dict[str, list[float]], output_bytes: int, saved: int, workspace: int
) -> LayerTiming:
    timing = LayerTiming(
        forward_ms=0.0,
        backward_ms=0.0,
        backward_input_ms=0.0,
        backward_weight_ms=0.0,
        output_bytes=output_bytes,
        saved_bytes=saved,
        workspace_bytes=workspace,
        spread={name: _quartiles(samples[name]) for name in _TIMINGS},
    )
    medians = {name: _round(statistics.median(samples[name])) for name in _TIMINGS}
    means = {name: _round(spike_free_mean(samples[name])) for name in _TIMINGS}
    measured(timing, medians, means)
    return timing


class _Runner:
    """One forward and the three backward variants of a layer, each timed."""

    def __init__(
        self,
        layer: Any,
        leaves: list[Any],
        grad_inputs: list[Any],
        params: list[Any],
        loss: Callable[[Any], Any] | None,
        settings: _Settings,
    ):
        self.layer = layer
        self.leaves = leaves
        self.grad_inputs = grad_inputs
        self.params = params
        self.loss = loss
        self.settings = settings
        self.grads: list[Any] | None = None
        self.split_halves = bool(grad_inputs and params and _split_backward_fns() is not None)
        self.state_ptrs = {_storage_key(t) for t in [*layer.parameters(), *layer.buffers()]}

    @classmethod
    def for_layer(
        cls,
        layer: Any,
        values: Sequence[Any],
        loss: Callable[[Any], Any] | None,
        settings: _Settings,
    ) -> _Runner:
        """A runner on detached copies of ``values`` that require grad where floating."""
        import torch

        leaves = [_leaf(v) for v in values]
        grad_inputs = [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]
        params = [p for p in layer.parameters() if p.requires_grad]
        return cls(layer, leaves, grad_inputs, params, loss, settings)

    def forward(self) -> tuple[Any, list[Any]]:
        """The layer's outputs, and the tensors the backward starts from."""
        import torch

        with self.settings.autocast():
            out = self.layer(*self.leaves)
            loss = self.loss(out) if self.loss is not None else None
        if loss is not None:
            return out, [_not_a_view(loss)]
        # A value passed through unchanged is a leaf: its gradient costs nothing.
        roots = [_not_a_view(t) for t in tensors(out) if t.grad_fn is not None]
        if self.grads is None:
            # Fixed, non-trivial output gradients, as the next stage would send.
            self.grads = [torch.full_like(t, 0.5) for t in roots]
        return out, roots

    def once(self) -> tuple[float, float, float, float]:
        import torch

        (out, roots), fwd = self._timed(self.forward)
        grads = None if self.loss is not None else self.grads
        whole = self._backward_into_grads(roots, self.grad_inputs + self.params, grads)
        if self.split_halves:
            half_in, half_w = self._split_backward(roots, grads)
        else:  # one half is empty: the other is the whole backward
            half_in = self._grad(roots, self.grad_inputs, grads, retain=True)
            half_w = self._backward_into_grads(roots, self.params, grads)
        del out, roots
        if self.settings.device.type == "cuda":
            torch.cuda.synchronize(self.settings.device)
        return fwd, whole, half_in, half_w

    def _split_backward(self, roots: list[Any], grads: Any) -> tuple[float, float]:
        """Zero-bubble halves as torch.distributed.pipelining computes them: the input half
        keeps the gradients the weight half needs, so neither repeats the other's work."""
        fns = _split_backward_fns()
        assert fns is not None
        backward_input, backward_weight = fns
        if not roots:
            return 0.0, 0.0
        (_, groups), half_in = self._timed(
            lambda: backward_input(roots, grads, self.grad_inputs, iter(self.params))
        )
        _, half_w = self._timed(lambda: backward_weight(iter(self.params), groups))
        for t in self.grad_inputs:  # the parameters keep theirs: see _backward_into_grads
            t.grad = None
        return half_in, half_w

    def inspect(self) -> tuple[Any, int, int]:
        """One untimed forward and backward: outputs, saved bytes and CUDA workspace."""
        import torch

        cuda = self.settings.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.settings.device)
            base = torch.cuda.memory_allocated(self.settings.device)
            torch.cuda.reset_peak_memory_stats(self.settings.device)
        storages: dict[Any, int] = {}

        def pack(t: Any) -> Any:
            try:
                key, size = _storage_key(t), t.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError):  # no plain storage (sparse, subclass)
                key, size = ("id", id(t)), t.numel() * t.element_size()
            if key not in self.state_ptrs:
                storages[key] = size
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, roots = self.forward()
        grads = None if self.loss is not None else self.grads
        self._grad(roots, self.grad_inputs + self.params, grads, retain=self.split_halves)
        if self.split_halves:
            try:
                self._split_backward(roots, grads)
            except (KeyError, RuntimeError):
                # torch's split backward cannot handle this layer (a parameter the forward
                # never reaches, say): time the halves with plain autograd.grad instead.
                self.split_halves = False
        for t in (*self.grad_inputs, *self.params):  # the untimed pass leaves no gradients
            t.grad = None
        saved = sum(storages.values())
        workspace = 0
        if cuda:
            torch.cuda.synchronize(self.settings.device)
            peak = torch.cuda.max_memory_allocated(self.settings.device) - base
            workspace = max(0, peak - saved - _tensor_bytes(out))
        return out, saved, workspace

    def _backward_into_grads(self, roots: list[Any], wrt: list[Any], grads: Any) -> float:
        """A backward as the runtime runs it: the parameters' gradients are *added* to their
        ``.grad`` (kept from the previous run, as gradients accumulate over a step's
        microbatches), the inputs' are fresh (a new microbatch each time). For a layer with
        large weights and little compute the addition is a real part of the cost."""
        import torch

        if not roots or not wrt:
            return 0.0
        for t in self.grad_inputs:
            t.grad = None

        def backward() -> None:
            torch.autograd.backward(roots, grads, retain_graph=True, inputs=wrt)

        _, ms = self._timed(backward)
        return ms

    def _grad(self, roots: list[Any], wrt: list[Any], grads: Any, *, retain: bool) -> float:
        import torch

        if not roots or not wrt:
            return 0.0

        def backward() -> Any:
            return torch.autograd.grad(roots, wrt, grads, retain_graph=retain, allow_unused=True)

        _, ms = self._timed(backward)
        return ms

    def _timed(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        import torch

        device = self.settings.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            end.synchronize()
            return result, float(start.elapsed_time(end))
        clock = time.thread_time if self.settings.clock == "thread_time" else time.perf_counter
        t0 = clock()
        result = fn()
        return result, (clock() - t0) * 1000.0


def _prepare(
    user: UserModel, size: int, settings: _Settings, split_at: str | None, capture: str
) -> Any:
    """Build the model, check it accepts its own sample batch, and split it."""
    import torch

    from planner.profile.export_graph import call_for_training  # lazy: pulls torch
    from planner.profile.split import capture_model

    torch.manual_seed(0)
    model = user.build().to(settings.device)
    model.train()
    inputs, targets = user.batch(size)
    inputs, targets = to_device(inputs, settings.device), to_device(targets, settings.device)
    try:
        with settings.autocast():
            outputs = call_for_training(model, inputs)
    except Exception as exc:
        named = inputs.items() if isinstance(inputs, dict) else enumerate(inputs)
        shapes = ", ".join(
            f"{'' if isinstance(k, int) else k + ': '}{tuple(x.shape)} "
            f"{str(x.dtype).replace('torch.', '')}"
            for k, x in named
        )
        raise InputError(
            f"the model rejected sample_batch({size}) inputs [{shapes}]: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
            file=str(user.path),
            field="sample_batch",
        ) from None
    # One full step also warms up the allocator and kernels before anything is timed.
    with settings.autocast():
        loss = user.loss(outputs, targets)
    loss.backward()
    model.zero_grad(set_to_none=True)
    split = capture_model(model, inputs, split_at, capture=capture, source=user.path)
    return split, model


def _split_for(user: UserModel, split: Any, inputs: Any, split_at: str | None) -> Any:
    """The split to measure ``inputs`` with: an exported graph is specialised to its
    microbatch size, so another size is captured again (and must cut the same way)."""
    from planner.profile.split import capture_model  # lazy: pulls torch

    size = _batch_size(inputs)
    if split.batch_size is None or split.batch_size == size:
        return split
    again = capture_model(split.model, inputs, split_at, capture="export", source=user.path)
    if again.names != split.names:
        raise InputError(
            f"the model splits into other layers at microbatch size {size} "
            f"({again.names[:3]}...) than at {split.batch_size} ({split.names[:3]}...)",
            file=str(user.path),
            field="-b",
        )
    return again


def _batch_size(inputs: Any) -> int:
    values = inputs.values() if isinstance(inputs, dict) else inputs
    return next(int(t.shape[0]) for t in values if getattr(t, "dim", lambda: 0)())


def _leaf(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        leaf = value.detach()
        if leaf.is_floating_point() or leaf.is_complex():
            leaf.requires_grad_(True)
        return leaf
    return value


def _not_a_view(t: Any) -> Any:
    # The zero-bubble input half detaches its roots in place, which torch refuses for views;
    # a view output (a transpose, a slice) is rare, and cloning it costs one small copy.
    return t.clone() if t._is_view() else t


def _tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(value))


def _storage_key(t: Any) -> tuple[str, int]:
    # Tensors sharing one storage (views, a value saved by two ops) are counted once; a
    # tensor-parallel shard's DTensor by its local tensor (planner.profile.shard_measure).
    t = getattr(t, "_local_tensor", t)
    return (str(t.device), t.untyped_storage().data_ptr())


def check_timing(name: str | None, device_type: str = "cpu") -> str:
    """A ``--timing`` value (None: ``pass`` on CUDA, ``layer`` on CPU).

    Example::

        check_timing(None, "cuda")   # 'pass'
    """
    if name is None:
        return "pass" if device_type == "cuda" else "layer"
    if name not in TIMING_METHODS:
        raise InputError(
            f"expected one of {', '.join(TIMING_METHODS)}, got {name!r}", field="--timing"
        )
    return name


def check_device(name: str) -> str:
    """Validate a ``--device`` value; returns it as torch names it (``cuda`` -> ``cuda:0``).

    Example::

        check_device("cpu")   # 'cpu'
    """
    return str(_device(name))


def _device(name: str) -> Any:
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise InputError(f"expected cpu or cuda, got {name!r}", field="--device") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError("CUDA is not available on this machine", field="--device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise InputError(f"expected cpu or cuda, got {name!r}", field="--device")
    return device


def _positive(value: int, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"expected a positive integer, got {value!r}", field=flag)
    return check_int(value, field=flag, high=MAX_THREADS if flag == "--threads" else MAX_REPEATS)


def check_min_time(value: float) -> float:
    """``--min-time``: seconds, 0 to :data:`~planner.limits.MAX_MIN_TIME_S`.

    Example::

        check_min_time(2.0)   # 2.0
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (0 <= value <= MAX_MIN_TIME_S)
    ):
        raise InputError(
            f"expected seconds from 0 to {MAX_MIN_TIME_S:g}, got {value!r}", field="--min-time"
        )
    return float(value)


def _count(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"expected a non-negative integer, got {value!r}", field="--warmup")
    return check_int(value, field="--warmup", low=0, high=MAX_REPEATS)


def _quartiles(samples: list[float]) -> list[float]:
    if len(samples) < 2:
        return [_round(samples[0])] * 2
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return [_round(q1), _round(q3)]


def _round(ms: float) -> float:
    return round(ms, 4)


def _dtype(model: Any) -> str:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).replace("torch.", "")
    return "float32"


def _meta(settings: _Settings, split: Any, seconds: float) -> dict[str, Any]:
    """The free facts of a measured profile (its settings are ``Profile.settings``)."""
    import torch

    host: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model() or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    if hasattr(os, "getloadavg"):  # other work on the machine is the main source of noise
        host["load_average_1min"] = round(os.getloadavg()[0], 2)
    meta: dict[str, Any] = {
        "tool": "pipeplan profile",
        "measured_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "repeat": settings.repeat,
        "min_time_s": settings.min_time_s,
        "rounds": settings.rounds,
        "warmup": settings.warmup,
        "split_points": list(split.split_points),
        "wall_seconds": round(seconds, 2),
        "host": host,
        "allocator": keep_freed_memory(),
    }
    if settings.device.type != "cpu":
        meta["gpu"] = torch.cuda.get_device_name(settings.device)
    return meta


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
