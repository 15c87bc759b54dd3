"""A layer's costs when it is split across a tensor-parallel group: what the profile records.

For every tensor-parallel degree ``t`` the profiler measured (or counted, for an analytic
profile), each layer holds the costs of **one rank's shard**: its parameters
(:class:`ShardParams`, on the profile's ``layers[i].sharded``), and per microbatch size its
times, the bytes it saves for backward and sends at a cut, and the collectives it issues
on its group (:class:`ShardTiming`, on ``measurements[k].layers[i].sharded``). Both are
keyed by :func:`shard_key`: ``"tp2"`` for tensor parallelism alone, ``"tp2-sp"`` with
sequence parallelism (the parameters do not depend on it: ``ShardParams`` are keyed
``"tp2"`` only). A layer that the tensor-parallel plan leaves whole is replicated on every
rank of the group: its entry then holds its full costs and no collective (under sequence
parallelism it runs on ``1/t`` of the sequence, which its entry shows).

A collective's ``bytes`` is always the size of the whole (unsharded) tensor, ``N``: the
tensor all-reduced, the output of an all-gather, the input of a reduce-scatter. A ring over
``t`` ranks then moves ``2 (t - 1) / t * N`` bytes per rank for an all-reduce and
``(t - 1) / t * N`` for the other two (:meth:`Collective.ring_bytes`), which is how
Megatron-LM counts its two all-reduces of ``b * s * h`` per block and pass (or, with
sequence parallelism, a reduce-scatter and an all-gather each).

Example::

    timing = ShardTiming(1.0, 2.0, 1.0, 1.0, output_bytes=4096, saved_bytes=8192,
                         collectives=(Collective("all_reduce", 4096, "forward"),))
    timing.collective_bytes("forward")        # 4096
    shard_key(2, sequence_parallel=True)      # 'tp2-sp'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from planner.limits import MAX_COLLECTIVES, MAX_TENSOR_PARALLEL
from planner.profile.means import timing_fields
from planner.records import (
    ByteCount,
    Default,
    Keys,
    Kind,
    Length,
    Milliseconds,
    Name,
    OneOf,
)

__all__ = [
    "COLLECTIVE_OPS",
    "DEGREES",
    "PARAM_KEY",
    "PHASES",
    "SHARD_KEY",
    "TIMING_NAMES",
    "Collective",
    "ShardParams",
    "ShardTiming",
    "Means",
    "Spread",
    "TensorParallelInfo",
    "parse_shard_key",
    "pass_costs_dict",
    "shard_key",
]

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
"""The collectives a tensor-parallel layer issues on its group (torch's c10d names)."""

PHASES = ("forward", "backward")
"""When a collective runs: in the forward, or in the backward's input-gradient half (the
weight-gradient half of a Megatron-style layer issues none)."""


def shard_key(degree: int, *, sequence_parallel: bool = False) -> str:
    """The key of a degree's entries: ``"tp4"``, or ``"tp4-sp"`` with sequence parallelism.

    Example::

        shard_key(4), shard_key(4, sequence_parallel=True)   # ('tp4', 'tp4-sp')
    """
    return f"tp{degree}-sp" if sequence_parallel else f"tp{degree}"


def parse_shard_key(key: str) -> tuple[int, bool] | None:
    """``(degree, sequence_parallel)`` of a key :func:`shard_key` made; None otherwise.

    Example::

        parse_shard_key("tp8-sp"), parse_shard_key("tp1"), parse_shard_key("x")
        # ((8, True), None, None)
    """
    body, sp = (key[:-3], True) if key.endswith("-sp") else (key, False)
    digits = body[2:]
    if not body.startswith("tp") or not digits.isdecimal() or len(digits) > 6:
        return None
    degree = int(digits)
    return (degree, sp) if degree >= 2 else None


TIMING_NAMES = ("forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms")
"""The timings of a layer (and of a shard) that a profile measures."""

Spread = Annotated[
    dict[str, Annotated[list[Milliseconds], Length(2, 2)]], Keys(OneOf(TIMING_NAMES))
]
"""Each timing's spread over the repeats: ``{"forward_ms": [p25, p75], ...}`` (ascending:
checked where a profile is read)."""

Means = Annotated[dict[str, Milliseconds], Keys(OneOf(TIMING_NAMES))]
"""Each timing's mean over the repeats, beside its median: ``{"forward_ms": 1.2871, ...}``
(:mod:`planner.profile.means`)."""


class _ShardKey(Kind):
    """The keys of a ``sharded`` object: a degree's (``tp2``), for timings also with
    sequence parallelism (``tp2-sp``)."""

    def __init__(self, *, params: bool) -> None:
        example = "'tp2'" if params else "'tp2' or 'tp2-sp'"
        super().__init__(f"a key like {example} (degrees 2 to {MAX_TENSOR_PARALLEL})")
        self.params = params

    def check(self, value: Any) -> Any:
        parsed = parse_shard_key(str(value))
        if parsed is None or parsed[0] > MAX_TENSOR_PARALLEL or (self.params and parsed[1]):
            self.fail(value)
        return value


PARAM_KEY: Kind = _ShardKey(params=True)
"""The keys of a layer's ``sharded`` parameters: ``tp2``, ``tp4``, ..."""

SHARD_KEY: Kind = _ShardKey(params=False)
"""The keys of a timing's ``sharded`` entries: ``tp2``, ``tp2-sp``, ..."""


def _degrees(value: Any) -> tuple[int, ...]:
    ok = isinstance(value, list) and 0 < len(value) <= 16 and len(set(value)) == len(value)
    ok = ok and all(
        isinstance(t, int) and not isinstance(t, bool) and 2 <= t <= MAX_TENSOR_PARALLEL
        for t in value
    )
    if not ok:
        DEGREES.fail(value)
    return tuple(sorted(value))


DEGREES = Kind(f"distinct degrees from 2 to {MAX_TENSOR_PARALLEL}", _degrees)
"""A profile's tensor-parallel degrees: 1 to 16 distinct, read in increasing order."""


@dataclass(frozen=True)
class Collective:
    """One collective a layer's shard issues on its tensor-parallel group, per microbatch.

    ``bytes``: the whole tensor (see the module docstring); ``phase``: ``"forward"`` or
    ``"backward"``.
    """

    op: Annotated[str, OneOf(COLLECTIVE_OPS)]
    bytes: ByteCount
    phase: Annotated[str, OneOf(PHASES)]

    def ring_bytes(self, degree: int) -> float:
        """Bytes each rank sends (and receives) in a ring over ``degree`` ranks.

        Example::

            Collective("all_reduce", 100, "forward").ring_bytes(4)      # 150.0
            Collective("reduce_scatter", 100, "forward").ring_bytes(4)  # 75.0
        """
        share = (degree - 1) / degree * self.bytes
        return 2 * share if self.op == "all_reduce" else share

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "bytes": self.bytes, "phase": self.phase}


