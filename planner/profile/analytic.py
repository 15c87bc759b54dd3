"""Analytic profiles: a model's per-layer costs from its definition and a GPU's datasheet.

``pipeplan profile model.py --analytic --gpu h100-sxm`` writes a profile of the same schema
as a measured one, without running the model on any device:

1. ``build_model()`` on the meta device, its tensors then fake CPU tensors
   (:mod:`planner.profile.fake_model`): no weight is allocated, a 405B model builds in
   under a second;
2. captured and split by the measured profiler's own code (:func:`capture_model`: the same
   layers, names, split points and carried values; an exported graph once per microbatch
   size, as there);
3. every layer at every microbatch size counted (:mod:`planner.profile.layer_count`): FLOPs,
   bytes and a roofline time per aten operation (:mod:`planner.profile.roofline`) for the
   forward, the whole backward and its input and weight halves; the bytes autograd saves;
   the bytes crossing the next cut. Twin layers (:mod:`planner.profile.twins`: the repeated
   blocks) are counted once;
4. parameter and optimizer-state bytes exact (the parameters' shapes); the optimizer step as
   the memory traffic of a fused step (:data:`STEP_TRAFFIC`).

The profile holds, per layer and microbatch size, ``forward_flops``,
``backward_input_flops`` and ``backward_weight_flops`` beside the times, and its
``settings.analytic`` (:class:`~planner.profile.settings.AnalyticInfo`, the file's
``meta.analytic``) names the GPU (with its numbers and their source) and the efficiencies.

Example::

    profile = analytic_profile("examples/gpt.py", [1, 2, 4], gpu="h100-sxm", precision="bf16")
    profile.measurement(4).layers[1].forward_flops
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from planner.errors import InputError
from planner.gpus import Efficiency, GpuSpec, gpu_spec, parse_efficiency
from planner.optimizers import optimizer_state_bytes
from planner.precision import autocast as precision_autocast
from planner.precision import check_precision
from planner.profile.loader import UserModel, load_model_file
from planner.profile.measure import ProgressFn, parse_microbatch_sizes
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.profile.settings import AnalyticInfo, ProfileSettings
from planner.profile.tensor_parallel import (
    TensorParallelRequest,
    check_readable,
    check_request,
)

__all__ = [
    "STEP_TRAFFIC",
    "AnalyticSettings",
    "analytic_profile",
    "check_analytic_settings",
]

STEP_TRAFFIC: dict[str, int] = {"sgd": 4, "momentum": 6, "adam": 8, "adamw": 8}
"""Bytes one optimizer step moves per byte of parameters, as one fused kernel does it: Adam
reads the parameter, its gradient and two moments and writes the parameter and the moments
(7), then ``zero_grad(set_to_none=False)`` writes the gradient (1); momentum 5 + 1; SGD
3 + 1. torch's own (foreach) step makes several passes, so a real step can take longer."""


@dataclass(frozen=True)
class AnalyticSettings:
    """Checked settings of an analytic profile.

    Example::

        check_analytic_settings("h100-sxm", "matmul=0.6", "bf16", "adam", "auto")
    """

    gpu: GpuSpec
    efficiency: Efficiency
    precision: str
    optimizer: str
    capture: str
    threads: int = 1
    twins: bool = True  # count each distinct layer once (module docstring)
    dynamic_batch: bool = True  # one export for every microbatch size (_Counter.capture_once)


def check_analytic_settings(
    gpu: str | GpuSpec,
    efficiency: str | Efficiency | None = None,
    precision: str = "fp32",
    optimizer: str = "adam",
    capture: str = "auto",
    threads: int = 1,
    *,
    twins: bool = True,
    dynamic_batch: bool = True,
) -> AnalyticSettings:
    """Every argument checked before any work: one InputError naming the flag at fault.

    Example::

        settings = check_analytic_settings("h100-sxm", "memory=0.9", "bf16")
    """
    from planner.profile.split import CAPTURES  # lazy: pulls torch

    spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    if isinstance(efficiency, Efficiency):
        eff = efficiency
    else:
        eff = parse_efficiency(efficiency, spec.efficiency)
    optimizer_state_bytes(0, optimizer)  # validates the name
    if capture not in CAPTURES:
        raise InputError(
            f"expected one of {', '.join(CAPTURES)}, got {capture!r}", field="--capture"
        )
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InputError(f"expected a positive integer, got {threads!r}", field="--threads")
    return AnalyticSettings(
        spec, eff, check_precision(precision), optimizer, capture, threads, twins, dynamic_batch
    )


