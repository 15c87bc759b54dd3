"""The profile format (``pipeplan.profile/v1``): per-layer costs of one model.

A :class:`Profile` is what ``pipeplan profile`` measures and ``pipeplan import pipedream``
converts; the simulator and solver read nothing else about the model. Times are in
milliseconds on the profiling device, sizes in bytes.

Example::

    profile = load_profile("profiles/gpt.json")
    m = profile.measurement(4)                  # microbatch size 4
    m.layers[0].forward_ms, profile.cut_bytes(4, 0)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from planner.errors import InputError
from planner.fileio import atomic_write_json, read_json
from planner.limits import (
    MAX_BYTES,
    MAX_COLLECTIVES,
    MAX_LAYERS,
    MAX_MICROBATCH_SIZE,
    MAX_NAME_CHARS,
    MAX_TENSOR_PARALLEL,
    MAX_TIME_MS,
    check_int,
    check_name,
    check_number,
)
from planner.optimizers import check_optimizer
from planner.precision import PRECISIONS
from planner.profile.pass_timing import pass_ratio
from planner.profile.sharding import (
    COLLECTIVE_OPS,
    PHASES,
    Collective,
    ShardParams,
    ShardTiming,
    TensorParallelInfo,
    parse_shard_key,
    shard_key,
)
from planner.profile.tied import TiedParameter

__all__ = [
    "FLOP_FIELDS",
    "SCHEMA",
    "Layer",
    "LayerTiming",
    "Measurement",
    "Profile",
    "as_profile",
    "load_profile",
    "profile_from_dict",
]

SCHEMA = "pipeplan.profile/v1"

_TIMING_FIELDS = ("forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms")
_BYTE_FIELDS = ("output_bytes", "saved_bytes")
# Analytic profiles only (planner/profile/analytic.py): the FLOPs beside the times.
FLOP_FIELDS = ("forward_flops", "backward_input_flops", "backward_weight_flops")

# Every field a profile may hold, by object; anything else is refused as unknown (a typo,
# or a field of a newer pipeplan). Profiles written by every earlier version use only
# these (profiles/ and the profiles committed in the repository's history).
TOP_FIELDS = frozenset(
    {"schema", "model", "source_sha256", "device", "dtype", "torch_version", "optimizer"}
    | {"precision", "layers", "edges", "measurements", "meta", "tied_parameters"}
    | {"tensor_parallel"}
)
LAYER_FIELDS = frozenset(
    {"name", "param_count", "param_bytes", "optimizer_state_bytes", "optimizer_ms"}
    | {"optimizer_workspace_bytes", "sharded"}
)
MEASUREMENT_FIELDS = frozenset(
    {"microbatch_size", "input_bytes", "layers", "pass_forward_ms", "pass_backward_ms"}
)
TIMING_FIELDS = frozenset(
    {*_TIMING_FIELDS, *_BYTE_FIELDS, *FLOP_FIELDS, "workspace_bytes", "spread", "sharded"}
)
SHARD_PARAM_FIELDS = frozenset({"param_count", "param_bytes", "optimizer_state_bytes"})
SHARD_PARAM_FIELDS |= {"optimizer_ms"}
SHARD_TIMING_FIELDS = frozenset({*_TIMING_FIELDS, *_BYTE_FIELDS, "workspace_bytes", "spread"})
SHARD_TIMING_FIELDS |= {"collectives"}
COLLECTIVE_FIELDS = frozenset({"op", "bytes", "phase"})
TENSOR_PARALLEL_FIELDS = frozenset({"degrees", "sequence_parallel", "plan_source"})
TIED_FIELDS = frozenset({"name", "layers", "param_bytes", "param_count"})


@dataclass
class Layer:
    """Static facts about one layer (independent of the microbatch size)."""

    name: str
    param_count: int
    param_bytes: int
    optimizer_state_bytes: int
    # One optimizer step over the layer's parameters (the profile's ``optimizer``), ms on the
    # profiling device; 0 where it was not measured (imported profiles, older files).
    optimizer_ms: float = 0.0
    # CUDA: the step's transient memory (a foreach step's temporaries) beyond the weights,
    # gradients and state, as the caching allocator counts it; 0 where not measured (CPU).
    optimizer_workspace_bytes: int = 0
    # One rank's share of the parameters per tensor-parallel degree ("tp2": ...); empty
    # when the profile has no tensor-parallel entries (planner.profile.sharding).
    sharded: dict[str, ShardParams] = field(default_factory=dict)

    @property
    def gradient_bytes(self) -> int:
        """Gradients have the same size as the parameters they belong to."""
        return self.param_bytes


@dataclass
class LayerTiming:
    """Measured costs of one layer at one microbatch size."""

    forward_ms: float
    backward_ms: float
    backward_input_ms: float
    backward_weight_ms: float
    output_bytes: int
    saved_bytes: int
    workspace_bytes: int = 0
    # Spread of each timing over the repeats, e.g. {"forward_ms": [p25, p75]}.
    spread: dict[str, list[float]] = field(default_factory=dict)
    # Analytic profiles: FLOPs of the forward and of the backward's two halves (None: not
    # counted, as in a measured profile).
    forward_flops: int | None = None
    backward_input_flops: int | None = None
    backward_weight_flops: int | None = None
    # One rank's shard per tensor-parallel setting ("tp2", "tp2-sp": ...); empty when the
    # profile has no tensor-parallel entries (planner.profile.sharding).
    sharded: dict[str, ShardTiming] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "forward_ms": self.forward_ms,
            "backward_ms": self.backward_ms,
            "backward_input_ms": self.backward_input_ms,
            "backward_weight_ms": self.backward_weight_ms,
            "output_bytes": self.output_bytes,
            "saved_bytes": self.saved_bytes,
        }
        if self.workspace_bytes:
            out["workspace_bytes"] = self.workspace_bytes
        if self.spread:
            out["spread"] = self.spread
        for name in FLOP_FIELDS:
            value = getattr(self, name)
            if value is not None:  # optional: absent in measured profiles
                out[name] = value
        if self.sharded:  # optional: absent without tensor-parallel entries
            out["sharded"] = {key: t.to_dict() for key, t in self.sharded.items()}
        return out


@dataclass
class Measurement:
    """All layers' costs at one microbatch size."""

    microbatch_size: int
    input_bytes: int
    layers: list[LayerTiming]
    # Pass timing (planner.profile.pass_timing): the whole forward (with the loss) and the
    # whole backward of the model, ms, that the layers' times add up to; None: not timed.
    pass_forward_ms: float | None = None
    pass_backward_ms: float | None = None

    def pass_ratios(self) -> tuple[float, float] | None:
        """The layers' summed forward and backward over the whole passes (1.0: they add up
        exactly); None where the whole passes were not timed.

        Example::

            profile.measurement(4).pass_ratios()   # e.g. (1.004, 0.997)
        """
        if not self.pass_forward_ms or not self.pass_backward_ms:
            return None
        forward = pass_ratio([t.forward_ms for t in self.layers], self.pass_forward_ms)
        backward = pass_ratio([t.backward_ms for t in self.layers], self.pass_backward_ms)
        if forward is None or backward is None:
            return None
        return forward, backward

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "microbatch_size": self.microbatch_size,
            "input_bytes": self.input_bytes,
            "layers": [t.to_dict() for t in self.layers],
        }
        if self.pass_forward_ms is not None:  # optional: absent in layer-timed profiles
            out["pass_forward_ms"] = self.pass_forward_ms
        if self.pass_backward_ms is not None:
            out["pass_backward_ms"] = self.pass_backward_ms
        return out


