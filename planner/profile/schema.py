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
from typing import Annotated, Any

from planner.errors import InputError
from planner.fileio import atomic_write_json, read_json
from planner.limits import MAX_LAYERS, MAX_MICROBATCH_SIZE
from planner.optimizers import check_optimizer
from planner.precision import PRECISIONS
from planner.profile.means import take_means, timing_fields
from planner.profile.pass_timing import pass_ratio
from planner.profile.settings import ProfileSettings, split_meta
from planner.profile.sharding import (
    PARAM_KEY,
    SHARD_KEY,
    Means,
    ShardParams,
    ShardTiming,
    Spread,
    TensorParallelInfo,
    pass_costs_dict,
    shard_key,
)
from planner.profile.tied import TiedParameter
from planner.records import (
    ByteCount,
    Default,
    Integer,
    Keys,
    Kind,
    Length,
    Milliseconds,
    Name,
    OneOf,
    Text,
    read_record,
)

__all__ = [
    "FLOP_FIELDS",
    "SCHEMA",
    "Layer",
    "LayerTiming",
    "Measurement",
    "Profile",
    "ProfileSettings",
    "as_profile",
    "load_profile",
    "profile_from_dict",
]

SCHEMA = "pipeplan.profile/v1"

# Analytic profiles only (planner/profile/analytic.py): the FLOPs beside the times.
FLOP_FIELDS = ("forward_flops", "backward_input_flops", "backward_weight_flops")

# Every field a profile may hold is a field of the records below (planner.records reads
# them); anything else is refused as unknown (a typo, or a field of a newer pipeplan).
# Profiles written by every earlier version use only these (profiles/ and the profiles
# committed in the repository's history).


@dataclass
class Layer:
    """Static facts about one layer (independent of the microbatch size)."""

    name: Name
    param_count: ByteCount
    param_bytes: ByteCount
    optimizer_state_bytes: ByteCount
    # One optimizer step over the layer's parameters (the profile's ``optimizer``), ms on the
    # profiling device; 0 where it was not measured (imported profiles, older files).
    optimizer_ms: Milliseconds = 0.0
    # CUDA: the step's transient memory (a foreach step's temporaries) beyond the weights,
    # gradients and state, as the caching allocator counts it; 0 where not measured (CPU).
    optimizer_workspace_bytes: ByteCount = 0
    # One rank's share of the parameters per tensor-parallel degree ("tp2": ...); empty
    # when the profile has no tensor-parallel entries (planner.profile.sharding).
    sharded: Annotated[dict[str, ShardParams], Keys(PARAM_KEY)] = field(default_factory=dict)

    @property
    def gradient_bytes(self) -> int:
        """Gradients have the same size as the parameters they belong to."""
        return self.param_bytes


