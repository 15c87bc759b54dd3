"""Peers as practitioners run them: each system's partitioner plus the sweep its users do.

A peer here is not one partition on one stage per device (those rows are kept as the *peer
defaults*, :func:`planner.solve.peer_partitions.default_outcomes`) but everything its users
would try on the same machine: a named generator of :class:`~planner.shape.PlanShape`
(:meth:`Peer.configurations`: its partitioner and its sweep),

- pipeline depth ``d`` over the divisors of the device count, data parallelism ``N / d``
  over the rest, devices in the topology's order (as ``CUDA_VISIBLE_DEVICES`` lists them);
- every profiled microbatch size the batch allows, the same global batch (each of the
  ``N / d`` pipelines runs ``M / (N / d)`` microbatches, so ``M`` must divide evenly);
- the peer's own schedules; recompute (activation checkpointing, all stages) only where
  memory needs it, as users switch it on.

Each configuration is scored by the search's own code (:class:`planner.solve.search.Search`:
one cache of simulations, one fits check, one bound per sample), with the same profile and
topology, and the fastest one per sample that fits is the peer's best.

- **DeepSpeed**: ``partition_method`` ``uniform`` or ``parameters``; 1F1B; pipe-major.
- **torchgpipe**: ``balance_by_time``; GPipe; replica-major.
- **Megatron-LM**: equal layers per stage (``d`` divides the layers); 1F1B, and interleaved
  with ``v`` chunks per device where ``d * v`` divides the layers; pipe-major.
- **torch.distributed.pipelining**: equal split (the first stages take the remainder);
  GPipe, 1F1B, interleaved (``v`` = 2, 3, 4) and zero-bubble; pipe-major.
- **PipeDream**: its own optimizer's stages and replicas (consecutive devices); 1F1B
  (PipeDream-Flush).
- **data parallel**: one stage on every device (DDP with gradient accumulation).

*pipe-major*: stage ``k``'s replicas are devices ``k * dp .. k * dp + dp - 1`` (DeepSpeed's
``PipeDataParallelTopology`` and Megatron's rank order put the data-parallel axis innermost);
*replica-major*: torchgpipe is one process driving ``d`` consecutive GPUs, so with DDP over
processes replica ``j`` holds devices ``j * d .. j * d + d - 1`` and stage ``k``'s replicas
are ``k, d + k, 2d + k, ...``. A replica's microbatches go through its own pipeline
(microbatch ``i`` on replica ``i % dp`` of every stage), which is exactly ``dp``
independent pipelines plus one all-reduce per stage.

torch.distributed.pipelining's zero-bubble schedules interleave several stages per rank; the
simulator's ``zb`` is ZB-H1 with one stage per rank (the same split backward without the
interleaving). PipeDream's own schedule is asynchronous (weight stashing); it is judged with
PipeDream-Flush (1F1B), the synchronous schedule of the same authors, as every plan here
has synchronous semantics.

Simulating every configuration is avoided exactly: configurations are visited in the order
of a lower bound per sample (:meth:`~planner.solve.search.Search.bound_per_sample`: the
simulator's bound, or the busiest device's compute + all-reduce + step, whichever is
larger; infinite where the weights, gradients and optimizer state alone overflow a device),
and a peer's search stops at the first whose bound is no better than the best time found;
one that overflows is passed over; the answer is the same as simulating all of them. A
configuration that does not fit without recompute is checkpointed only where the bound of
the checkpointed plan (its second forward counted) can still beat the peer's best time
(strictly above it, it could not become the peer's best: it is left to whoever meets it
later, :meth:`~planner.solve.search.Search.pass_over`).

Example::

    best = tune_peers(Search(profile, topology), [(4, 16), (8, 8)])
    for peer in best:
        print(peer.peer, peer.describe(), peer.iteration_ms)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from planner.profile.schema import Profile
from planner.schedule.families import family
from planner.shape import PlanShape
from planner.solve.peer_partitions import PeerPartitions, place_consecutively
from planner.solve.scored import Scored
from planner.solve.search import Search, TimeUp
from planner.stages import StageSpec

__all__ = [
    "PEERS",
    "TP_PEERS",
    "Peer",
    "PeerBest",
    "PeerConfig",
    "Setting",
    "peers_for",
    "settle",
    "tune_peers",
]

# (microbatch size, number of microbatches) pairs: what the global batch allows.
Setting = tuple[int, int]

# Virtual stages per device tried for interleaved schedules.
_VIRTUAL = (2, 3, 4)


@dataclass(frozen=True)
class PeerConfig:
    """One configuration a peer's user could run: the plan shape it gives (stages,
    schedule, microbatching; recompute in the stages, all or none), named by the peer, its
    partition method and its depth x data parallel.

    Example::

        config.describe()   # 'parameters, 4x2, mb 8 x 16, 1f1b'
    """

    peer: str
    partition: str
    depth: int
    data_parallel: int
    shape: PlanShape
    checkpoint_layers: bool = True  # Peer.checkpoint_layers

    @property
    def recompute(self) -> bool:
        """Whether activations are recomputed (users switch it on for every stage)."""
        return any(s.recompute for s in self.shape.stages)

    def checkpointed(self) -> PeerConfig:
        """The same configuration with activation checkpointing on every stage, in the
        peer's own unit (each layer, or each stage for torchgpipe)."""
        flags = [True] * len(self.shape.stages)
        shape = self.shape.with_recompute(flags, layers=self.checkpoint_layers)
        return dataclasses.replace(self, shape=shape)

    @property
    def tensor_parallel(self) -> int:
        """The tensor-parallel degree of every stage (1 without)."""
        return self.shape.stages[0].tensor_parallel

    def describe(self) -> str:
        """``partition, depth x dp, mb size x count, schedule[, recompute]``; with tensor
        parallelism or sharding ``partition, PP d x DP r x TP t, mb ..., schedule[, SP]
        [, zero1 | fsdp][, recompute]``."""
        s = self.shape
        if self.partition == "pipedream":
            layout = "+".join(str(len(st.devices)) for st in s.stages) + " replicas"
        elif self.tensor_parallel > 1:
            layout = f"PP{self.depth} x DP{self.data_parallel} x TP{self.tensor_parallel}"
        else:
            layout = f"{self.depth}x{self.data_parallel}"
        sched = s.schedule + (f" v={s.virtual_stages}" if s.virtual_stages > 1 else "")
        text = f"{self.partition}, {layout}, mb {s.microbatch_size} x {s.num_microbatches}"
        text += f", {sched}"
        if s.stages[0].sequence_parallel:
            text += ", SP"
        shardings = sorted({st.sharding for st in s.stages} - {"none"})
        if shardings:
            text += ", " + "/".join(shardings)
        return text + (", recompute" if self.recompute else "")