@dataclass
class Profile:
    """A model's per-layer profile; layers are in topological order."""

    model: str
    layers: list[Layer]
    measurements: list[Measurement]
    edges: list[tuple[int, int]] | None = None
    source_sha256: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    torch_version: str = ""
    optimizer: str = "adam"
    # fp32, or the torch.autocast dtype the forwards ran under (bf16, fp16): planner.precision
    precision: str = "fp32"
    # Free-form facts about how it was measured (repeat, warmup, threads, host, date, origin).
    meta: dict[str, Any] = field(default_factory=dict)
    # Parameters used by two or more layers (tied embeddings); empty when there are none.
    tied_parameters: list[TiedParameter] = field(default_factory=list)
    # The tensor-parallel degrees the layers' ``sharded`` entries cover; None: none.
    tensor_parallel: TensorParallelInfo | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def microbatch_sizes(self) -> list[int]:
        return sorted(m.microbatch_size for m in self.measurements)

    @property
    def is_chain(self) -> bool:
        return self.edges is None

    def measurement(self, microbatch_size: int) -> Measurement:
        """The measurement for ``microbatch_size``; an InputError names the profiled sizes."""
        for m in self.measurements:
            if m.microbatch_size == microbatch_size:
                return m
        raise InputError(
            f"microbatch size {microbatch_size} was not profiled; profiled sizes are "
            f"{self.microbatch_sizes}",
            field="microbatch_size",
        )

    def edge_list(self) -> list[tuple[int, int]]:
        """Data-flow edges; a chain ``i -> i+1`` when the profile has none."""
        if self.edges is None:
            return [(i, i + 1) for i in range(self.num_layers - 1)]
        return list(self.edges)

    def cut_bytes(self, microbatch_size: int, after: int) -> int:
        """Bytes that cross a cut between layers ``after`` and ``after + 1`` per microbatch.

        On a chain that is layer ``after``'s output; on a DAG it is the output of every
        layer at or before the cut with a consumer after it (each tensor sent once).
        """
        timings = self.measurement(microbatch_size).layers
        if self.edges is None:
            return timings[after].output_bytes
        producers = {u for u, v in self.edges if u <= after < v}
        return sum(timings[u].output_bytes for u in producers)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "model": self.model,
            "source_sha256": self.source_sha256,
            "device": self.device,
            "dtype": self.dtype,
            "torch_version": self.torch_version,
            "optimizer": self.optimizer,
            "precision": self.precision,
            "layers": [_layer_dict(layer) for layer in self.layers],
            "measurements": [m.to_dict() for m in self.measurements],
        }
        if self.edges is not None:
            out["edges"] = [list(e) for e in self.edges]
        if self.tied_parameters:  # optional: absent means no parameter is shared
            out["tied_parameters"] = [t.to_dict() for t in self.tied_parameters]
        if self.tensor_parallel is not None:  # optional: absent without sharded entries
            out["tensor_parallel"] = self.tensor_parallel.to_dict()
        if self.meta:
            out["meta"] = self.meta
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile atomically as JSON, after checking that :func:`load_profile`
        will read it back (a layer name with a control character, a number beyond
        :mod:`planner.limits`: one InputError naming ``path`` and the field, nothing written).

        Example::

            profile.save("profiles/mlp.json")
        """
        data = self.to_dict()
        profile_from_dict(data, source=str(path))
        atomic_write_json(path, data)


def _layer_dict(layer: Layer) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": layer.name,
        "param_count": layer.param_count,
        "param_bytes": layer.param_bytes,
        "optimizer_state_bytes": layer.optimizer_state_bytes,
    }
    if layer.optimizer_ms:  # optional: absent means not measured (read back as 0)
        out["optimizer_ms"] = layer.optimizer_ms
    if layer.optimizer_workspace_bytes:  # optional, CUDA only
        out["optimizer_workspace_bytes"] = layer.optimizer_workspace_bytes
    if layer.sharded:  # optional: absent without tensor-parallel entries
        out["sharded"] = {key: shard.to_dict() for key, shard in layer.sharded.items()}
    return out


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile JSON file.

    Example::

        profile = load_profile("profiles/mlp.json")
    """
    return profile_from_dict(read_json(path), source=str(path))