def pass_costs_dict(timing: Any) -> dict[str, Any]:
    """The fields a layer's timing and a shard's share, as the profile writes them: the four
    times, the output and saved bytes, and the workspace where it is not 0.

    Example::

        pass_costs_dict(profile.measurement(1).layers[0])["forward_ms"]
    """
    out: dict[str, Any] = {
        "forward_ms": timing.forward_ms,
        "backward_ms": timing.backward_ms,
        "backward_input_ms": timing.backward_input_ms,
        "backward_weight_ms": timing.backward_weight_ms,
        "output_bytes": timing.output_bytes,
        "saved_bytes": timing.saved_bytes,
    }
    if timing.workspace_bytes:
        out["workspace_bytes"] = timing.workspace_bytes
    return out


@dataclass
class ShardTiming:
    """One rank's shard of a layer at one microbatch size and one tensor-parallel setting.

    The times are the shard's own compute, without its collectives (those are listed, and
    timed on the group's links by the simulator); the fields mean what
    :class:`planner.profile.schema.LayerTiming`'s do, for one rank.
    """

    forward_ms: Milliseconds
    backward_ms: Milliseconds
    backward_input_ms: Milliseconds
    backward_weight_ms: Milliseconds
    output_bytes: ByteCount
    saved_bytes: ByteCount
    workspace_bytes: ByteCount = 0
    collectives: Annotated[tuple[Collective, ...], Length(0, MAX_COLLECTIVES)] = ()
    spread: Spread = field(default_factory=dict)
    # The file's means beside its medians; read in, the fields hold the means and
    # ``median`` the file's values (planner.profile.means).
    mean: Means = field(default_factory=dict)
    median: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def collective_bytes(self, phase: str) -> int:
        """The whole-tensor bytes of this shard's collectives in ``phase``.

        Example::

            timing.collective_bytes("backward")
        """
        return sum(c.bytes for c in self.collectives if c.phase == phase)

    def to_dict(self) -> dict[str, Any]:
        out = timing_fields(self, pass_costs_dict(self))
        if self.collectives:
            out["collectives"] = [c.to_dict() for c in self.collectives]
        if self.spread:
            out["spread"] = self.spread
        return out


@dataclass(frozen=True)
class ShardParams:
    """One rank's share of a layer's parameters under a tensor-parallel degree (sharded
    weights divided, replicated ones, e.g. norms, whole)."""

    param_count: ByteCount
    param_bytes: ByteCount
    optimizer_state_bytes: ByteCount
    optimizer_ms: Milliseconds = 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "param_count": self.param_count,
            "param_bytes": self.param_bytes,
            "optimizer_state_bytes": self.optimizer_state_bytes,
        }
        if self.optimizer_ms:
            out["optimizer_ms"] = self.optimizer_ms
        return out


@dataclass(frozen=True)
class TensorParallelInfo:
    """What the profile's tensor-parallel entries cover: the degrees (each with and, where
    ``sequence_parallel``, also without sequence parallelism), and where the plan that
    splits the weights came from (``"tp_plan"`` of model.py, ``"base_model_tp_plan"`` of a
    Hugging Face model)."""

    degrees: Annotated[tuple[int, ...], DEGREES]
    sequence_parallel: Annotated[bool, Default(False)]
    plan_source: Annotated[Name, Default("")]

    def keys(self) -> list[str]:
        """Every timing key the profile holds per layer.

        Example::

            TensorParallelInfo((2, 4), True, "tp_plan").keys()
            # ['tp2', 'tp2-sp', 'tp4', 'tp4-sp']
        """
        out = []
        for t in self.degrees:
            out.append(shard_key(t))
            if self.sequence_parallel:
                out.append(shard_key(t, sequence_parallel=True))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "degrees": list(self.degrees),
            "sequence_parallel": self.sequence_parallel,
            "plan_source": self.plan_source,
        }
