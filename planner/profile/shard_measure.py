"""Measured tensor-parallel shards: each layer's rank-0 shard timed in one process.

:func:`profile_with_shards` is ``pipeplan profile --tensor-parallel``: the plain profile
(:func:`~planner.profile.measure.profile_model`), then for every degree and setting one
rank's shard of the model (:func:`~planner.profile.tensor_parallel.build_shard` on torch's
fake process group, :mod:`planner.profile.fake_group`) measured with the plain profile's
own runners, clocks and rules: forward, backward and its two halves, saved bytes (the
shard's local tensors), the bytes crossing the next cut, the optimizer step over the
shard's parameters. The collectives the shard issues cost nothing on the fake group (its
times are its compute alone, as :class:`~planner.profile.sharding.ShardTiming` wants) and
are recorded by :class:`~planner.profile.collective_log.CollectiveLog` in one untimed
forward and backward per layer. Every setting is checked before the plain profile starts.

Example::

    profile = profile_with_shards("examples/gpt.py", [1, 2],
                                  tensor_parallel=parse_tensor_parallel("2,4"))
    profile.measurements[0].layers[1].sharded["tp2"].collectives
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from planner.profile.collective_log import CollectiveLog, settled
from planner.profile.fake_group import fake_group
from planner.profile.loader import UserModel, load_model_file
from planner.profile.measure import (
    ProgressFn,
    _device,
    _measure_in_passes,
    _PreparedSize,
    _Runner,
    _Settings,
    _storage_key,
    _time_optimizer,
    _time_runners,
    _timing,
    check_timing,
    profile_model,
)
from planner.profile.pass_timing import ModelPasses
from planner.profile.schema import LayerTiming, Profile
from planner.profile.sharding import Collective, ShardTiming, shard_key
from planner.profile.tensor_parallel import (
    Captured,
    Shard,
    TensorParallelRequest,
    capture_for_plan,
    check_readable,
    check_request,
    shard_captured,
    shard_params,
)
from planner.tensors import detach, tensors, to_device

__all__ = ["measure_shards", "profile_with_shards"]


def profile_with_shards(
    path: str | os.PathLike[str],
    microbatch_sizes: Sequence[int] | str,
    *,
    tensor_parallel: TensorParallelRequest | None,
    progress: ProgressFn | None = None,
    **options: Any,
) -> Profile:
    """:func:`~planner.profile.measure.profile_model` with ``options``, and the shards of
    ``tensor_parallel`` (none: the plain profile alone), checked before anything is
    measured.

    Example::

        profile_with_shards("examples/gpt.py", "1", tensor_parallel=None, repeat=1)
    """
    if tensor_parallel is None:
        return profile_model(path, microbatch_sizes, progress=progress, **options)
    import torch

    user = load_model_file(path)
    torch.manual_seed(0)
    source = check_request(user, user.build(), tensor_parallel, options.get("split_at"))
    profile = profile_model(path, microbatch_sizes, progress=progress, **options)
    measure_shards(user, profile, tensor_parallel, progress=progress, **options)
    profile.tensor_parallel = tensor_parallel.info(source)
    check_readable(profile, user)
    return profile


def measure_shards(
    user: UserModel,
    profile: Profile,
    request: TensorParallelRequest,
    *,
    device: str = "cpu",
    repeat: int = 5,
    warmup: int = 2,
    threads: int = 1,
    optimizer: str = "adam",
    split_at: str | None = None,
    precision: str = "fp32",
    timing: str | None = None,
    progress: ProgressFn | None = None,
    min_time_s: float = 0.0,
    **_: Any,
) -> None:
    """Fill ``profile``'s ``sharded`` entries for every setting of ``request`` (module
    docstring), measured as ``profile`` was (the same device, repeats and time, threads,
    precision, timing method and capture).

    Example::

        measure_shards(user, profile, TensorParallelRequest((2,)), repeat=3)
    """
    import torch

    torch_device = _device(device)
    settings = _Settings(
        torch_device,
        repeat,
        warmup,
        threads,
        precision,
        check_timing(timing, torch_device.type),
        min_time_s=min_time_s,
    )
    old_threads = torch.get_num_threads()
    if torch_device.type == "cpu":
        torch.set_num_threads(threads)
    try:
        todo = request.settings()
        captured: dict[bool, Captured] = {}
        for done, (degree, sp) in enumerate(todo):
            if progress is not None:
                progress(done, len(todo), f"shards {shard_key(degree, sequence_parallel=sp)}")
            if sp not in captured:  # one capture per plan serves every degree
                captured[sp] = _capture(user, profile, sp, settings, split_at)
            with fake_group(degree, torch_device.type) as mesh:
                shard = shard_captured(captured[sp], mesh, degree, copy=True)
                _measure_setting(user, profile, shard, degree, sp, settings, optimizer)
    finally:
        torch.set_num_threads(old_threads)


def _capture(
    user: UserModel,
    profile: Profile,
    sequence_parallel: bool,
    settings: _Settings,
    split_at: str | None,
) -> Captured:
    """The model built as for the plain profile and captured for its plan at every size."""
    import torch

    torch.manual_seed(0)
    model = user.build().to(settings.device)
    model.train()
    inputs = [to_device(user.batch(size)[0], settings.device) for size in profile.microbatch_sizes]
    return capture_for_plan(
        user,
        model,
        inputs,
        sequence_parallel=sequence_parallel,
        split_at=split_at,
        capture=profile.settings.capture_method,
        names=[layer.name for layer in profile.layers],
    )


def _measure_setting(
    user: UserModel,
    profile: Profile,
    shard: Shard,
    degree: int,
    sequence_parallel: bool,
    settings: _Settings,
    optimizer: str,
) -> None:
    batches = []
    for size in profile.microbatch_sizes:
        inputs, targets = user.batch(size)
        batches.append((to_device(inputs, settings.device), to_device(targets, settings.device)))
    prepared: list[_PreparedSize] = []
    logs: list[list[tuple[Collective, ...]]] = []
    for size, split, (inputs, targets) in zip(
        profile.microbatch_sizes, shard.splits, batches, strict=True
    ):
        ready, found = _prepare_size(user, split, size, inputs, targets, settings)
        prepared.append(ready)
        logs.append(found)
    if settings.timing == "pass":
        timings = [m.layers for m in _measure_in_passes(prepared, settings)]
    else:
        everything = [run for size in prepared for run in size.runners]
        samples = iter(_time_runners(everything, settings))
        timings = [[_timing(next(samples), *facts) for facts in size.facts] for size in prepared]
    key = shard_key(degree, sequence_parallel=sequence_parallel)
    for measurement, layer_timings, layer_logs in zip(
        profile.measurements, timings, logs, strict=True
    ):
        for entry, timing, issued in zip(
            measurement.layers, layer_timings, layer_logs, strict=True
        ):
            entry.sharded[key] = _shard_timing(timing, issued)
    if not sequence_parallel:  # the parameters do not depend on it
        steps = _time_optimizer(prepared[0].runners, optimizer, settings)
        for layer, params, ms in zip(
            profile.layers, shard_params(shard.splits[0], optimizer), steps, strict=True
        ):
            layer.sharded[shard_key(degree)] = replace(params, optimizer_ms=ms)


def _prepare_size(
    user: UserModel, split: Any, size: int, inputs: Any, targets: Any, settings: _Settings
) -> tuple[_PreparedSize, list[tuple[Collective, ...]]]:
    """As the plain profile prepares a size, with each layer's saved bytes and collectives
    from :func:`_inspect` (the plain runner counts a DTensor's global size)."""
    from planner.profile.split import tensor_bytes

    values: Any = split.flat_inputs(inputs)
    passes = ModelPasses(
        split.layers,
        values,
        lambda out: user.loss(out, targets),
        clock=settings.pass_clock(),
        autocast=settings.autocast,
    )
    runners, facts, logs = [], [], []
    for k, layer in enumerate(split.layers):
        last = k == split.num_layers - 1
        loss = (lambda out: user.loss(out, targets)) if last else None
        run = _Runner.for_layer(layer, values, loss, settings)
        outputs, _, workspace = run.inspect()
        saved, collectives = _inspect(run)
        _check_local(outputs, user, split.names[k])
        facts.append((tensor_bytes(outputs), saved, workspace))
        logs.append(tuple(collectives))
        values = settled(detach(outputs))
        runners.append(run)
    for p in passes.all_params:
        p.grad = None
    return _PreparedSize(size, tensor_bytes(inputs), runners, facts, passes), logs


def _inspect(run: _Runner) -> tuple[int, list[Collective]]:
    """One untimed forward and whole backward of a shard: the distinct local storages
    autograd saves (parameters and buffers excluded), and the collectives of each phase."""
    import torch

    state = {_storage_key(_local(t)) for t in [*run.layer.parameters(), *run.layer.buffers()]}
    storages: dict[Any, int] = {}

    def pack(t: Any) -> Any:
        local = _local(t)
        try:
            key, size = _storage_key(local), local.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # no plain storage
            key, size = ("id", id(local)), local.numel() * local.element_size()
        if key not in state:
            storages[key] = size
        return t

    log = CollectiveLog()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), log:
        _, roots = run.forward()
    wrt = run.grad_inputs + run.params
    if roots and wrt:
        log.phase = "backward"
        grads = None if run.loss is not None else run.grads
        with log:
            torch.autograd.backward(roots, grads, inputs=wrt)
    for t in wrt:
        t.grad = None
    return sum(storages.values()), log.collectives


def _local(t: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def _check_local(outputs: Any, user: UserModel, layer: str) -> None:
    from torch.distributed.tensor import DTensor

    from planner.errors import InputError

    if any(isinstance(t, DTensor) for t in tensors(outputs)):
        raise InputError(
            f"layer {layer}: its tensor-parallel shard hands a DTensor to the next layer; "
            "give the style that makes it use_local_output=True",
            file=str(user.path),
            field="tp_plan",
        )


def _shard_timing(timing: LayerTiming, collectives: tuple[Collective, ...]) -> ShardTiming:
    shard = ShardTiming(
        forward_ms=timing.forward_ms,
        backward_ms=timing.backward_ms,
        backward_input_ms=timing.backward_input_ms,
        backward_weight_ms=timing.backward_weight_ms,
        output_bytes=timing.output_bytes,
        saved_bytes=timing.saved_bytes,
        workspace_bytes=timing.workspace_bytes,
        collectives=collectives,
        spread=dict(timing.spread),
    )
    shard.median = dict(timing.median)
    return shard