def analytic_profile(
    path: str | os.PathLike[str],
    microbatch_sizes: Sequence[int] | str,
    *,
    gpu: str | GpuSpec = "h100-sxm",
    efficiency: str | Efficiency | None = None,
    precision: str = "fp32",
    optimizer: str = "adam",
    split_at: str | None = None,
    capture: str = "auto",
    threads: int = 1,
    twins: bool = True,
    dynamic_batch: bool = True,
    tensor_parallel: TensorParallelRequest | None = None,
    progress: ProgressFn | None = None,
) -> Profile:
    """The analytic profile of the model.py at ``path`` (module docstring).

    ``gpu``: a catalog name, a YAML file with an entry of one's own, or a :class:`GpuSpec`;
    ``efficiency``: ``"matmul=0.6,memory=0.8"`` over the GPU's defaults; ``threads``: for
    the ``cpu`` entry's measured peaks; ``twins=False`` counts every layer on its own;
    ``dynamic_batch=False`` exports the model once per microbatch size (as the measured
    profiler does) instead of once for all. ``tensor_parallel``: the degrees whose shards
    are counted too (:mod:`planner.profile.shard_count`).

    Example::

        profile = analytic_profile("examples/hf_llama.py", "1,2", gpu="a100-80gb-sxm")
    """
    sizes = parse_microbatch_sizes(microbatch_sizes)
    settings = check_analytic_settings(
        gpu, efficiency, precision, optimizer, capture, threads, twins=twins,
        dynamic_batch=dynamic_batch,
    )  # fmt: skip
    user = load_model_file(path)
    return _profile(user, sizes, settings, split_at, progress, tensor_parallel)


def _profile(
    user: UserModel,
    sizes: list[int],
    settings: AnalyticSettings,
    split_at: str | None,
    progress: ProgressFn | None,
    tensor_parallel: TensorParallelRequest | None = None,
) -> Profile:
    import torch

    from planner.profile.cpu_peak import measure_cpu
    from planner.profile.fake_model import build_fake, fake_mode
    from planner.profile.roofline import Roofline
    from planner.profile.tied import find_tied_parameters

    started = time.perf_counter()
    mode = fake_mode()
    model = build_fake(user, mode)
    plan_source = None
    if tensor_parallel is not None:  # every setting checked before anything is counted
        plan_source = check_request(user, model, tensor_parallel, split_at)
    spec = settings.gpu
    if spec.measure:
        spec = measure_cpu(spec, settings.threads, settings.precision)
    roofline = Roofline(spec, settings.efficiency)
    counter = _Counter(user, model, mode, roofline, settings, split_at)
    if settings.dynamic_batch:
        counter.capture_once(sizes)
    measurements = []
    total = len(sizes)
    for done, size in enumerate(sizes):
        measurements.append(counter.measure(size))
        if progress is not None:
            progress(done + 1, total, f"microbatch size {size}")
    split = counter.first_split
    assert split is not None
    layers = _layers(split, settings, roofline)
    profile = Profile(
        model=user.name,
        layers=layers,
        measurements=measurements,
        source_sha256=user.source_sha256,
        device="cpu" if settings.gpu.measure else "cuda",
        dtype=_dtype(model),
        torch_version=torch.__version__,
        optimizer=settings.optimizer,
        precision=settings.precision,
        meta=_meta(split, time.perf_counter() - started),
        tied_parameters=find_tied_parameters(split),
        settings=_settings(spec, settings, split, split_at, counter),
    )
    if tensor_parallel is not None and plan_source is not None:
        _count_shards(
            user, profile, tensor_parallel, plan_source, settings, roofline, split_at, counter
        )
        profile.meta["wall_seconds"] = round(time.perf_counter() - started, 2)
    return profile


