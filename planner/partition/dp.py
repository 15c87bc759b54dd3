"""Exact dynamic program: partition a chain of layers over a fixed sequence of device slots.

A *slot* is the device group of one stage (one device, or several data-parallel replicas).
Given the slots in pipeline order, :func:`partition_chain` finds the contiguous layer ranges
(and per-stage recompute) that minimise the bottleneck per-microbatch time

    max over stages k of  compute_k / (speed_k * replicas_k) + allreduce_k / M + link_k

where ``link_k`` is the transfer of stage ``k``'s output to stage ``k+1`` on the actual link
between their slots, while every stage fits in its slot's memory with the schedule's
in-flight microbatches. This is exact for the model above on any slot sequence, so on a
chain of identical devices over a uniform or hierarchical network (where the device order
fixes every link) it is the optimum partition; the simulator then judges fill/drain.

Costs come from :mod:`planner.cost` as prefix sums (every stage cost there is a sum over
layers, the workspace a maximum), so one call is ``O(S * L^2)`` vectorised numpy work.

Example::

    costs = layer_costs(profile, microbatch_size=4)
    slots = [Slot(("gpu0",), 1.0, 80 * 2**30), Slot(("gpu1",), 1.0, 80 * 2**30)]
    result = partition_chain(costs, slots, in_flight=[2, 1], num_microbatches=8)
    result.ranges   # [(0, 5), (6, 11)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.cost import stage_input_bytes, stage_times
from planner.profile.schema import Profile

__all__ = [
    "ChainPartition",
    "LayerCosts",
    "Linear",
    "NO_FIT",
    "PLAIN",
    "RECOMPUTE",
    "Slot",
    "layer_costs",
    "partition_chain",
    "partition_chain_depths",
]

_INF = float("inf")


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs of a profile at one microbatch size, as prefix arrays (speed 1.0).

    ``fwd[j] - fwd[i]`` is the forward time of layers ``i..j-1``; likewise ``bwd``,
    ``static`` (weights + gradients + optimizer state), ``params`` and ``saved``.
    ``input_bytes[i]`` enters a stage starting at layer ``i``; ``cut_bytes[j]`` crosses the
    cut after layer ``j`` (0 after the last layer); ``workspace[i, j]`` is the largest
    workspace of layers ``i..j``, ``rebuilt[i, j]`` their largest ``saved_bytes`` (what a
    stage that checkpoints each layer rebuilds at once).
    """

    microbatch_size: int
    fwd: np.ndarray
    bwd: np.ndarray
    static: np.ndarray
    params: np.ndarray
    saved: np.ndarray
    input_bytes: np.ndarray
    cut_bytes: np.ndarray
    workspace: np.ndarray
    rebuilt: np.ndarray
    # Per-slot-kind cost tables, filled by the DP (not part of the value).
    cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_layers(self) -> int:
        return len(self.fwd) - 1


def layer_costs(profile: Profile, microbatch_size: int) -> LayerCosts:
    """Prefix sums of the per-layer costs of ``profile`` at ``microbatch_size``.

    Example::

        costs = layer_costs(profile, 4)
        costs.fwd[-1]    # forward time of the whole model, ms
    """
    n = profile.num_layers
    timing = profile.measurement(microbatch_size).layers
    # Take each layer's times from the cost model itself so the two never disagree.
    per = [stage_times(profile, i, i, microbatch_size) for i in range(n)]
    fwd = np.concatenate([[0.0], np.cumsum([t.forward_ms for t in per])])
    bwd = np.concatenate([[0.0], np.cumsum([t.backward_ms for t in per])])
    layers = profile.layers
    static = np.concatenate(
        [
            [0.0],
            np.cumsum(
                [ly.param_bytes + ly.gradient_bytes + ly.optimizer_state_bytes for ly in layers]
            ),
        ]
    )
    params = np.concatenate([[0.0], np.cumsum([ly.param_bytes for ly in layers])])
    saved = np.concatenate([[0.0], np.cumsum([t.saved_bytes for t in timing])])
    inputs = np.array(
        [stage_input_bytes(profile, i, microbatch_size) for i in range(n)], dtype=float
    )
    cuts = np.array(
        [profile.cut_bytes(microbatch_size, j) for j in range(n - 1)] + [0], dtype=float
    )
    workspace = _running_max([t.workspace_bytes for t in timing])
    rebuilt = _running_max([t.saved_bytes for t in timing])
    return LayerCosts(
        microbatch_size=microbatch_size,
        fwd=fwd,
        bwd=bwd,
        static=static,
        params=params,
        saved=saved,
        input_bytes=inputs,
        cut_bytes=cuts,
        workspace=workspace,
        rebuilt=rebuilt,
    )


