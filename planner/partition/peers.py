"""Peers as practitioners run them: each system's partitioner plus the sweep its users do.

A peer here is not one partition on one stage per device (those rows are kept as the *peer
defaults*, :func:`default_outcomes`) but everything its users would try on the same machine:

- pipeline depth ``d`` over the divisors of the device count, data parallelism ``N / d``
  over the rest, devices in the topology's order (as ``CUDA_VISIBLE_DEVICES`` lists them);
- every profiled microbatch size the batch allows, the same global batch (each of the
  ``N / d`` pipelines runs ``M / (N / d)`` microbatches, so ``M`` must divide evenly);
- the peer's own schedules; recompute (activation checkpointing, all stages) only where
  memory needs it, as users switch it on.

Each configuration is judged by pipeplan's own simulator with the same profile and
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
of a lower bound per sample (:func:`planner.partition.bounds.search_bound_ms`: the
simulator's bound, or the busiest device's compute + all-reduce + step, whichever is
larger), and a peer's search stops at the first whose bound is no better than the best
time found; one whose weights, gradients and optimizer state alone overflow a device is
passed over (:func:`planner.partition.bounds.overflows_memory`); the answer is the same
as simulating all of them.

Example::

    best = tune_peers(profile, topology, [(4, 16), (8, 8)])
    for peer in best:
        print(peer.peer, peer.describe(), peer.iteration_ms)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from planner.errors import InputError
from planner.partition import baselines as bl
from planner.partition.bounds import overflows_memory, search_bound_ms
from planner.plan import StageSpec
from planner.profile.schema import Profile
from planner.schedule.families import family
from planner.shape import PlanShape
from planner.simulate import simulate_shape

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "PEERS",
    "Peer",
    "PeerBest",
    "PeerConfig",
    "PeerJudge",
    "PeerRun",
    "default_outcomes",
    "peer_configurations",
    "place_consecutively",
    "pipedream_levels",
    "tune_peers",
]

Ranges = list[tuple[int, int]]
# (microbatch size, number of microbatches) pairs: what the global batch allows.
Setting = tuple[int, int]

# Virtual stages per device tried for interleaved schedules.
_VIRTUAL = (2, 3, 4)
# The peer defaults with one stage per device: their labels and partition methods.
_DEFAULTS = (
    ("uniform", "uniform"),
    ("parameter-balanced", "parameters"),
    ("time-balanced", "balance_by_time"),
)


@dataclass(frozen=True)
class Peer:
    """A peer system: its partition methods, schedules and device layout.

    Example::

        Peer("DeepSpeed", ("uniform", "parameters"), ("1f1b",))
    """

    name: str
    partitions: tuple[str, ...]
    schedules: tuple[str, ...]
    layout: str = "pipe-major"  # or "replica-major"


PEERS: tuple[Peer, ...] = (
    Peer("DeepSpeed", ("uniform", "parameters"), ("1f1b",)),
    Peer("torchgpipe", ("balance_by_time",), ("gpipe",), layout="replica-major"),
    Peer("Megatron-LM", ("equal layers",), ("1f1b", "interleaved")),
    Peer(
        "torch.distributed.pipelining",
        ("equal split",),
        ("gpipe", "1f1b", "interleaved", "zb"),
    ),
    Peer("PipeDream", ("pipedream",), ("1f1b",)),
    Peer("data parallel", ("one stage",), ("1f1b",)),
)


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

    @property
    def recompute(self) -> bool:
        """Whether activations are recomputed (users switch it on for every stage)."""
        return any(s.recompute for s in self.shape.stages)

    def describe(self) -> str:
        """``partition, depth x dp, mb size x count, schedule[, recompute]``."""
        s = self.shape
        if self.partition == "pipedream":
            layout = "+".join(str(len(st.devices)) for st in s.stages) + " replicas"
        else:
            layout = f"{self.depth}x{self.data_parallel}"
        sched = s.schedule + (f" v={s.virtual_stages}" if s.virtual_stages > 1 else "")
        text = f"{self.partition}, {layout}, mb {s.microbatch_size} x {s.num_microbatches}"
        return text + f", {sched}" + (", recompute" if self.recompute else "")


@dataclass(frozen=True)
class PeerRun:
    """A simulated configuration."""

    config: PeerConfig
    iteration_ms: float
    feasible: bool  # runs (the schedule accepts the shape) and fits every device's memory

    @property
    def per_sample_ms(self) -> float:
        return self.iteration_ms / self.config.shape.samples


@dataclass(frozen=True)
class PeerBest:
    """A peer's best configuration (``best`` None when none runs and fits).

    Example::

        best.peer, best.describe(), best.iteration_ms, best.feasible
    """

    peer: str
    best: PeerRun | None
    configurations: int  # runnable configurations considered
    simulations: int  # of which simulated (or found simulated); the rest were bounded out
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.best is not None and self.best.feasible

    @property
    def iteration_ms(self) -> float | None:
        return self.best.iteration_ms if self.best is not None else None

    @property
    def per_sample_ms(self) -> float:
        return self.best.per_sample_ms if self.feasible and self.best else math.inf

    def describe(self) -> str:
        if self.best is None:
            return self.reason or "no configuration"
        return self.best.config.describe()


@dataclass
class PeerJudge:
    """Times configurations with pipeplan's simulator (cached), and bounds them cheaply.

    Example::

        judge = PeerJudge(profile, topology)
        run = judge.run(config)
    """

    profile: Profile
    topology: Topology
    # Another way to time a configuration: ``(iteration ms, fits)``, e.g. through the
    # solver's own cache of simulations (solve shares it with its search).
    simulator: Callable[[PeerConfig], tuple[float, bool]] | None = None
    cache: dict[PeerConfig, PeerRun] = field(default_factory=dict)
    simulations: int = 0
    # PipeDream's stages per microbatch size, or why it has none: its DP is the costliest
    # partitioner, and both its sweep and the peer defaults ask for them.
    pipedream: dict[int, list[tuple[int, int, int]] | str] = field(default_factory=dict)
    # Each named partition by (method, microbatch size, stages), or why it has none: every
    # schedule and number of microbatches of a depth asks for the same one.
    partitions: dict[tuple[str, int, int], Ranges | str] = field(default_factory=dict)
    # Bounds per sample by what they depend on (stages, recompute, schedule, batch).
    bounds: dict[PlanShape, float] = field(default_factory=dict)

    def partition(self, method: str, microbatch_size: int, chunks: int) -> Ranges | str:
        """``chunks`` contiguous ranges by the named method, or the reason it gives none
        (computed once per arguments).

        Example::

            judge.partition("parameters", 4, 8)   # [(0, 2), (3, 5), ...]
        """
        key = (method, microbatch_size, chunks)
        hit = self.partitions.get(key)
        if hit is None:
            try:
                hit = _partition(self.profile, method, microbatch_size, chunks)
            except InputError as exc:
                hit = str(exc)
            self.partitions[key] = hit
        return hit

    def pipedream_stages(self, microbatch_size: int) -> list[tuple[int, int, int]] | str:
        """PipeDream's ``(first, last, replicas)`` stages on this topology (its levels from
        :func:`pipedream_levels`), or the reason it gives none; computed once per size.

        Example::

            judge.pipedream_stages(4)   # [(0, 9, 3), (10, 11, 1)]
        """
        hit = self.pipedream.get(microbatch_size)
        if hit is None:
            try:
                hit = bl.pipedream_partition(
                    self.profile, microbatch_size, pipedream_levels(self.topology)
                )
            except InputError as exc:
                hit = str(exc)
            self.pipedream[microbatch_size] = hit
        return hit

    def run(self, config: PeerConfig) -> PeerRun:
        """Simulate ``config``; a shape the schedule cannot run is an infeasible run."""
        hit = self.cache.get(config)
        if hit is not None:
            return hit
        self.simulations += 1
        if self.simulator is not None:
            ms, fits = self.simulator(config)
            run = PeerRun(config, ms, fits and math.isfinite(ms))
            self.cache[config] = run
            return run
        try:
            res = simulate_shape(self.profile, self.topology, config.shape)
        except InputError:
            run = PeerRun(config, math.inf, False)
        else:
            fits = all(
                b <= self.topology.device(d).memory_bytes for d, b in res.memory_bytes.items()
            )
            run = PeerRun(config, float(res.iteration_ms), fits)
        self.cache[config] = run
        return run

    def bound_per_sample(self, config: PeerConfig) -> float:
        """A lower bound of ``config``'s simulated time, per sample
        (:func:`planner.partition.bounds.search_bound_ms`); peers whose configurations
        coincide (DeepSpeed's uniform split, Megatron's and torch's equal ones) share it."""
        s = config.shape
        hit = self.bounds.get(s)
        if hit is None:
            bound = search_bound_ms(
                self.profile,
                self.topology,
                list(s.stages),
                s.schedule,
                s.num_microbatches,
                s.microbatch_size,
            )
            hit = self.bounds[s] = bound / s.samples
        return hit

    def overflows(self, config: PeerConfig) -> bool:
        """Whether ``config`` cannot fit with or without recompute: a device's weights,
        gradients and optimizer state alone exceed its memory
        (:func:`planner.partition.bounds.overflows_memory`); nothing to simulate."""
        s = config.shape
        return overflows_memory(self.profile, self.topology, list(s.stages), s.schedule)

    def settle(self, config: PeerConfig) -> PeerRun:
        """Without recompute, or with recompute on every stage where memory needs it."""
        plain = self.run(config)
        if plain.feasible or math.isinf(plain.iteration_ms):
            return plain
        checkpointed = self.run(_with_recompute(config))
        return checkpointed if checkpointed.feasible else plain


def _with_recompute(config: PeerConfig) -> PeerConfig:
    shape = config.shape.with_recompute([True] * len(config.shape.stages))
    return dataclasses.replace(config, shape=shape)


# --------------------------------------------------------------------------- partitions


def _partition(profile: Profile, method: str, microbatch_size: int, chunks: int) -> Ranges:
    """``chunks`` contiguous ranges by the named method (InputError where it has none)."""
    n = profile.num_layers
    if method in ("uniform", "equal split"):
        return bl.uniform_partition(n, chunks)
    if method == "parameters":
        return bl.parameter_balanced_partition(profile, chunks)
    if method == "balance_by_time":
        return bl.time_balanced_partition(profile, microbatch_size, chunks)
    if method == "equal layers":
        if n % chunks:
            raise InputError(
                f"Megatron-LM needs the {n} layers to divide into {chunks} equal stages",
                field="num_stages",
            )
        return bl.uniform_partition(n, chunks)
    if method == "one stage":
        return [(0, n - 1)]
    raise InputError(f"unknown partition method {method!r}", field="partition")


def _place(names: Sequence[str], depth: int, dp: int, layout: str) -> list[tuple[str, ...]]:
    """Each pipeline stage's replicas, in the order the all-reduce ring visits them."""
    if layout == "replica-major":
        return [tuple(names[j * depth + k] for j in range(dp)) for k in range(depth)]
    return [tuple(names[k * dp : (k + 1) * dp]) for k in range(depth)]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def pipedream_levels(topology: Topology) -> list[tuple[int, float]]:
    """PipeDream's machine hierarchy read off the topology: GPUs per host, then hosts.

    Example::

        pipedream_levels(load_topology("topologies/two-node-ib.yaml"))  # [(8, ...), (2, ...)]
    """
    hosts = list(topology.hosts().values())
    names = topology.device_names()

    def narrowest(pairs: list[tuple[str, str]]) -> float:
        return min((topology.bandwidth(a, b) for a, b in pairs), default=math.inf)

    if len(hosts) > 1 and len({len(h) for h in hosts}) == 1:
        inside = [(a, b) for h in hosts for a, b in itertools.combinations(h, 2)]
        across = [(h[0], g[0]) for h, g in itertools.combinations(hosts, 2)]
        levels = []
        if len(hosts[0]) > 1:
            levels.append((len(hosts[0]), narrowest(inside)))
        levels.append((len(hosts), narrowest(across)))
        return levels
    bw = narrowest(list(itertools.combinations(names, 2)))
    return [(len(names), bw if math.isfinite(bw) else 1e12)]


def place_consecutively(
    stages: Sequence[tuple[int, int, int]], names: Sequence[str]
) -> tuple[StageSpec, ...] | None:
    """PipeDream's ``(first, last, replicas)`` stages on consecutive devices from the first
    (as its runtime ranks them); None where there are too few devices (or no stages).

    Example::

        place_consecutively([(0, 9, 3), (10, 11, 1)], ["gpu0", "gpu1", "gpu2", "gpu3"])
        # (StageSpec(0, (0, 9), ('gpu0', 'gpu1', 'gpu2')), StageSpec(1, (10, 11), ('gpu3',)))
    """
    placed, pos = [], 0
    for i, (a, b, r) in enumerate(stages):
        placed.append(StageSpec(i, (a, b), tuple(names[pos : pos + r])))
        pos += r
    if not placed or pos > len(names):
        return None
    return tuple(placed)


def default_outcomes(
    profile: Profile,
    topology: Topology,
    microbatch_size: int,
    *,
    judge: PeerJudge | None = None,
) -> list[tuple[str, Ranges, list[int], str | None]]:
    """The peer defaults as ``(name, ranges, replicas, reason)``: DeepSpeed uniform and
    parameters and torchgpipe on ``min(layers, devices)`` stages, one device each, and
    PipeDream's own stages and replicas. ``ranges`` is empty and ``reason`` says why where
    the algorithm itself gives no partition (torchgpipe on zero-time layers, PipeDream's
    memory constraint). ``judge`` (of the same profile and topology) shares the partitions
    with the peers' sweep.

    Example::

        for name, ranges, replicas, reason in default_outcomes(profile, topology, 4): ...
    """
    judge = judge or PeerJudge(profile, topology)
    s = min(profile.num_layers, len(topology.devices))
    out: list[tuple[str, Ranges, list[int], str | None]] = []
    for label, method in _DEFAULTS:
        ranges = judge.partition(method, microbatch_size, s)
        if isinstance(ranges, str):
            out.append((label, [], [], ranges))
        else:
            out.append((label, list(ranges), [1] * s, None))
    stages = judge.pipedream_stages(microbatch_size)
    if isinstance(stages, str):
        out.append(("pipedream", [], [], stages))
    elif stages:
        out.append(("pipedream", [(a, b) for a, b, _ in stages], [r for _, _, r in stages], None))
    return out


# ------------------------------------------------------------------------ configurations


def _pipedream_configs(
    peer: Peer, judge: PeerJudge, settings: Sequence[Setting]
) -> Iterator[PeerConfig | str]:
    names = judge.topology.device_names()
    for mb, m in settings:
        stages = judge.pipedream_stages(mb)
        if isinstance(stages, str):
            yield stages
            continue
        placed = place_consecutively(stages, names)
        if placed is None or max(len(s.devices) for s in placed) > m:
            yield f"PipeDream's {len(stages)} stages need more microbatches than {m}"
            continue
        dp = max(len(s.devices) for s in placed)
        for sched in peer.schedules:
            shape = PlanShape(placed, sched, mb, m)
            yield PeerConfig(peer.name, "pipedream", len(stages), dp, shape)


def peer_configurations(
    peer: Peer,
    profile: Profile,
    topology: Topology,
    settings: Sequence[Setting],
    *,
    judge: PeerJudge | None = None,
) -> Iterator[PeerConfig | str]:
    """Every configuration ``peer``'s users could run here; a string says why a
    (depth, partition) has none (its algorithm fails, layers do not divide, ...).
    ``judge`` (of the same profile and topology) keeps the partitions for reuse.

    Example::

        configs = [c for c in peer_configurations(PEERS[0], profile, topology, [(4, 16)])
                   if isinstance(c, PeerConfig)]
    """
    judge = judge or PeerJudge(profile, topology)
    if peer.partitions == ("pipedream",):
        yield from _pipedream_configs(peer, judge, settings)
        return
    names = topology.device_names()
    n = profile.num_layers
    depths = [1] if peer.partitions == ("one stage",) else _divisors(len(names))
    for depth in depths:
        if depth > n:
            continue
        dp = len(names) // depth
        groups = _place(names, depth, dp, peer.layout)
        for mb, m in settings:
            if m % dp:
                continue  # each of the dp pipelines needs the same number of microbatches
            for method in peer.partitions:
                for sched in peer.schedules:
                    for v in _virtual_counts(sched, depth, n):
                        ranges = judge.partition(method, mb, depth * v)
                        if isinstance(ranges, str):
                            yield f"{method} on {depth * v} stages: {ranges}"
                            continue
                        placed = tuple(
                            StageSpec(k, r, groups[k % depth]) for k, r in enumerate(ranges)
                        )
                        shape = PlanShape(placed, sched, mb, m, v)
                        yield PeerConfig(peer.name, method, depth, dp, shape)


def _virtual_counts(schedule: str, depth: int, num_layers: int) -> list[int]:
    if not family(schedule).interleaved:
        return [1]
    if depth < 2:
        return []
    return [v for v in _VIRTUAL if depth * v <= num_layers]


# ------------------------------------------------------------------------------ the sweep


def _best_of(judge: PeerJudge, configs: Sequence[PeerConfig]) -> tuple[PeerRun | None, int]:
    """The fastest feasible run per sample, visiting configurations by lower bound and
    stopping where the bound cannot beat the best found (ties: the earlier configuration);
    one whose static memory overflows a device is passed over unsimulated (it cannot fit).
    Also how many were simulated (or found simulated)."""
    ranked = sorted(
        ((judge.bound_per_sample(c), i, c) for i, c in enumerate(configs)),
        key=lambda x: (x[0], x[1]),
    )
    best: PeerRun | None = None
    best_key = (math.inf, math.inf)
    simulated = 0
    for bound, index, config in ranked:
        if best is not None and bound >= best.per_sample_ms:
            break
        if judge.overflows(config):
            continue
        simulated += 1
        run = judge.settle(config)
        if run.feasible and (run.per_sample_ms, index) < best_key:
            best, best_key = run, (run.per_sample_ms, index)
    return best, simulated


def tune_peers(
    profile: Profile,
    topology: Topology,
    settings: Sequence[Setting],
    *,
    peers: Sequence[Peer] = PEERS,
    schedules: Sequence[str] | None = None,
    judge: PeerJudge | None = None,
) -> list[PeerBest]:
    """Each peer's best configuration over its sweep (see the module docstring).

    ``settings`` are the (microbatch size, number of microbatches) pairs the batch allows,
    as :func:`planner.solve.solve` searches them. ``schedules`` replaces every peer's own
    schedules (what ``solve --schedule`` asks for).

    Example::

        for best in tune_peers(profile, topology, [(4, 16)]):
            best.peer, best.describe(), best.iteration_ms
    """
    judge = judge or PeerJudge(profile, topology)
    out = []
    for peer in peers:
        if schedules is not None and peer.partitions != ("one stage",):
            peer = Peer(peer.name, peer.partitions, tuple(schedules), peer.layout)
        configs: list[PeerConfig] = []
        reasons: list[str] = []
        for c in peer_configurations(peer, profile, topology, settings, judge=judge):
            if isinstance(c, str):
                reasons.append(c)
            else:
                configs.append(c)
        best, simulated = _best_of(judge, configs)
        reason = None
        if best is None:
            reason = _why_none(configs, reasons)
        out.append(PeerBest(peer.name, best, len(configs), simulated, reason))
    return out


def _why_none(configs: Sequence[PeerConfig], reasons: Sequence[str]) -> str:
    if configs:
        return f"none of its {len(configs)} configurations fits in memory or runs"
    if reasons:
        return reasons[0]
    return "no configuration divides the batch and the devices"