def _count_shards(
    user: UserModel,
    profile: Profile,
    request: TensorParallelRequest,
    plan_source: str,
    settings: AnalyticSettings,
    roofline: Any,
    split_at: str | None,
    counter: _Counter,
) -> None:
    """The tensor-parallel entries (:mod:`planner.profile.shard_count`), the optimizer
    step of a shard timed as a layer's (:data:`STEP_TRAFFIC`), twins where the unsharded
    layers are twins."""
    from planner.profile.shard_count import count_shards

    bandwidth = roofline.gpu.memory_bytes_per_s * roofline.efficiency.memory
    count_shards(
        user,
        profile,
        request,
        roofline,
        precision=settings.precision,
        split_at=split_at,
        step_ms=lambda size: STEP_TRAFFIC[settings.optimizer] * size / bandwidth * 1e3,
        optimizer=settings.optimizer,
        dynamic_batch=settings.dynamic_batch,
        twins=counter.signatures if settings.twins else None,
    )
    profile.tensor_parallel = request.info(plan_source)
    check_readable(profile, user)


class _Counter:
    """Captures the model at each microbatch size and counts its layers."""

    def __init__(
        self,
        user: UserModel,
        model: Any,
        mode: Any,
        roofline: Any,
        settings: AnalyticSettings,
        split_at: str | None,
    ):
        self.user = user
        self.model = model
        self.mode = mode
        self.roofline = roofline
        self.settings = settings
        self.split_at = split_at
        self.first_split: Any = None
        self.counted = 0  # layers counted
        self.reused = 0  # layers that took a twin's counts
        # per size, each layer's twin signature (None: unique): the shards' twins are these
        self.signatures: dict[int, list[Hashable | None]] = {}
        self.dynamic = False  # one export with a symbolic batch size served every size

    def capture_once(self, sizes: list[int]) -> None:
        """An exported graph is specialised to its batch size: capture it once with the batch
        dimension symbolic (at the largest size, since torch fixes a size of 1), so that one
        capture serves every size. Where torch refuses (the model specialises on the batch
        size), or fx captures anyway, each size is captured as the measured profiler does."""
        from planner.profile.fake_model import fake_batch
        from planner.profile.split import capture_model

        if len(sizes) < 2 or sizes[-1] < 2 or self.settings.capture == "fx":
            return
        inputs, _ = fake_batch(self.user, sizes[-1], self.mode)
        with self.mode:
            try:
                split = capture_model(
                    self.model,
                    inputs,
                    self.split_at,
                    capture=self.settings.capture,
                    source=self.user.path,
                    dynamic_batch=True,
                )
            except InputError:
                return
        if split.capture != "fx":
            self.first_split = split
            self.dynamic = True

    def measure(self, size: int) -> Measurement:
        """Every layer's counts at microbatch size ``size``."""
        from planner.profile.fake_model import fake_batch
        from planner.profile.split import tensor_bytes

        inputs, targets = fake_batch(self.user, size, self.mode)
        with self.mode:
            split = self._split(inputs, size)
            values: Any = split.flat_inputs(inputs)
            timings = []
            cache: dict[Hashable, tuple[Any, Any]] = {}
            signatures = self.signatures.setdefault(size, [])
            for k, layer in enumerate(split.layers):
                last = k == split.num_layers - 1
                count, values = self._count(
                    layer, values, targets if last else None, cache, signatures
                )
                timings.append(_timing(count))
        return Measurement(size, tensor_bytes(inputs), timings)

    def _split(self, inputs: Any, size: int) -> Any:
        from planner.profile.split import capture_model

        first = self.first_split
        if first is not None and (first.batch_size is None or first.batch_size == size):
            return first
        capture = self.settings.capture if first is None else "export"
        split = capture_model(
            self.model, inputs, self.split_at, capture=capture, source=self.user.path
        )
        if first is None:
            self.first_split = split
        elif split.names != first.names:
            raise InputError(
                f"the model splits into other layers at microbatch size {size} "
                f"({split.names[:3]}...) than at {first.batch_size} ({first.names[:3]}...)",
                file=str(self.user.path),
                field="-b",
            )
        return split

    def _count(
        self,
        layer: Any,
        values: Any,
        targets: Any,
        cache: dict[Hashable, tuple[Any, Any]],
        signatures: list[Hashable | None],
    ) -> tuple[Any, Any]:
        from planner.profile.layer_count import count_layer
        from planner.profile.twins import layer_signature

        loss: Callable[[Any], Any] | None = None
        if targets is not None:
            loss = lambda out: self.user.loss(out, targets)  # noqa: E731
        signature = layer_signature(layer, values) if self.settings.twins and loss is None else None
        signatures.append(signature)
        if signature is not None and signature in cache:
            self.reused += 1
            return cache[signature]
        precision = self.settings.precision
        result = count_layer(
            layer,
            values,
            self.roofline,
            autocast=lambda: precision_autocast("cpu", precision),
            loss=loss,
        )
        self.counted += 1
        if signature is not None:
            cache[signature] = result
        return result


