"""The peers' partitioners by name, computed once per arguments, and where each places its
stages: :class:`PeerPartitions` (the cache the tuned peers and the peer defaults share),
:func:`pipedream_levels` (PipeDream's machine hierarchy read off a topology),
:func:`place_consecutively` (PipeDream's stages and replicas on devices) and
:func:`default_outcomes` (the peer defaults: one stage per device).

The partitioners themselves are :mod:`planner.partition.baselines`' and
:mod:`planner.partition.pipedream`'s; this module only names, caches and places them.

Example::

    parts = PeerPartitions(profile, topology)
    parts.partition("parameters", 4, 8)    # [(0, 2), (3, 5), ...] or why there is none
    place_consecutively(parts.pipedream_stages(4), topology.device_names())
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from planner.errors import InputError
from planner.partition import baselines as bl
from planner.profile.schema import Profile
from planner.stages import StageSpec

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "PeerPartitions",
    "Ranges",
    "default_outcomes",
    "pipedream_levels",
    "place_consecutively",
]

Ranges = list[tuple[int, int]]
K = TypeVar("K")
V = TypeVar("V")

# The peer defaults with one stage per device: their labels and partition methods.
_DEFAULTS = (
    ("uniform", "uniform"),
    ("parameter-balanced", "parameters"),
    ("time-balanced", "balance_by_time"),
)


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
        if n % chunks == 0:
            return bl.uniform_partition(n, chunks)
        blocks = _megatron_blocks(profile, chunks)
        if blocks is None:
            raise InputError(
                f"Megatron-LM needs the {n} layers to divide into {chunks} equal stages",
                field="num_stages",
            )
        return blocks
    if method == "one stage":
        return [(0, n - 1)]
    raise InputError(f"unknown partition method {method!r}", field="partition")


def _megatron_blocks(profile: Profile, chunks: int) -> Ranges | None:
    """Megatron-LM's split where the model is layers before, a run of equal blocks (one
    parameter count, the middle layer's) and layers after (an embedding; a final norm and
    a head): the blocks in ``chunks`` equal runs, the layers before joining the first and
    those after the last, as ``--num-layers`` must divide by the pipeline's stages there;
    None where there is no layer before or after, or the blocks do not divide."""
    n = profile.num_layers
    counts = [layer.param_count for layer in profile.layers]
    block = counts[n // 2]
    first = counts.index(block)
    last = n - 1 - counts[::-1].index(block)
    if (first, last) == (0, n - 1) or any(c != block for c in counts[first : last + 1]):
        return None
    if (last - first + 1) % chunks:
        return None
    per = (last - first + 1) // chunks
    bounds = [0, *(first + c * per for c in range(1, chunks)), n]
    return [(bounds[c], bounds[c + 1] - 1) for c in range(chunks)]


def pipedream_levels(topology: Topology) -> list[tuple[int, float]]:
    """PipeDream's machine hierarchy read off the topology: GPUs per host, then hosts.

    Example::

        pipedream_levels(load_topology("topologies/two-node-ib.yaml"))  # [(8, ...), (2, ...)]
    """
    hosts = list(topology.hosts().values())
    names = topology.device_names()
    # The narrowest bottleneck over pairs of a set of devices, without visiting every pair.
    narrowest = topology.narrowest_bandwidth
    if len(hosts) > 1 and len({len(h) for h in hosts}) == 1:
        levels = []
        if len(hosts[0]) > 1:
            levels.append((len(hosts[0]), min(narrowest(h) for h in hosts)))
        levels.append((len(hosts), narrowest([h[0] for h in hosts])))
        return levels
    bw = narrowest(names)
    return [(len(names), bw if math.isfinite(bw) else 1e12)]


@dataclass
class PeerPartitions:
    """Each peer's partitions on one profile and topology, computed once per arguments
    (every schedule and number of microbatches of a depth asks for the same one; both the
    tuned peers and the peer defaults ask for PipeDream's, the costliest).

    Example::

        parts = PeerPartitions(profile, topology)
        parts.partition("parameters", 4, 8), parts.pipedream_stages(4)
    """

    profile: Profile
    topology: Topology
    # Each named partition by (method, microbatch size, stages), or why it has none.
    partitions: dict[tuple[str, int, int], Ranges | str] = field(default_factory=dict)
    # PipeDream's stages per microbatch size, or why it has none.
    pipedream: dict[int, list[tuple[int, int, int]] | str] = field(default_factory=dict)

    def partition(self, method: str, microbatch_size: int, chunks: int) -> Ranges | str:
        """``chunks`` contiguous ranges by the named method, or the reason it gives none.

        Example::

            parts.partition("parameters", 4, 8)   # [(0, 2), (3, 5), ...]
        """
        return _once(
            self.partitions,
            (method, microbatch_size, chunks),
            lambda: _partition(self.profile, method, microbatch_size, chunks),
        )

    def pipedream_stages(self, microbatch_size: int) -> list[tuple[int, int, int]] | str:
        """PipeDream's ``(first, last, replicas)`` stages on this topology (its levels from
        :func:`pipedream_levels`), or the reason it gives none.

        Example::

            parts.pipedream_stages(4)   # [(0, 9, 3), (10, 11, 1)]
        """
        return _once(
            self.pipedream,
            microbatch_size,
            lambda: bl.pipedream_partition(
                self.profile, microbatch_size, pipedream_levels(self.topology)
            ),
        )


def _once(store: dict[K, V | str], key: K, compute: Callable[[], V]) -> V | str:
    """``store[key]``, computed (or the reason it cannot be: the InputError's text) once."""
    hit = store.get(key)
    if hit is None:
        try:
            hit = compute()
        except InputError as exc:
            hit = str(exc)
        store[key] = hit
    return hit


def place_consecutively(
    stages: Sequence[tuple[int, int, int]], names: Sequence[str]
) -> tuple[StageSpec, ...] | None:
    """``(first, last, replicas)`` stages on consecutive devices from the first (as
    PipeDream's runtime ranks them); None where there are too few devices (or no stages).

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
    parts: PeerPartitions, microbatch_size: int
) -> list[tuple[str, tuple[StageSpec, ...] | str]]:
    """The peer defaults as ``(name, stages)``: DeepSpeed uniform and parameters and
    torchgpipe on ``min(layers, devices)`` stages, one device each in device order, and
    PipeDream's own stages and replicas on consecutive devices; or, instead of the stages,
    why the algorithm itself gives no partition (torchgpipe on zero-time layers, PipeDream's
    memory constraint).

    Example::

        for name, stages in default_outcomes(PeerPartitions(profile, topology), 4): ...
    """
    names = parts.topology.device_names()
    s = min(parts.profile.num_layers, len(names))
    found: list[tuple[str, list[tuple[int, int, int]] | str]] = []
    for label, method in _DEFAULTS:
        ranges = parts.partition(method, microbatch_size, s)
        found.append((label, ranges if isinstance(ranges, str) else [(a, b, 1) for a, b in ranges]))
    pipedream = parts.pipedream_stages(microbatch_size)
    if pipedream:
        found.append(("pipedream", pipedream))
    out: list[tuple[str, tuple[StageSpec, ...] | str]] = []
    for label, stages in found:
        if isinstance(stages, str):
            out.append((label, stages))
            continue
        placed = place_consecutively(stages, names)
        out.append((label, placed or f"its {len(stages)} stages need more devices"))
    return out
