"""The cost model: time and memory of one pipeline stage, read off the profile.

A stage is the inclusive layer range ``first..last`` of a profile. Everything here is a
plain sum over the profiled layers, so the solver can call it in its inner loops and the
simulator and the solver can never disagree about what a stage costs.

Memory of one device of a stage (plain data parallelism: every replica holds a full copy)::

    static      = weights + gradients + optimizer state              (stage_static_bytes)
                  (a tied parameter counts on every stage that uses it: each holds a copy)
    versions    = (weight_versions - 1) * weights                    (2bw keeps two)
    activations = in_flight * stage_activation_bytes + workspace
    recompute   : in_flight * stage input + one microbatch's full activations, rebuilt
                  during its backward (the whole stage under one checkpoint), or
                  in_flight * each layer's input + the largest layer's activations (each
                  layer under its own: recompute_layers)
    peak        = static + versions + max(activations, step workspace)

``workspace`` is the largest transient of one layer's forward or backward beyond what is
held (``workspace_bytes``), the *step workspace* the temporaries of the stage's optimizer
step (the layers' ``optimizer_workspace_bytes``: a foreach step makes them for all its
tensors at once). Both are measured on CUDA only (0 in CPU profiles, which are therefore
unchanged by them). After a flush no microbatch is in flight when the step runs, hence the
maximum; without a flush (2bw) the step runs beside stashed activations and adds to them.

Example::

    f, b = stage_compute_ms(profile, 0, 3, 4)
    peak = stage_memory_bytes(profile, 0, 3, 4, in_flight=4)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import InputError
from planner.optimizers import STATE_FACTORS
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.profile.sharding import (
    Collective,
    ShardParams,
    ShardTiming,
    TensorParallelInfo,
    shard_key,
)
from planner.profile.tied import TiedParameter

__all__ = [
    "StageTimes",
    "boundary_bytes",
    "stage_activation_bytes",
    "stage_rebuilt_bytes",
    "stage_compute_ms",
    "stage_input_bytes",
    "stage_memory_bytes",
    "stage_param_bytes",
    "stage_static_bytes",
    "stage_step_ms",
    "stage_step_workspace_bytes",
    "stage_tied_parameters",
    "stage_times",
    "stage_workspace_bytes",
    "synthetic_profile",
    "synthetic_tensor_parallel",
]


@dataclass(frozen=True)
class StageTimes:
    """Per-microbatch compute times of one stage on one device, in milliseconds.

    ``backward_ms`` is the whole backward as one autograd call; ``input_grad_ms`` and
    ``weight_grad_ms`` are the halves zero-bubble schedules run as two separate actions,
    as profiled (their sum may exceed ``backward_ms``: the split walks the graph twice).
    The first stage and recompute stages run the whole backward in ``I``, so their
    ``weight_grad_ms`` is 0. With recompute, the re-run forward is part of ``backward_ms``
    and of ``input_grad_ms``.
    """

    forward_ms: float
    backward_ms: float
    input_grad_ms: float
    weight_grad_ms: float


def _check_range(profile: Profile, first: int, last: int) -> None:
    if not 0 <= first <= last < profile.num_layers:
        raise InputError(
            f"layer range [{first}, {last}] is not inside 0..{profile.num_layers - 1}",
            field="stages.layers",
        )


def stage_times(
    profile: Profile,
    first: int,
    last: int,
    microbatch_size: int,
    *,
    speed: float = 1.0,
    recompute: bool = False,
) -> StageTimes:
    """Forward, backward and the backward's two halves of layers ``first..last``.

    Profiled times are divided by the device ``speed``. When a profile's split halves are
    missing (both zero) the weight half is taken as zero and the input half as the whole
    backward, so a B/W split schedule never becomes cheaper than it can be. The first
    stage (``first == 0``), a recompute stage and a stage without weights also get the
    whole backward as the input half and a zero weight half, because that is what the
    runtime's zero-bubble ``I``/``W`` actions do for them.

    Example::

        t = stage_times(profile, 0, 3, 4, speed=2.0)
        t.forward_ms, t.input_grad_ms, t.weight_grad_ms
    """
    _check_range(profile, first, last)
    if speed <= 0:
        raise InputError(f"expected a positive device speed, got {speed}", field="speed")
    layers = profile.measurement(microbatch_size).layers[first : last + 1]
    fwd = sum(t.forward_ms for t in layers)
    bwd = sum(t.backward_ms for t in layers)
    bi = sum(t.backward_input_ms for t in layers)
    bw = sum(t.backward_weight_ms for t in layers)
    if bi + bw <= 0.0:
        bi, bw = bwd, 0.0
    elif bwd <= 0:
        bwd = bi + bw
    # The halves stay as profiled: torch's split backward (the runtime's zero-bubble I and
    # W) walks the graph twice and costs more than the whole backward on small layers
    # (1.06-1.4x on examples/gpt.py and hf_llama.py), and that sum is what the runtime pays.
    params = sum(layer.param_bytes for layer in profile.layers[first : last + 1])
    if first == 0 or recompute or params == 0:
        # What the runtime does (planner/runtime/stage.py, backward_input): the first stage
        # needs no input gradients, a recompute stage's checkpointed graph cannot be split,
        # and a stage without weights has no W; each runs its whole backward as I.
        bi, bw = bwd, 0.0
    extra = fwd if recompute else 0.0
    return StageTimes(
        forward_ms=fwd / speed,
        backward_ms=(bwd + extra) / speed,
        input_grad_ms=(bi + extra) / speed,
        weight_grad_ms=bw / speed,
    )


def stage_compute_ms(
    profile: Profile,
    first: int,
    last: int,
    microbatch_size: int,
    *,
    speed: float = 1.0,
    recompute: bool = False,
) -> tuple[float, float]:
    """``(forward_ms, backward_ms)`` of one microbatch on layers ``first..last``.

    Recompute adds one forward to the backward.

    Example::

        f, b = stage_compute_ms(profile, 0, 3, 4, speed=1.0, recompute=True)
    """
    t = stage_times(profile, first, last, microbatch_size, speed=speed, recompute=recompute)
    return t.forward_ms, t.backward_ms


def stage_step_ms(profile: Profile, first: int, last: int, *, speed: float = 1.0) -> float:
    """One optimizer step over the weights of layers ``first..last`` on a device of ``speed``.

    The sum of the layers' profiled ``optimizer_ms`` (0 for profiles that did not measure
    it, e.g. imported ones); it does not depend on the microbatch size.

    Example::

        stage_step_ms(profile, 0, 3, speed=2.0)
    """
    _check_range(profile, first, last)
    if speed <= 0:
        raise InputError(f"expected a positive device speed, got {speed}", field="speed")
    return sum(layer.optimizer_ms for layer in profile.layers[first : last + 1]) / speed


def stage_tied_parameters(profile: Profile, first: int, last: int) -> list[TiedParameter]:
    """The profile's tied parameters that layers ``first..last`` use (each stage holding one
    keeps its own copy and exchanges its gradient at STEP).

    Example::

        [t.name for t in stage_tied_parameters(profile, 4, 5)]   # ['embed.weight']
    """
    _check_range(profile, first, last)
    return [t for t in profile.tied_parameters if t.held_by(first, last)]


def _copied_ties(profile: Profile, first: int, last: int) -> list[TiedParameter]:
    # Held here, but counted in the param_bytes of an earlier layer (its first user).
    return [t for t in stage_tied_parameters(profile, first, last) if t.first_layer < first]


def stage_param_bytes(profile: Profile, first: int, last: int) -> int:
    """Bytes of the weights of layers ``first..last`` (one version), tied copies included.

    Example::

        stage_param_bytes(profile, 0, 3)
    """
    _check_range(profile, first, last)
    own = sum(layer.param_bytes for layer in profile.layers[first : last + 1])
    if not profile.tied_parameters:
        return own
    return own + sum(t.param_bytes for t in _copied_ties(profile, first, last))


def _tied_static_bytes(profile: Profile, first: int, last: int) -> int:
    """Weights, gradients and optimizer state of the tied copies a stage holds."""
    copied = sum(t.param_bytes for t in _copied_ties(profile, first, last))
    if not copied:
        return 0
    ratio = STATE_FACTORS.get(profile.optimizer)
    if ratio is None:
        raise InputError(
            f"cannot size the optimizer state of tied parameters for optimizer "
            f"{profile.optimizer!r}; expected one of {', '.join(STATE_FACTORS)}",
            field="optimizer",
        )
    return copied * (2 + ratio)


def stage_static_bytes(profile: Profile, first: int, last: int, *, replicas: int = 1) -> int:
    """Weights + gradients + optimizer state held by each device of the stage.

    Replicas are plain data parallelism (each holds everything), so ``replicas`` does not
    shrink the total; it is accepted so callers need not special-case replicated stages.

    Example::

        stage_static_bytes(profile, 0, 3, replicas=2)
    """
    _check_range(profile, first, last)
    if replicas < 1:
        raise InputError(f"expected at least one replica, got {replicas}", field="devices")
    layers = profile.layers[first : last + 1]
    own = sum(
        layer.param_bytes + layer.gradient_bytes + layer.optimizer_state_bytes for layer in layers
    )
    if not profile.tied_parameters:
        return own
    return own + _tied_static_bytes(profile, first, last)


def stage_input_bytes(profile: Profile, first: int, microbatch_size: int) -> int:
    """Bytes that enter a stage starting at layer ``first`` per microbatch.

    Example::

        stage_input_bytes(profile, 4, 8)   # = boundary_bytes(profile, 3, 8)
    """
    if first == 0:
        return profile.measurement(microbatch_size).input_bytes
    return boundary_bytes(profile, first - 1, microbatch_size)


def stage_activation_bytes(
    profile: Profile,
    first: int,
    last: int,
    microbatch_size: int,
    *,
    recompute: bool = False,
    each_layer: bool = False,
) -> int:
    """Activation memory one in-flight microbatch keeps on the stage until its backward.

    Without recompute that is the layers' ``saved_bytes``; with recompute only the stage's
    input is stashed (the rest is rebuilt by re-running the forward), or with
    ``each_layer`` (every layer under its own checkpoint) every layer's input.

    Example::

        stage_activation_bytes(profile, 0, 3, 4, recompute=True)
    """
    _check_range(profile, first, last)
    if recompute:
        stash = stage_input_bytes(profile, first, microbatch_size)
        if each_layer:
            stash += sum(profile.cut_bytes(microbatch_size, i) for i in range(first, last))
        return stash
    layers = profile.measurement(microbatch_size).layers[first : last + 1]
    return sum(t.saved_bytes for t in layers)


def stage_rebuilt_bytes(
    profile: Profile, first: int, last: int, microbatch_size: int, *, each_layer: bool = False
) -> int:
    """What a recompute stage rebuilds at once in a backward: one microbatch's activations
    of every layer (one checkpoint for the stage), or with ``each_layer`` the largest
    layer's (each layer is rebuilt right before its own backward, then freed).

    Example::

        stage_rebuilt_bytes(profile, 0, 3, 4, each_layer=True)   # the largest saved_bytes
    """
    _check_range(profile, first, last)
    saved = [t.saved_bytes for t in profile.measurement(microbatch_size).layers[first : last + 1]]
    return max(saved) if each_layer else sum(saved)


def stage_workspace_bytes(profile: Profile, first: int, last: int, microbatch_size: int) -> int:
    """The largest transient memory of one layer's forward or backward in ``first..last``
    beyond what is held (CUDA profiles; 0 in CPU ones).

    Example::

        stage_workspace_bytes(profile, 0, 3, 4)
    """
    _check_range(profile, first, last)
    layers = profile.measurement(microbatch_size).layers[first : last + 1]
    return max((t.workspace_bytes for t in layers), default=0)


def stage_step_workspace_bytes(profile: Profile, first: int, last: int) -> int:
    """Temporaries of the optimizer step over layers ``first..last`` (a foreach step makes
    them for all its tensors at once, so they add up; CUDA profiles, 0 in CPU ones).

    Example::

        stage_step_workspace_bytes(profile, 0, 3)
    """
    _check_range(profile, first, last)
    return sum(layer.optimizer_workspace_bytes for layer in profile.layers[first : last + 1])


def stage_memory_bytes(
    profile: Profile,
    first: int,
    last: int,
    microbatch_size: int,
    in_flight: int,
    *,
    recompute: bool = False,
    weight_versions: int = 1,
    recompute_layers: bool = False,
) -> int:
    """Peak memory of one device of the stage with ``in_flight`` microbatches stashed.

    ``weight_versions`` > 1 adds extra copies of the weights (2 for PipeDream-2BW). With
    recompute, one microbatch's full activations exist while its backward runs (with
    ``recompute_layers``, the largest layer's: :func:`stage_rebuilt_bytes`). The
    optimizer step's temporaries count where they exceed the activations (after a flush),
    or on top of them (``weight_versions`` > 1: no flush).

    Example::

        stage_memory_bytes(profile, 0, 3, 4, in_flight=4, weight_versions=2)
    """
    if in_flight < 0 or weight_versions < 1:
        raise InputError(
            f"expected in_flight >= 0 and weight_versions >= 1, got {in_flight}, {weight_versions}",
            field="in_flight",
        )
    total = stage_static_bytes(profile, first, last)
    total += (weight_versions - 1) * stage_param_bytes(profile, first, last)
    held = in_flight * stage_activation_bytes(
        profile, first, last, microbatch_size, recompute=recompute, each_layer=recompute_layers
    )
    if recompute and in_flight > 0:
        held += stage_rebuilt_bytes(
            profile, first, last, microbatch_size, each_layer=recompute_layers
        )
    workspace = stage_workspace_bytes(profile, first, last, microbatch_size)
    step = stage_step_workspace_bytes(profile, first, last)
    if weight_versions > 1:
        return total + held + max(workspace, step)
    return total + max(held + workspace, step)


def boundary_bytes(profile: Profile, last: int, microbatch_size: int) -> int:
    """Bytes sent forward across the cut after layer ``last`` per microbatch.

    The gradient sent back across the same cut has the same size.

    Example::

        boundary_bytes(profile, 3, 4)
    """
    if not 0 <= last < profile.num_layers:
        raise InputError(
            f"cut after layer {last} is not inside 0..{profile.num_layers - 1}",
            field="stages.layers",
        )
    return profile.cut_bytes(microbatch_size, last)


def synthetic_profile(
    num_layers: int,
    *,
    forward_ms: float = 1.0,
    backward_input_ms: float = 1.0,
    backward_weight_ms: float = 1.0,
    param_bytes: int = 1000,
    optimizer_state_bytes: int = 2000,
    output_bytes: int = 100,
    saved_bytes: int = 10,
    input_bytes: int = 100,
    microbatch_size: int = 1,
    optimizer_ms: float = 0.0,
) -> Profile:
    """A profile of identical layers with exact numbers, for tests and benchmarks.

    Example::

        profile = synthetic_profile(8, forward_ms=1.0)   # backward 2.0 = 1.0 + 1.0
    """
    layers = [
        Layer(f"layer{i}", param_bytes // 4, param_bytes, optimizer_state_bytes, optimizer_ms)
        for i in range(num_layers)
    ]
    timings = [
        LayerTiming(
            forward_ms,
            backward_input_ms + backward_weight_ms,
            backward_input_ms,
            backward_weight_ms,
            output_bytes,
            saved_bytes,
        )
        for _ in range(num_layers)
    ]
    return Profile(
        "synthetic",
        layers,
        [Measurement(microbatch_size, input_bytes, timings)],
        meta={"origin": "synthetic"},
    )


def synthetic_tensor_parallel(
    profile: Profile,
    degrees: Sequence[int] = (2, 4),
    *,
    sequence_parallel: bool = True,
    collective_bytes: int | None = None,
    replicated: Sequence[int] = (),
) -> Profile:
    """``profile`` with Megatron-style tensor-parallel entries, exact numbers for tests and
    benchmarks (the format of :mod:`planner.profile.sharding`).

    Per degree ``t`` every layer is a transformer block split as Megatron-LM splits it:
    one rank's times, parameters, optimizer state and step, and saved activations are the
    layer's ``/ t``; per pass (forward, and the backward's input half) it issues two
    all-reduces of ``collective_bytes`` (default: the layer's output bytes, ``b * s * h``);
    with sequence parallelism (``tp{t}-sp``) two all-gather + reduce-scatter pairs of the
    same tensors instead, and it sends ``1 / t`` of its output at a cut. Layers in
    ``replicated`` are left whole by the plan: full parameters and times without a
    collective (with sequence parallelism on ``1 / t`` of the sequence: times and
    activations ``/ t``).

    Example::

        profile = synthetic_tensor_parallel(synthetic_profile(4, output_bytes=4096), (2,))
        profile.measurements[0].layers[0].sharded["tp2"].collective_bytes("forward")  # 8192
    """
    degrees = tuple(sorted(set(degrees)))
    keep = set(replicated)
    layers = [
        dataclasses.replace(
            layer, sharded={shard_key(t): _shard_params(layer, t, i in keep) for t in degrees}
        )
        for i, layer in enumerate(profile.layers)
    ]
    measurements = []
    for m in profile.measurements:
        timings = []
        for i, timing in enumerate(m.layers):
            entries = {}
            for t in degrees:
                for sp in (False, True) if sequence_parallel else (False,):
                    entries[shard_key(t, sequence_parallel=sp)] = _shard_timing(
                        timing, t, sp, i in keep, collective_bytes
                    )
            whole = dataclasses.replace(timing, sharded=entries)
            whole.median = dict(timing.median)  # not an init field: replace() drops it
            timings.append(whole)
        measurements.append(dataclasses.replace(m, layers=timings))
    return dataclasses.replace(
        profile,
        layers=layers,
        measurements=measurements,
        tensor_parallel=TensorParallelInfo(degrees, sequence_parallel, "synthetic"),
    )


def _shard_params(layer: Layer, t: int, whole: bool) -> ShardParams:
    """One rank's parameters: the layer's ``/ t`` (whole where the plan leaves it)."""
    d = 1 if whole else t
    return ShardParams(
        layer.param_count // d,
        layer.param_bytes // d,
        layer.optimizer_state_bytes // d,
        layer.optimizer_ms / d,
    )


def _shard_timing(
    timing: LayerTiming, t: int, sp: bool, whole: bool, collective_bytes: int | None
) -> ShardTiming:
    """One rank's timing (see :func:`synthetic_tensor_parallel`)."""
    d = t if (sp or not whole) else 1
    nbytes = timing.output_bytes if collective_bytes is None else collective_bytes
    ops = ("all_gather", "reduce_scatter") * 2 if sp else ("all_reduce",) * 2
    collectives = (
        ()
        if whole
        else tuple(Collective(op, nbytes, phase) for phase in ("forward", "backward") for op in ops)
    )
    return ShardTiming(
        timing.forward_ms / d,
        timing.backward_ms / d,
        timing.backward_input_ms / d,
        timing.backward_weight_ms / d,
        output_bytes=timing.output_bytes // t if sp else timing.output_bytes,
        saved_bytes=timing.saved_bytes // d,
        workspace_bytes=timing.workspace_bytes // d,
        collectives=collectives,
    )