def profile_from_dict(data: Any, *, source: str = "<profile>") -> Profile:
    """Validate a decoded profile; every problem is an InputError naming the field.

    Unknown fields are refused, naming the known ones (``meta`` is free-form); numbers are
    checked against :mod:`planner.limits` and the optimizer against
    :mod:`planner.optimizers`, so ``solve``, ``simulate``, ``show`` and ``run`` refuse a bad
    profile when they read it, before any work.

    Example::

        profile_from_dict(json.load(open("profiles/gpt.json")), source="profiles/gpt.json")
    """
    v = _Validator(source)
    if not isinstance(data, dict):
        raise InputError("expected a JSON object at the top level", file=source)
    schema = data.get("schema")
    if schema != SCHEMA:
        v.fail("schema", f"expected {SCHEMA!r}, got {schema!r}")
    v.known(data, TOP_FIELDS, "")
    raw_layers = v.list_of(data, "layers", "layers", high=MAX_LAYERS)
    if not raw_layers:
        v.fail("layers", "expected at least one layer")
    layers = [_layer(v, item, f"layers[{i}]") for i, item in enumerate(raw_layers)]
    edges = _edges(v, data.get("edges"), len(layers))
    raw_measurements = v.list_of(data, "measurements", "measurements")
    if not raw_measurements:
        v.fail("measurements", "expected at least one microbatch size")
    measurements = [
        _measurement(v, item, f"measurements[{k}]", len(layers))
        for k, item in enumerate(raw_measurements)
    ]
    if not isinstance(data.get("meta") or {}, dict):
        v.fail("meta", f"expected an object, got {data.get('meta')!r}")
    sizes = [m.microbatch_size for m in measurements]
    if len(set(sizes)) != len(sizes):
        v.fail("measurements", f"microbatch sizes repeat: {sizes}")
    return Profile(
        model=v.name(data, "model", default="model"),
        layers=layers,
        measurements=sorted(measurements, key=lambda m: m.microbatch_size),
        edges=edges,
        source_sha256=v.text(data, "source_sha256", default=None),
        device=v.text(data, "device", default="cpu") or "cpu",
        dtype=v.text(data, "dtype", default="float32") or "float32",
        torch_version=v.text(data, "torch_version", default="") or "",
        optimizer=check_optimizer(data.get("optimizer", "adam"), field="optimizer", file=source),
        precision=_precision(v, data.get("precision", "fp32")),
        meta=dict(data.get("meta") or {}),
        tied_parameters=_tied(v, data.get("tied_parameters"), len(layers), data.get("dtype")),
        tensor_parallel=_tensor_parallel(v, data.get("tensor_parallel"), layers, measurements),
    )