def _running_max(values: Sequence[float]) -> np.ndarray:
    """``out[i, j]``: the largest of ``values[i..j]`` (0 below the diagonal)."""
    v = np.asarray(values, dtype=float)
    out = np.zeros((len(v), len(v)))
    for i in range(len(v)):
        out[i, i:] = np.maximum.accumulate(v[i:])
    return out


@dataclass(frozen=True)
class Linear:
    """A cost linear in bytes: ``latency_ms + nbytes * ms_per_byte`` (transfers, all-reduce)."""

    latency_ms: float = 0.0
    ms_per_byte: float = 0.0

    def __call__(self, nbytes: np.ndarray | float) -> np.ndarray | float:
        return self.latency_ms + np.asarray(nbytes) * self.ms_per_byte

    @classmethod
    def fit(cls, fn: Callable[[float], float], scale: float = 2.0**30) -> Linear:
        """The line through ``fn(0)`` and ``fn(scale)`` (exact for latency + bytes/bandwidth)."""
        at0 = float(fn(0.0))
        return cls(latency_ms=at0, ms_per_byte=(float(fn(scale)) - at0) / scale)


@dataclass(frozen=True)
class Slot:
    """The device group of one stage: its devices, the speed and memory of the weakest one,
    and the all-reduce cost of its replicas' gradients."""

    devices: tuple[str, ...]
    speed: float
    memory_bytes: float
    allreduce: Linear | None = None

    @property
    def replicas(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class ChainPartition:
    """The DP's answer: layer ranges and recompute flags per stage, and its bottleneck."""

    ranges: list[tuple[int, int]]
    recompute: list[bool]
    bottleneck_ms: float
    stage_ms: list[float]


# What a stage of layers i..j is on a slot with so many microbatches held: it does not fit,
# it fits as it is, or it fits with recompute (:meth:`_Tables.fits`). One byte a cell, so
# that the tables of a big sweep (the mesh grid of PTD-P 529.6B: 20,464 of them over 716
# slot kinds) hold 11 KB each, not the 103 KB of a float matrix and its recompute mask.
NO_FIT, PLAIN, RECOMPUTE = 0, 1, 2


class _Tables:
    """What a stage of layers ``i..j`` costs on one kind of slot, for every ``(i, j)``.

    Everything but the in-flight count and the outgoing link is fixed per slot kind, so it
    is computed once and cached on the :class:`LayerCosts`; per microbatches held only
    which cells fit, and how, is kept (:meth:`fits`), the times read from them
    (:meth:`ms`, :meth:`ms_at`).
    """

    def __init__(
        self, costs: LayerCosts, slot: Slot, weight_versions: int, num_microbatches: int
    ) -> None:
        n = costs.num_layers
        i = np.arange(n)[:, None]
        j = np.arange(n)[None, :]
        self.valid = i <= j
        fwd = costs.fwd[j + 1] - costs.fwd[i]
        bwd = costs.bwd[j + 1] - costs.bwd[i]
        static = costs.static[j + 1] - costs.static[i]
        static = static + (weight_versions - 1) * (costs.params[j + 1] - costs.params[i])
        self.saved = costs.saved[j + 1] - costs.saved[i]
        self.base = static + costs.workspace
        self.inputs = np.broadcast_to(costs.input_bytes[:, None], (n, n))
        # Each layer checkpointed on its own: every layer's input stashed, the largest
        # layer's activations rebuilt at once (planner.solve.memory.recompute_units).
        stash = np.concatenate([[0.0], np.cumsum(costs.input_bytes)])
        self.layer_inputs = stash[j + 1] - stash[i]
        self.rebuilt = costs.rebuilt
        self.limit = slot.memory_bytes
        self.replicas = slot.replicas
        r = slot.replicas
        extra: np.ndarray | float = 0.0
        if slot.allreduce is not None and r > 1:
            extra = slot.allreduce(costs.params[j + 1] - costs.params[i]) / max(num_microbatches, 1)
        self.t_off = (fwd + bwd) / (slot.speed * r) + extra
        self.t_on = self.t_off + fwd / (slot.speed * r)
        # The DP asks for the same (held, recompute) many times across depths and shapes.
        self._fits: dict[tuple[int, bool], np.ndarray] = {}

    def fits(self, in_flight: int, allow_recompute: bool) -> np.ndarray:
        """Per ``(i, j)``: :data:`NO_FIT`, :data:`PLAIN` or :data:`RECOMPUTE` (recompute is
        what makes it fit) with ``in_flight`` microbatches in the stage; a read-only int8
        array, computed once per microbatches held.

        Example::

            table.fits(4, True)[0, 5]   # 2: layers 0..5 fit with recompute
        """
        # Replicas take microbatches round robin, so each stashes its share of the stage's.
        held = -(-in_flight // self.replicas)
        key = (held, allow_recompute)
        hit = self._fits.get(key)
        if hit is None:
            hit = self._fits[key] = self._fit(held, allow_recompute)
        return hit

    def _fit(self, held: int, allow_recompute: bool) -> np.ndarray:
        mem_off = self.base + held * self.saved
        fits = mem_off <= self.limit
        kind = np.where(fits & self.valid, PLAIN, NO_FIT).astype(np.int8)
        if allow_recompute:
            whole = held * self.inputs + (self.saved if held > 0 else 0.0)
            each = held * self.layer_inputs + (self.rebuilt if held > 0 else 0.0)
            mem_on = self.base + np.minimum(whole, each)
            kind[~fits & (mem_on <= self.limit) & self.valid] = RECOMPUTE
        kind.setflags(write=False)
        return kind

    def ms(self, kind: np.ndarray, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The per-microbatch cost of the stages starting and ending in ``lo .. hi - 1``
        (all by default) of :meth:`fits`'s ``kind``: inf where it does not fit, the time
        with recompute where recompute makes it fit.

        Example::

            table.ms(table.fits(4, True), 2, 9)   # 7 x 7 ms
        """
        cells = (slice(lo, hi), slice(lo, hi))
        k = kind[cells]
        plain = np.where(k == PLAIN, self.t_off[cells], _INF)
        return np.where(k == RECOMPUTE, self.t_on[cells], plain)

    def ms_at(self, kind: np.ndarray, i: int, j: int) -> float:
        """:meth:`ms` of the one stage of layers ``i..j``.

        Example::

            table.ms_at(table.fits(4, True), 0, 5)   # ms, or inf
        """
        k = int(kind[i, j])
        if k == RECOMPUTE:
            return float(self.t_on[i, j])
        return float(self.t_off[i, j]) if k == PLAIN else _INF


def _tables(costs: LayerCosts, slot: Slot, weight_versions: int, num_microbatches: int) -> _Tables:
    key = (
        slot.speed,
        slot.memory_bytes,
        slot.replicas,
        slot.allreduce,
        weight_versions,
        num_microbatches,
    )
    hit = costs.cache.get(key)
    if hit is None:
        hit = costs.cache[key] = _Tables(costs, slot, weight_versions, num_microbatches)
    return hit


def partition_chain(
    costs: LayerCosts,
    slots: Sequence[Slot],
    *,
    in_flight: Sequence[int],
    num_microbatches: int,
    links: Sequence[Linear] | None = None,
    weight_versions: int = 1,
    allow_recompute: bool = True,
) -> ChainPartition | None:
    """Min-bottleneck partition of all layers into ``len(slots)`` non-empty stages, in order.

        ``in_flight[k]`` is how many microbatches stage ``k`` keeps stashed under the schedule
    (over all its replicas);
        ``links[k]`` is the transfer time from slot ``k`` to ``k+1``
        (omit for free communication). Returns None when no partition fits in memory.

        Example::

            part = partition_chain(costs, slots, in_flight=[4, 3, 2, 1], num_microbatches=8)
            part.ranges, part.recompute, part.bottleneck_ms
    """
    n = costs.num_layers
    s_count = len(slots)
    if s_count == 0 or s_count > n:
        return None
    # Stage k (of S) starts and ends within layers k .. n - S + k (every stage holds at
    # least one layer), so only that square of its cost matrix is read: outside it every
    # cell is infeasible or unreachable, and the first minimum in every reachable column is
    # the same as over the whole matrix (the answers are identical to the full DP's).
    value = np.full(n, _INF)  # value[j]: best bottleneck of layers 0..j in k+1 stages
    choice: list[np.ndarray] = []
    mats: list[tuple[_Tables, np.ndarray, np.ndarray | None]] = []
    for k, slot in enumerate(slots):
        table = _tables(costs, slot, weight_versions, num_microbatches)
        kind = table.fits(in_flight[k], allow_recompute)
        row = None
        if links is not None and k < s_count - 1:
            row = np.asarray(links[k](costs.cut_bytes))
        mats.append((table, kind, row))
        lo, hi = k, n - s_count + k + 1  # rows and columns lo .. hi - 1
        sub = table.ms(kind, lo, hi)
        if row is not None:
            sub = sub + row[None, lo:hi]
        if k == 0:
            value = np.full(n, _INF)
            value[lo:hi] = sub[0]
            choice.append(np.zeros(n, dtype=int))
            continue
        prev = value[lo - 1 : hi - 1]  # prev[i - lo] = value[i - 1]
        combined = np.maximum(prev[:, None], sub)
        best = np.argmin(combined, axis=0)  # first minimum: deterministic
        value = np.full(n, _INF)
        value[lo:hi] = combined[best, np.arange(hi - lo)]
        picked = np.zeros(n, dtype=int)
        picked[lo:hi] = best + lo
        choice.append(picked)
    if not np.isfinite(value[n - 1]):
        return None
    ranges: list[tuple[int, int]] = []
    end = n - 1
    for k in range(s_count - 1, -1, -1):
        start = int(choice[k][end])
        ranges.append((start, end))
        end = start - 1
    ranges.reverse()
    recompute = []
    stage_ms = []
    for (a, b), (table, kind, row) in zip(ranges, mats, strict=True):
        recompute.append(bool(kind[a, b] == RECOMPUTE))
        ms = table.ms_at(kind, a, b)
        stage_ms.append(float(ms + row[b]) if row is not None else ms)
    return ChainPartition(
        ranges=ranges,
        recompute=recompute,
        bottleneck_ms=float(value[n - 1]),
        stage_ms=stage_ms,
    )


def partition_chain_depths(
    costs: LayerCosts,
    slot: Slot,
    *,
    max_stages: int,
    in_flight_from_end: Sequence[int],
    num_microbatches: int,
    link: Linear | None = None,
    weight_versions: int = 1,
    allow_recompute: bool = True,
) -> list[ChainPartition | None]:
    """:func:`partition_chain` on identical slots and links for every number of stages at once.

    The DP runs from the last stage backwards, so a stage's state is its distance ``q`` from
    the end; ``in_flight_from_end[q]`` is its in-flight count (1F1B: ``min(q + 1, M)``,
    GPipe: ``M``). Entry ``S - 1`` of the answer is the best partition into ``S`` stages
    (None if none fits): ``O(max_stages * L^2)`` in all instead of ``O(max_stages^2 * L^2)``.

    Example::

        parts = partition_chain_depths(costs, slot, max_stages=8,
                                       in_flight_from_end=[1, 2, 3, 4, 5, 6, 7, 8],
                                       num_microbatches=8)
        parts[3].ranges      # the best 4-stage partition
    """
    n = costs.num_layers
    top = min(max_stages, n)
    table = _tables(costs, slot, weight_versions, num_microbatches)
    link_row = np.asarray(link(costs.cut_bytes)) if link is not None else np.zeros(n)
    kinds: list[np.ndarray] = []
    args: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for q in range(top):
        kind = table.fits(in_flight_from_end[q], allow_recompute)
        kinds.append(kind)
        cost = table.ms(kind)
        if q == 0:
            values.append(cost[:, n - 1].copy())
            args.append(np.full(n, n - 1))
            continue
        with_link = cost + link_row[None, :]
        with_link[:, n - 1] = _INF  # a stage with stages after it cannot end the model
        nxt = np.concatenate([values[-1][1:], [_INF]])  # nxt[j] = V_{q-1}[j + 1]
        combined = np.maximum(with_link, nxt[None, :])
        best = np.argmin(combined, axis=1)  # first minimum: deterministic
        values.append(combined[np.arange(n), best])
        args.append(best)
    out: list[ChainPartition | None] = []
    for s in range(1, top + 1):
        if not np.isfinite(values[s - 1][0]):
            out.append(None)
            continue
        ranges, flags, stage_ms = [], [], []
        start = 0
        for q in range(s - 1, -1, -1):
            end = int(args[q][start])
            ranges.append((start, end))
            flags.append(bool(kinds[q][start, end] == RECOMPUTE))
            extra = float(link_row[end]) if q > 0 else 0.0
            stage_ms.append(table.ms_at(kinds[q], start, end) + extra)
            start = end + 1
        out.append(
            ChainPartition(
                ranges=ranges,
                recompute=flags,
                bottleneck_ms=float(values[s - 1][0]),
                stage_ms=stage_ms,
            )
        )
    return out