@dataclass(frozen=True)
class Peer:
    """A peer system: its partition methods, schedules and device layout; a named
    generator of plan shapes (:meth:`configurations`).

    Example::

        Peer("DeepSpeed", ("uniform", "parameters"), ("1f1b",))
    """

    name: str
    partitions: tuple[str, ...]
    schedules: tuple[str, ...]
    layout: str = "pipe-major"  # or "replica-major"
    # Tensor parallelism within a node (the profile's degrees, and 1), sequence
    # parallelism where the degree is 2 or more, and the shardings of data parallelism
    # its users choose from (with two or more replicas and a flushing schedule).
    tensor_parallel: bool = False
    sequence_parallel: tuple[bool, ...] = (False,)
    shardings: tuple[str, ...] = ("none",)
    # Activation checkpointing as its users switch it on: each layer (transformer block)
    # under its own checkpoint (Megatron-LM's full recompute, DeepSpeed's, torchtitan's
    # per block), or each partition under one (torchgpipe's checkpoint="always").
    checkpoint_layers: bool = True

    def configurations(
        self, parts: PeerPartitions, settings: Sequence[Setting]
    ) -> Iterator[PeerConfig | str]:
        """Every configuration this peer's users could run here; a string says why a
        (depth, partition) has none (its algorithm fails, layers do not divide, ...).

        Example::

            configs = [c for c in PEERS[0].configurations(PeerPartitions(profile, topology),
                                                          [(4, 16)]) if isinstance(c, PeerConfig)]
        """
        if self.partitions == ("pipedream",):
            yield from self._pipedream(parts, settings)
            return
        names = parts.topology.device_names()
        n = parts.profile.num_layers
        for t in _node_degrees(parts) if self.tensor_parallel else [1]:
            depths = [1] if self.partitions == ("one stage",) else _divisors(len(names) // t)
            for depth in depths:
                if depth > n:
                    continue
                dp = len(names) // (depth * t)
                # Tensor-parallel groups are consecutive ranks (the innermost dimension).
                groups = _place(names, depth, dp * t, self.layout)
                for mb, m in settings:
                    if m % dp:
                        continue  # each of the dp pipelines needs the same number of microbatches
                    for method in self.partitions:
                        yield from self._sweep(parts, method, groups, (t, depth, dp), mb, m)

    def _sweep(
        self,
        parts: PeerPartitions,
        method: str,
        groups: Sequence[tuple[str, ...]],
        sizes: tuple[int, int, int],
        mb: int,
        m: int,
    ) -> Iterator[PeerConfig | str]:
        """One (degree, depth, replicas) placement under every schedule, chunk count,
        sequence parallelism and sharding of the peer's sweep."""
        t, depth, dp = sizes
        n = parts.profile.num_layers
        for sched in self.schedules:
            for v in _virtual_counts(sched, depth, n):
                ranges = parts.partition(method, mb, depth * v)
                if isinstance(ranges, str):
                    yield f"{method} on {depth * v} stages: {ranges}"
                    continue
                where = family(sched).place(groups, v)
                shardings = self.shardings if dp > 1 and family(sched).flush else ("none",)
                for sp in _sequence_settings(parts, self.sequence_parallel, t):
                    for sharding in shardings:
                        placed = tuple(
                            StageSpec(
                                k,
                                r,
                                where[k],
                                tensor_parallel=t,
                                sequence_parallel=sp,
                                sharding=sharding if _has_parameters(parts, r) else "none",
                            )
                            for k, r in enumerate(ranges)
                        )
                        shape = PlanShape(placed, sched, mb, m, v)
                        yield PeerConfig(
                            self.name, method, depth, dp, shape, self.checkpoint_layers
                        )

    def _pipedream(
        self, parts: PeerPartitions, settings: Sequence[Setting]
    ) -> Iterator[PeerConfig | str]:
        names = parts.topology.device_names()
        for mb, m in settings:
            stages = parts.pipedream_stages(mb)
            if isinstance(stages, str):
                yield stages
                continue
            placed = place_consecutively(stages, names)
            if placed is None or max(len(s.devices) for s in placed) > m:
                yield f"PipeDream's {len(stages)} stages need more microbatches than {m}"
                continue
            dp = max(len(s.devices) for s in placed)
            for sched in self.schedules:
                shape = PlanShape(placed, sched, mb, m)
                yield PeerConfig(
                    self.name, "pipedream", len(stages), dp, shape, self.checkpoint_layers
                )


# The peers that tune the same way with or without tensor-parallel entries in the profile.
_DEEPSPEED = Peer("DeepSpeed", ("uniform", "parameters"), ("1f1b",))
_TORCHGPIPE = Peer(
    "torchgpipe",
    ("balance_by_time",),
    ("gpipe",),
    layout="replica-major",
    checkpoint_layers=False,
)
_TORCH_PIPELINING = Peer(
    "torch.distributed.pipelining",
    ("equal split",),
    ("gpipe", "1f1b", "interleaved", "zb"),
)
_PIPEDREAM = Peer("PipeDream", ("pipedream",), ("1f1b",))
_DATA_PARALLEL = Peer("data parallel", ("one stage",), ("1f1b",))

PEERS: tuple[Peer, ...] = (
    _DEEPSPEED,
    _TORCHGPIPE,
    Peer("Megatron-LM", ("equal layers",), ("1f1b", "interleaved")),
    _TORCH_PIPELINING,
    _PIPEDREAM,
    _DATA_PARALLEL,
)


# With tensor-parallel entries in the profile (pipeplan.cost.synthetic_tensor_parallel, or
# the profiler's), Megatron-LM also tunes TP within a node, sequence parallelism and its
# distributed optimizer (ZeRO-1), and three peers of sharded data parallelism join.
TP_PEERS: tuple[Peer, ...] = (
    _DEEPSPEED,
    _TORCHGPIPE,
    Peer(
        "Megatron-LM",
        ("equal layers",),
        ("1f1b", "interleaved"),
        tensor_parallel=True,
        sequence_parallel=(False, True),
        shardings=("none", "zero1"),
    ),
    _TORCH_PIPELINING,
    Peer(
        "torchtitan",
        ("equal split",),
        ("1f1b", "gpipe", "interleaved", "zb"),
        tensor_parallel=True,
        sequence_parallel=(True, False),
        shardings=("fsdp", "none"),
    ),
    _PIPEDREAM,
    _DATA_PARALLEL,
    Peer("DeepSpeed ZeRO-3", ("one stage",), ("1f1b",), shardings=("fsdp",)),
    Peer("FSDP", ("one stage",), ("1f1b",), shardings=("fsdp",)),
)


def peers_for(profile: Profile) -> tuple[Peer, ...]:
    """:data:`TP_PEERS` where the profile has tensor-parallel entries, else :data:`PEERS`
    (so plans of other profiles are what they were).

    Example::

        [p.name for p in peers_for(profile)]
    """
    return PEERS if profile.tensor_parallel is None else TP_PEERS


# Megatron-LM's and torchtitan's tensor parallelism stays within a node, up to 8 GPUs.
MAX_NODE_TP = 8


def _node_degrees(parts: PeerPartitions) -> list[int]:
    """1 and the profile's tensor-parallel degrees that fit in every host (at most
    :data:`MAX_NODE_TP`) and divide the devices (none where a parameter is tied: the
    simulator does not split it)."""
    profile, topo = parts.profile, parts.topology
    info = profile.tensor_parallel
    if info is None or profile.tied_parameters:
        return [1]
    per_host = min(MAX_NODE_TP, *(len(devs) for devs in topo.hosts().values()))
    n = len(topo.devices)
    return [1, *(t for t in sorted(info.degrees) if t <= per_host and n % t == 0)]


def _sequence_settings(
    parts: PeerPartitions, wanted: tuple[bool, ...], degree: int
) -> tuple[bool, ...]:
    """The peer's sequence-parallel settings that the profile can time at ``degree``:
    none but False without tensor parallelism, or where the profile holds no
    sequence-parallel shards (profiled without ``--sequence-parallel``)."""
    info = parts.profile.tensor_parallel
    if degree == 1 or info is None or not info.sequence_parallel:
        return (False,)
    return wanted


def _has_parameters(parts: PeerPartitions, layers: tuple[int, int]) -> bool:
    """Whether these layers hold parameters (sharding a stage without is refused)."""
    a, b = layers
    return any(ly.param_bytes for ly in parts.profile.layers[a : b + 1])


@dataclass(frozen=True)
class PeerBest:
    """A peer's best configuration and its simulation (both None when none runs and
    fits).

    Example::

        best.peer, best.describe(), best.iteration_ms, best.feasible
    """

    peer: str
    config: PeerConfig | None
    scored: Scored | None
    configurations: int  # runnable configurations considered
    simulations: int  # of which simulated (or found simulated); the rest were bounded out
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.scored is not None and self.scored.fits

    @property
    def iteration_ms(self) -> float | None:
        return self.scored.iteration_ms if self.scored is not None else None

    @property
    def per_sample_ms(self) -> float:
        return self.scored.per_sample_ms if self.feasible and self.scored else math.inf

    def describe(self) -> str:
        if self.config is None:
            return self.reason or "no configuration"
        return self.config.describe()


def _place(names: Sequence[str], depth: int, dp: int, layout: str) -> list[tuple[str, ...]]:
    """Each pipeline stage's replicas, in the order the all-reduce ring visits them."""
    if layout == "replica-major":
        return [tuple(names[j * depth + k] for j in range(dp)) for k in range(depth)]
    return [tuple(names[k * dp : (k + 1) * dp]) for k in range(depth)]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _virtual_counts(schedule: str, depth: int, num_layers: int) -> list[int]:
    if not family(schedule).interleaved:
        return [1]
    if depth < 2:
        return []
    return [v for v in _VIRTUAL if depth * v <= num_layers]


# ------------------------------------------------------------------------------ the sweep


def settle(search: Search, config: PeerConfig, beat: float = math.inf) -> tuple[PeerConfig, Scored]:
    """``config`` scored by ``search`` without recompute, or with recompute on every stage
    where memory needs it (as users switch activation checkpointing on): the configuration
    as run and its simulation. ``beat``: the best time per sample the peer has found;
    checkpointed, a configuration whose bound (recompute counted) is above it cannot become
    the peer's best and is passed over (:meth:`Search.pass_over`), not simulated: the
    configuration then counts as not fitting.

    Example::

        config, scored = settle(Search(profile, topology), config)
    """
    origin = f"peer {config.peer}"
    plain = search.refuse_or_simulate(config.shape, origin)
    if plain.fits or plain.infinite():
        return config, plain
    checkpointed = config.checkpointed()
    if not search.met(checkpointed.shape) and search.bound_as_given(checkpointed.shape) > beat:
        search.pass_over(checkpointed.shape, origin)
        return config, plain
    got = search.refuse_or_simulate(checkpointed.shape, origin)
    return (checkpointed, got) if got.fits else (config, plain)


def _best_of(
    search: Search, configs: Sequence[PeerConfig]
) -> tuple[tuple[PeerConfig, Scored] | None, int]:
    """The fastest feasible configuration per sample, visiting configurations by lower
    bound and stopping where the bound cannot beat the best found (ties: the earlier
    configuration); one whose static memory overflows a device is passed over unsimulated
    (it cannot fit). Also how many were simulated (or found simulated)."""
    ranked = sorted(
        ((_bound(search, c), i, c) for i, c in enumerate(configs)),
        key=lambda x: (x[0], x[1]),
    )
    best: tuple[PeerConfig, Scored] | None = None
    best_key = (math.inf, math.inf)
    simulated = 0
    for bound, index, config in ranked:
        if best is not None and bound >= best[1].per_sample_ms:
            break
        if search.overflows(config.shape):
            continue
        simulated += 1
        settled, got = settle(search, config, best_key[0])
        if got.fits and (got.per_sample_ms, index) < best_key:
            best, best_key = (settled, got), (got.per_sample_ms, index)
    return best, simulated


def _bound(search: Search, config: PeerConfig) -> float:
    """``config``'s bound per sample; :class:`TimeUp` once the solve's deadline has passed
    (a sweep of a thousand devices spends seconds on its bounds alone)."""
    if config.shape not in search.bounds:
        search.check_clock(f"peer {config.peer}")
    return search.bound_per_sample(config.shape)


def tune_peers(
    search: Search,
    settings: Sequence[Setting],
    *,
    peers: Sequence[Peer] | None = None,
    schedules: Sequence[str] | None = None,
    parts: PeerPartitions | None = None,
) -> list[PeerBest]:
    """Each peer's best configuration over its sweep (see the module docstring), scored
    through ``search`` (its cache, fits check and bound; a solve passes its own);
    ``peers``: :func:`peers_for` the profile unless given.

    ``settings`` are the (microbatch size, number of microbatches) pairs the batch allows,
    as :func:`planner.solve.solve` searches them. ``schedules`` replaces every peer's own
    schedules (what ``solve --schedule`` asks for). ``parts``: the peers' partitions (of
    the same profile and topology), to share with the peer defaults.

    Example::

        for best in tune_peers(Search(profile, topology), [(4, 16)]):
            best.peer, best.describe(), best.iteration_ms
    """
    parts = parts or PeerPartitions(search.profile, search.topology)
    out = []
    for peer in peers_for(search.profile) if peers is None else peers:
        if schedules is not None and peer.partitions != ("one stage",):
            peer = dataclasses.replace(peer, schedules=tuple(schedules))
        configs: list[PeerConfig] = []
        reasons: list[str] = []
        for c in peer.configurations(parts, settings):
            if isinstance(c, str):
                reasons.append(c)
            else:
                configs.append(c)
        try:
            best, simulated = _best_of(search, configs)
        except TimeUp:
            reason = "not tuned: the solve's time limit passed first"
            out.append(PeerBest(peer.name, None, None, len(configs), 0, reason))
            continue
        if best is None:
            reason = _why_none(configs, reasons)
            out.append(PeerBest(peer.name, None, None, len(configs), simulated, reason))
        else:
            out.append(PeerBest(peer.name, *best, len(configs), simulated))
    return out


def _why_none(configs: Sequence[PeerConfig], reasons: Sequence[str]) -> str:
    if configs:
        return f"none of its {len(configs)} configurations fits in memory or runs"
    if reasons:
        return reasons[0]
    return "no configuration divides the batch and the devices"