def _layer(v: _Validator, item: Any, where: str) -> Layer:
    v.known(item, LAYER_FIELDS, where)
    return Layer(
        name=v.name(item, "name", where),
        param_count=v.count(item, "param_count", where),
        param_bytes=v.count(item, "param_bytes", where),
        optimizer_state_bytes=v.count(item, "optimizer_state_bytes", where),
        optimizer_ms=v.number(item, "optimizer_ms", where, default=0.0),
        optimizer_workspace_bytes=v.count(item, "optimizer_workspace_bytes", where, default=0),
        sharded=_sharded_params(v, item.get("sharded"), f"{where}.sharded"),
    )


def _precision(v: _Validator, raw: Any) -> str:
    if raw not in PRECISIONS:
        v.fail("precision", f"expected one of {', '.join(PRECISIONS)}, got {raw!r}")
    return str(raw)


def _edges(v: _Validator, raw: Any, n: int) -> list[tuple[int, int]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        v.fail("edges", "expected a list of [i, j] pairs")
    edges: list[tuple[int, int]] = []
    for k, pair in enumerate(raw):
        ok = isinstance(pair, list | tuple) and len(pair) == 2
        ok = ok and all(isinstance(x, int) and 0 <= x < n for x in pair)
        if not ok or pair[0] >= pair[1]:
            v.fail(
                f"edges[{k}]",
                f"expected [i, j] with 0 <= i < j < {n} (layers in topological order), got {pair}",
            )
        edges.append((pair[0], pair[1]))
    return edges


_ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def _tied(v: _Validator, raw: Any, n: int, dtype: Any) -> list[TiedParameter]:
    """``tied_parameters``: ``[{name, layers, param_bytes[, param_count]}]``; absent: none.

    ``param_count`` defaults to ``param_bytes`` over the profile's dtype size (0 if unknown).
    """
    if raw is None:
        return []
    if not isinstance(raw, list):
        v.fail("tied_parameters", "expected a list of {name, layers, param_bytes} objects")
    ties: list[TiedParameter] = []
    for k, item in enumerate(raw):
        where = f"tied_parameters[{k}]"
        v.known(item, TIED_FIELDS, where)
        name = v.name(item, "name", where)
        layers = v.get(item, "layers", where)
        ok = isinstance(layers, list) and len(layers) >= 2
        ok = ok and all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
        ok = ok and all(0 <= x < n for x in layers) and len(set(layers)) == len(layers)
        if not ok:
            v.fail(
                f"{where}.layers",
                f"expected 2 or more distinct layer indices in 0..{n - 1}, got {layers!r}",
            )
        size = v.count(item, "param_bytes", where)
        itemsize = _ITEM_BYTES.get(str(dtype), 0)
        count = v.count(item, "param_count", where, default=size // itemsize if itemsize else 0)
        ties.append(TiedParameter(name, tuple(sorted(layers)), count, size))
    names = [t.name for t in ties]
    if len(set(names)) != len(names):
        v.fail("tied_parameters", f"a parameter is listed twice: {names}")
    return ties


def _measurement(v: _Validator, item: Any, where: str, n: int) -> Measurement:
    v.known(item, MEASUREMENT_FIELDS, where)
    size = check_int(
        v.get(item, "microbatch_size", where),
        field=f"{where}.microbatch_size",
        high=MAX_MICROBATCH_SIZE,
        file=v.source,
    )
    timings = v.list_of(item, "layers", where)
    if len(timings) != n:
        v.fail(f"{where}.layers", f"expected {n} entries (one per layer), got {len(timings)}")
    layers = []
    for i, t in enumerate(timings):
        at = f"{where}.layers[{i}]"
        v.known(t, TIMING_FIELDS, at)
        ms = {name: v.number(t, name, at) for name in _TIMING_FIELDS}
        sizes = {name: v.count(t, name, at) for name in _BYTE_FIELDS}
        spread = _spread(v, t, at)
        layers.append(
            LayerTiming(
                forward_ms=ms["forward_ms"],
                backward_ms=ms["backward_ms"],
                backward_input_ms=ms["backward_input_ms"],
                backward_weight_ms=ms["backward_weight_ms"],
                output_bytes=sizes["output_bytes"],
                saved_bytes=sizes["saved_bytes"],
                workspace_bytes=v.count(t, "workspace_bytes", at, default=0),
                spread=spread,
                **{name: _optional_count(v, t, name, at) for name in FLOP_FIELDS},
                sharded=_sharded_timings(v, t.get("sharded"), f"{at}.sharded"),
            )
        )
    return Measurement(
        microbatch_size=size,
        input_bytes=v.count(item, "input_bytes", where, default=0),
        layers=layers,
        pass_forward_ms=_optional_ms(v, item, "pass_forward_ms", where),
        pass_backward_ms=_optional_ms(v, item, "pass_backward_ms", where),
    )


def _spread(v: _Validator, t: Any, at: str) -> dict[str, list[float]]:
    """A timing's ``spread``: ``{timing field: [p25, p75]}``."""
    spread = t.get("spread") or {}
    if not isinstance(spread, dict):
        v.fail(f"{at}.spread", "expected an object")
    for key, val in spread.items():
        if key not in _TIMING_FIELDS or not isinstance(val, list) or len(val) > 2:
            v.fail(
                f"{at}.spread.{key}",
                f"expected [p25, p75] of one of {', '.join(_TIMING_FIELDS)}, got {val!r}",
            )
        for x in val:
            check_number(x, field=f"{at}.spread.{key}", high=MAX_TIME_MS, file=v.source)
    return {str(k): [float(x) for x in val] for k, val in spread.items()}


def _shard_keys(v: _Validator, raw: Any, where: str, *, params: bool) -> dict[str, Any]:
    """A ``sharded`` object's items, each key a :func:`~planner.profile.sharding.shard_key`
    (parameters: without ``-sp``)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        v.fail(where, "expected an object keyed by tensor-parallel setting ('tp2', 'tp2-sp')")
    example = "'tp2'" if params else "'tp2' or 'tp2-sp'"
    for key in raw:
        parsed = parse_shard_key(str(key))
        if parsed is None or parsed[0] > MAX_TENSOR_PARALLEL or (params and parsed[1]):
            v.fail(
                f"{where}.{key}",
                f"expected a key like {example} (degrees 2 to {MAX_TENSOR_PARALLEL})",
            )
    return dict(raw)


def _sharded_params(v: _Validator, raw: Any, where: str) -> dict[str, ShardParams]:
    out = {}
    for key, item in _shard_keys(v, raw, where, params=True).items():
        at = f"{where}.{key}"
        v.known(item, SHARD_PARAM_FIELDS, at)
        out[key] = ShardParams(
            param_count=v.count(item, "param_count", at),
            param_bytes=v.count(item, "param_bytes", at),
            optimizer_state_bytes=v.count(item, "optimizer_state_bytes", at),
            optimizer_ms=v.number(item, "optimizer_ms", at, default=0.0),
        )
    return out


def _sharded_timings(v: _Validator, raw: Any, where: str) -> dict[str, ShardTiming]:
    out = {}
    for key, item in _shard_keys(v, raw, where, params=False).items():
        at = f"{where}.{key}"
        v.known(item, SHARD_TIMING_FIELDS, at)
        ms = {name: v.number(item, name, at) for name in _TIMING_FIELDS}
        sizes = {name: v.count(item, name, at) for name in _BYTE_FIELDS}
        out[key] = ShardTiming(
            forward_ms=ms["forward_ms"],
            backward_ms=ms["backward_ms"],
            backward_input_ms=ms["backward_input_ms"],
            backward_weight_ms=ms["backward_weight_ms"],
            output_bytes=sizes["output_bytes"],
            saved_bytes=sizes["saved_bytes"],
            workspace_bytes=v.count(item, "workspace_bytes", at, default=0),
            collectives=_collectives(v, item.get("collectives"), f"{at}.collectives"),
            spread=_spread(v, item, at),
        )
    return out


def _collectives(v: _Validator, raw: Any, where: str) -> tuple[Collective, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_COLLECTIVES:
        v.fail(where, f"expected a list of at most {MAX_COLLECTIVES} {{op, bytes, phase}}")
    out = []
    for k, item in enumerate(raw):
        at = f"{where}[{k}]"
        v.known(item, COLLECTIVE_FIELDS, at)
        op, phase = item.get("op"), item.get("phase")
        if op not in COLLECTIVE_OPS:
            v.fail(f"{at}.op", f"expected one of {', '.join(COLLECTIVE_OPS)}, got {op!r}")
        if phase not in PHASES:
            v.fail(f"{at}.phase", f"expected one of {', '.join(PHASES)}, got {phase!r}")
        out.append(Collective(str(op), v.count(item, "bytes", at), str(phase)))
    return tuple(out)


def _tensor_parallel(
    v: _Validator, raw: Any, layers: list[Layer], measurements: list[Measurement]
) -> TensorParallelInfo | None:
    """``tensor_parallel`` and the layers' ``sharded`` entries, checked together: every
    layer has every degree's parameters and, at every microbatch size, every setting's
    timing; without ``tensor_parallel`` no layer has any."""
    timings = [t for m in measurements for t in m.layers]
    if raw is None:
        if any(layer.sharded for layer in layers) or any(t.sharded for t in timings):
            v.fail("tensor_parallel", "missing; the layers hold 'sharded' entries")
        return None
    v.known(raw, TENSOR_PARALLEL_FIELDS, "tensor_parallel")
    degrees = v.get(raw, "degrees", "tensor_parallel")
    ok = isinstance(degrees, list) and 0 < len(degrees) <= 16
    ok = ok and all(
        isinstance(t, int) and not isinstance(t, bool) and 2 <= t <= MAX_TENSOR_PARALLEL
        for t in degrees
    )
    if not ok or len(set(degrees)) != len(degrees):
        v.fail(
            "tensor_parallel.degrees",
            f"expected distinct degrees from 2 to {MAX_TENSOR_PARALLEL}, got {degrees!r}",
        )
    sp = raw.get("sequence_parallel", False)
    if not isinstance(sp, bool):
        v.fail("tensor_parallel.sequence_parallel", f"expected true or false, got {sp!r}")
    info = TensorParallelInfo(
        tuple(sorted(degrees)), sp, v.name(raw, "plan_source", "tensor_parallel", default="")
    )
    want_params = {shard_key(t) for t in info.degrees}
    for i, layer in enumerate(layers):
        if set(layer.sharded) != want_params:
            v.fail(f"layers[{i}].sharded", f"expected entries {sorted(want_params)}")
    for k, m in enumerate(measurements):
        for i, t in enumerate(m.layers):
            if set(t.sharded) != set(info.keys()):
                v.fail(
                    f"measurements[{k}].layers[{i}].sharded",
                    f"expected entries {info.keys()}",
                )
    return info


def _optional_count(v: _Validator, item: Any, key: str, where: str) -> int | None:
    if key not in item:
        return None
    return v.count(item, key, where)


def _optional_ms(v: _Validator, item: Any, key: str, where: str) -> float | None:
    if key not in item:
        return None
    return v.number(item, key, where)


class _Validator:
    """Field access that fails with the file and the dotted field name."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, message: str) -> Any:
        raise InputError(message, file=self.source, field=where)

    def known(self, obj: Any, fields: frozenset[str], where: str) -> None:
        """Refuse a key outside ``fields`` (a typo, or a newer pipeplan's field)."""
        if not isinstance(obj, dict):
            self.fail(where, "expected an object")
        for key in obj:
            if key not in fields:
                self.fail(
                    f"{where}.{key}" if where else str(key),
                    f"unknown field; expected one of {', '.join(sorted(fields))}",
                )

    def get(self, obj: Any, key: str, where: str) -> Any:
        if not isinstance(obj, dict):
            self.fail(where, "expected an object")
        if key not in obj:
            self.fail(f"{where}.{key}" if where != key else key, "missing")
        return obj[key]

    def list_of(self, obj: Any, key: str, where: str, *, high: int | None = None) -> list[Any]:
        value = self.get(obj, key, where)
        if not isinstance(value, list):
            self.fail(where, "expected a list")
        if high is not None and len(value) > high:
            self.fail(where, f"{len(value):,} entries; expected at most {high:,}")
        return value

    def name(self, obj: Any, key: str, where: str = "", *, default: str | None = None) -> str:
        at = f"{where}.{key}" if where else key
        if default is not None and isinstance(obj, dict) and obj.get(key) is None:
            return default
        return check_name(self.get(obj, key, where), field=at, file=self.source)

    def text(self, obj: dict[str, Any], key: str, *, default: str | None) -> str | None:
        """An optional free-text field (a string or null); shown escaped, never run."""
        value = obj.get(key, default)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_NAME_CHARS):
            self.fail(key, f"expected a string of at most {MAX_NAME_CHARS} characters")
        return value

    def number(self, obj: Any, key: str, where: str, default: float | None = None) -> float:
        if default is not None and isinstance(obj, dict) and key not in obj:
            return default
        value = self.get(obj, key, where)
        return check_number(value, field=f"{where}.{key}", high=MAX_TIME_MS, file=self.source)

    def count(self, obj: Any, key: str, where: str, default: int | None = None) -> int:
        if default is not None and isinstance(obj, dict) and key not in obj:
            return default
        value = self.get(obj, key, where)
        return check_int(value, field=f"{where}.{key}", low=0, high=MAX_BYTES, file=self.source)


def as_profile(profile: Profile | str | os.PathLike[str]) -> Profile:
    """A Profile, loading it first when given a path.

    Example::

        as_profile("profiles/gpt.json").num_layers
    """
    if isinstance(profile, str | os.PathLike):
        return load_profile(profile)
    return profile