@dataclass
class LayerTiming:
    """Measured costs of one layer at one microbatch size."""

    forward_ms: Milliseconds
    backward_ms: Milliseconds
    backward_input_ms: Milliseconds
    backward_weight_ms: Milliseconds
    output_bytes: ByteCount
    saved_bytes: ByteCount
    workspace_bytes: ByteCount = 0
    # Spread of each timing over the repeats, e.g. {"forward_ms": [p25, p75]}.
    spread: Spread = field(default_factory=dict)
    # The file's means beside its medians (the fields, as the contract says); read in, the
    # fields hold the means, what the planner adds up, and ``median`` the file's values
    # (planner.profile.means).
    mean: Means = field(default_factory=dict)
    median: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    # Analytic profiles: FLOPs of the forward and of the backward's two halves (None: not
    # counted, as in a measured profile).
    forward_flops: ByteCount | None = None
    backward_input_flops: ByteCount | None = None
    backward_weight_flops: ByteCount | None = None
    # One rank's shard per tensor-parallel setting ("tp2", "tp2-sp": ...); empty when the
    # profile has no tensor-parallel entries (planner.profile.sharding).
    sharded: Annotated[dict[str, ShardTiming], Keys(SHARD_KEY)] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = timing_fields(self, pass_costs_dict(self))
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

    microbatch_size: Annotated[int, Integer(1, MAX_MICROBATCH_SIZE)]
    input_bytes: Annotated[ByteCount, Default(0)]
    layers: list[LayerTiming]
    # Pass timing (planner.profile.pass_timing): the whole forward (with the loss) and the
    # whole backward of the model, ms, that the layers' times add up to; None: not timed.
    pass_forward_ms: Milliseconds | None = None
    pass_backward_ms: Milliseconds | None = None

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
    # Free-form facts about how it was measured (repeat, warmup, host, date, origin); the
    # settings that code reads are ``settings`` (both written in the file's ``meta``).
    meta: dict[str, Any] = field(default_factory=dict)
    # Parameters used by two or more layers (tied embeddings); empty when there are none.
    tied_parameters: list[TiedParameter] = field(default_factory=list)
    # The tensor-parallel degrees the layers' ``sharded`` entries cover; None: none.
    tensor_parallel: TensorParallelInfo | None = None
    # How it was made, as later commands read it: capture, split, threads, clock, timing,
    # batch-dependent modules, the analytic GPU, a calibration (planner.profile.settings).
    settings: ProfileSettings = field(default_factory=ProfileSettings)

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
        meta = {**self.meta, **self.settings.to_meta()}
        if meta:
            out["meta"] = meta
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

    Unknown fields are refused, naming the known ones (``meta`` is free-form beside the
    settings of :mod:`planner.profile.settings`); numbers are checked against
    :mod:`planner.limits` and the optimizer against :mod:`planner.optimizers`, so ``solve``,
    ``simulate``, ``show`` and ``run`` refuse a bad profile when they read it, before any
    work.

    Example::

        profile_from_dict(json.load(open("profiles/gpt.json")), source="profiles/gpt.json")
    """
    if not isinstance(data, dict):
        raise InputError("expected a JSON object at the top level", file=source)
    schema = data.get("schema")
    if schema != SCHEMA:
        raise InputError(f"expected {SCHEMA!r}, got {schema!r}", file=source, field="schema")
    top = read_record(_ProfileFile, data, file=source, ignore=("schema",))
    n = len(top.layers)
    for k, m in enumerate(top.measurements):
        if len(m.layers) != n:
            raise InputError(
                f"expected {n} entries (one per layer), got {len(m.layers)}",
                file=source,
                field=f"measurements[{k}].layers",
            )
    sizes = [m.microbatch_size for m in top.measurements]
    if len(set(sizes)) != len(sizes):
        raise InputError(f"microbatch sizes repeat: {sizes}", file=source, field="measurements")
    for k, m in enumerate(top.measurements):
        for i, t in enumerate(m.layers):
            where = f"measurements[{k}].layers[{i}]"
            _check_spread(t.spread, source, where)
            take_means(t)
            for key, shard in t.sharded.items():
                _check_spread(shard.spread, source, f"{where}.sharded.{key}")
                take_means(shard)
    settings, meta = split_meta(top.meta, file=source)
    return Profile(
        model=top.model,
        layers=top.layers,
        measurements=sorted(top.measurements, key=lambda m: m.microbatch_size),
        edges=_edges(top.edges, n, source),
        source_sha256=top.source_sha256,
        device=top.device or "cpu",
        dtype=top.dtype or "float32",
        torch_version=top.torch_version,
        optimizer=top.optimizer,
        precision=top.precision,
        meta=meta,
        tied_parameters=_tied(top.tied_parameters, n, top.dtype, source),
        tensor_parallel=_tensor_parallel(top, source),
        settings=settings,
    )


def _check_spread(spread: dict[str, list[float]], source: str, where: str) -> None:
    """Each spread is [first quartile, third quartile], the first not above the second."""
    for name, (low, high) in spread.items():
        if low > high:
            raise InputError(
                f"expected [first quartile, third quartile], ascending; got {[low, high]}",
                file=source,
                field=f"{where}.spread.{name}",
            )


_OPTIMIZER = Kind("an optimizer", lambda value: check_optimizer(value, field=""))


@dataclass
class _TiedEntry:
    """One of ``tied_parameters`` as the file holds it (``param_count`` defaults to
    ``param_bytes`` over the profile's dtype size)."""

    name: Name
    layers: list[Any]  # checked against the profile's layers
    param_bytes: ByteCount
    param_count: ByteCount | None = None


@dataclass
class _ProfileFile:
    """The top level of a profile file (beside ``schema``), with its defaults."""

    layers: Annotated[list[Layer], Length(1, MAX_LAYERS, "layer")]
    measurements: Annotated[list[Measurement], Length(1, noun="microbatch size")]
    model: Name = "model"
    source_sha256: Annotated[str, Text()] | None = None
    device: Annotated[str, Text()] = "cpu"
    dtype: Annotated[str, Text()] = "float32"
    torch_version: Annotated[str, Text()] = ""
    optimizer: Annotated[str, _OPTIMIZER] = "adam"
    precision: Annotated[str, OneOf(PRECISIONS)] = "fp32"
    edges: list[tuple[int, int]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    tied_parameters: list[_TiedEntry] = field(default_factory=list)
    tensor_parallel: TensorParallelInfo | None = None


def _edges(raw: list[tuple[int, int]] | None, n: int, source: str) -> list[tuple[int, int]] | None:
    if raw is None:
        return None
    for k, (i, j) in enumerate(raw):
        if not 0 <= i < j < n:
            raise InputError(
                f"expected [i, j] with 0 <= i < j < {n} (layers in topological order), "
                f"got {[i, j]}",
                file=source,
                field=f"edges[{k}]",
            )
    return list(raw)


_ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def _tied(entries: list[_TiedEntry], n: int, dtype: str, source: str) -> list[TiedParameter]:
    """``tied_parameters``' layers checked against the profile's ``n`` layers; a missing
    ``param_count`` is ``param_bytes`` over the dtype's size (0 if unknown)."""
    ties: list[TiedParameter] = []
    for k, entry in enumerate(entries):
        layers = entry.layers
        ok = len(layers) >= 2 and len(set(layers)) == len(layers)
        ok = ok and all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
        if not ok or not all(0 <= x < n for x in layers):
            raise InputError(
                f"expected 2 or more distinct layer indices in 0..{n - 1}, got {layers!r}",
                file=source,
                field=f"tied_parameters[{k}].layers",
            )
        itemsize = _ITEM_BYTES.get(dtype, 0)
        count = entry.param_count
        if count is None:
            count = entry.param_bytes // itemsize if itemsize else 0
        ties.append(TiedParameter(entry.name, tuple(sorted(layers)), count, entry.param_bytes))
    names = [t.name for t in ties]
    if len(set(names)) != len(names):
        raise InputError(
            f"a parameter is listed twice: {names}", file=source, field="tied_parameters"
        )
    return ties


def _tensor_parallel(top: _ProfileFile, source: str) -> TensorParallelInfo | None:
    """``tensor_parallel`` and the layers' ``sharded`` entries, checked together: every
    layer has every degree's parameters and, at every microbatch size, every setting's
    timing; without ``tensor_parallel`` no layer has any."""
    info = top.tensor_parallel
    timings = [t for m in top.measurements for t in m.layers]
    if info is None:
        if any(layer.sharded for layer in top.layers) or any(t.sharded for t in timings):
            raise InputError(
                "missing; the layers hold 'sharded' entries", file=source, field="tensor_parallel"
            )
        return None
    want_params = {shard_key(t) for t in info.degrees}
    for i, layer in enumerate(top.layers):
        if set(layer.sharded) != want_params:
            raise InputError(
                f"expected entries {sorted(want_params)}", file=source, field=f"layers[{i}].sharded"
            )
    for k, m in enumerate(top.measurements):
        for i, t in enumerate(m.layers):
            if set(t.sharded) != set(info.keys()):
                raise InputError(
                    f"expected entries {info.keys()}",
                    file=source,
                    field=f"measurements[{k}].layers[{i}].sharded",
                )
    return info


def as_profile(profile: Profile | str | os.PathLike[str]) -> Profile:
    """A Profile, loading it first when given a path.

    Example::

        as_profile("profiles/gpt.json").num_layers
    """
    if isinstance(profile, str | os.PathLike):
        return load_profile(profile)
    return profile