def _timing(count: Any) -> LayerTiming:
    weight = count.backward_weight
    return LayerTiming(
        forward_ms=_round(count.forward.ms),
        backward_ms=_round(count.backward.ms),
        backward_input_ms=_round(count.backward_input.ms),
        backward_weight_ms=_round(weight.ms),
        output_bytes=count.output_bytes,
        saved_bytes=count.saved_bytes,
        forward_flops=count.forward.flops,
        backward_input_flops=count.backward_input.flops,
        backward_weight_flops=weight.flops,
    )


def _layers(split: Any, settings: AnalyticSettings, roofline: Any) -> list[Layer]:
    bandwidth = roofline.gpu.memory_bytes_per_s * roofline.efficiency.memory
    layers = []
    for name, params in zip(split.names, split.layer_parameters(), strict=True):
        param_bytes = sum(p.numel() * p.element_size() for p in params)
        step_ms = STEP_TRAFFIC[settings.optimizer] * param_bytes / bandwidth * 1e3
        layers.append(
            Layer(
                name=name,
                param_count=sum(p.numel() for p in params),
                param_bytes=param_bytes,
                optimizer_state_bytes=optimizer_state_bytes(param_bytes, settings.optimizer),
                optimizer_ms=_round(step_ms),
            )
        )
    return layers


def _round(ms: float) -> float:
    return round(ms, 6)


def _dtype(model: Any) -> str:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).replace("torch.", "")
    return "float32"


def _meta(split: Any, seconds: float) -> dict[str, Any]:
    """The free facts of an analytic profile (its settings are ``Profile.settings``)."""
    return {
        "tool": "pipeplan profile --analytic",
        "created_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "split_points": list(split.split_points),
        "wall_seconds": round(seconds, 2),
        "host": {"platform": platform.platform(), "python": platform.python_version()},
    }


def _settings(
    spec: GpuSpec, settings: AnalyticSettings, split: Any, split_at: str | None, counter: _Counter
) -> ProfileSettings:
    """What the analytic profile was made with: its capture and split, and what its times
    are a roofline of (``settings.analytic``)."""
    analytic = AnalyticInfo(
        gpu=spec,
        efficiency=settings.efficiency,
        method="roofline per aten operation on fake tensors (planner/profile/roofline.py)",
        autocast="cpu" if settings.precision != "fp32" else None,
        optimizer_step_bytes_per_param_byte=STEP_TRAFFIC[settings.optimizer],
        layers_counted=counter.counted,
        layers_from_twins=counter.reused,
        one_capture_for_all_sizes=counter.dynamic,
    )
    return ProfileSettings(capture=split.capture, split_at=split_at, analytic=analytic)
