"""Device-mapping helpers: orderings of a topology's devices and the costs along them.

The DP partitions layers over a *sequence* of device slots; this module proposes the
sequences worth trying (file order, widest-link walks, strongest devices first) and turns
them into :class:`~planner.partition.dp.Slot` lists with the transfer cost between
consecutive slots on the topology's actual route.

Example::

    for path in candidate_paths(topology):
        slots = slots_along(topology, path, replicas=1)
        links = links_between(topology, slots)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.partition.dp import Linear, Slot

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = [
    "candidate_paths",
    "identical_devices",
    "links_between",
    "slots_along",
    "transfer_cost",
    "uniform_network",
    "widest_walk",
]


def identical_devices(topology: Topology) -> bool:
    """True when every device has the same speed and memory.

    Example::

        identical_devices(uniform_topology(4))   # True
    """
    devs = topology.devices
    return all(d.speed == devs[0].speed and d.memory_bytes == devs[0].memory_bytes for d in devs)


def uniform_network(topology: Topology) -> bool:
    """True when every pair of devices sees the same bandwidth and latency.

    Two bottlenecks (the topology's range, no route worked out) or the first pair that
    differs answer False; only a network of one bandwidth visits every pair.

    Example::

        uniform_network(uniform_topology(4))     # True
    """
    spread = topology.bandwidth_range()
    if spread is not None and spread[0] != spread[1]:
        return False
    names = topology.device_names()
    seen: tuple[float, float] | None = None
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pair = (topology.bandwidth(a, b), round(topology.latency_ms(a, b), 12))
            if seen is None:
                seen = pair
            elif pair != seen:
                return False
    return True


def transfer_cost(topology: Topology | None, src: str, dst: str) -> Linear:
    """The transfer time from ``src`` to ``dst`` as latency + bytes x ms-per-byte.

    Example::

        transfer_cost(topology, "gpu0", "gpu1")(2**20)   # ms to send 1 MiB
    """
    if topology is None or src == dst:
        return Linear()
    return Linear.fit(lambda nbytes: topology.transfer_ms(src, dst, nbytes))


def widest_walk(topology: Topology, start: str, *, prefer_speed: bool = False) -> list[str]:
    """A path through all devices that always steps to the best-connected unvisited device.

    Ties (and, with ``prefer_speed``, the first criterion) go to the faster device, then
    lower latency, then file order, so the walk is deterministic.

    Example::

        widest_walk(topology, "gpu0")   # ['gpu0', 'gpu1', ...] along NVLink first
    """
    names = topology.device_names()
    speed = [d.speed for d in topology.devices]
    path = [start]
    left = [i for i, n in enumerate(names) if n != start]  # by file order
    while left:
        cur = path[-1]
        # The key is (-bw, latency, -speed, order), or (-speed, -bw, latency, order): the
        # leading criteria narrow the field first, so only the devices left in it cost a
        # route (latency); the rest are compared on one row of bottlenecks.
        field = left
        if prefer_speed:
            fastest = max(speed[i] for i in field)
            field = [i for i in field if speed[i] == fastest]
        bw = topology.bandwidths_from(cur)
        widest = max(bw[i] for i in field)
        field = [i for i in field if bw[i] == widest]

        def key(i: int, cur: str = cur) -> tuple[float, ...]:
            return (topology.latency_ms(cur, names[i]), -speed[i], i)

        nxt = min(field, key=key) if len(field) > 1 else field[0]
        path.append(names[nxt])
        left.remove(nxt)
    return path


def candidate_paths(topology: Topology, *, limit: int = 8) -> list[list[str]]:
    """Distinct device orderings worth partitioning over, most natural first.

    File order, then widest-link walks from the strongest devices, then strongest-first
    orders; duplicates are dropped so identical topologies yield few candidates.

    Example::

        candidate_paths(topology)[0] == topology.device_names()
    """
    names = topology.device_names()
    order = {n: i for i, n in enumerate(names)}
    by_speed = sorted(topology.devices, key=lambda d: (-d.speed, -d.memory_bytes, order[d.name]))
    paths: list[list[str]] = [names]
    starts = [by_speed[0].name, names[0], names[-1]]
    for start in dict.fromkeys(starts):
        paths.append(widest_walk(topology, start))
        paths.append(widest_walk(topology, start, prefer_speed=True))
    paths.append([d.name for d in by_speed])
    unique: list[list[str]] = []
    for p in paths:
        if p not in unique:
            unique.append(p)
    return unique[:limit]


def slots_along(topology: Topology, path: Sequence[str], *, replicas: int = 1) -> list[Slot]:
    """Cut ``path`` into consecutive groups of ``replicas`` devices (a leftover is dropped).

    Example::

        slots_along(topology, ["gpu0", "gpu1", "gpu2", "gpu3"], replicas=2)  # 2 slots
    """
    slots = []
    for k in range(len(path) // replicas):
        group = tuple(path[k * replicas : (k + 1) * replicas])
        devs = [topology.device(n) for n in group]
        allreduce = _ring_line(topology, group) if len(group) > 1 else None
        slots.append(
            Slot(
                devices=group,
                speed=min(d.speed for d in devs),
                memory_bytes=float(min(d.memory_bytes for d in devs)),
                allreduce=allreduce,
            )
        )
    return slots


@functools.lru_cache(maxsize=4096)
def _ring_line(topology: Topology, group: tuple[str, ...]) -> Linear:
    # The search cuts the same paths into the same groups again and again (every schedule,
    # depth and re-cut); the ring's routes are the costly part. (Topologies compare by
    # identity, so a cached entry never outlives its topology's use.)
    return Linear.fit(lambda nbytes: topology.allreduce_ms(list(group), nbytes))


def links_between(topology: Topology | None, slots: Sequence[Slot]) -> list[Linear]:
    """Transfer cost between consecutive slots (slowest replica pair of the two groups).

    Example::

        links_between(topology, slots)[0](2**20)
    """
    out = []
    for a, b in zip(slots, slots[1:], strict=False):
        pairs = [transfer_cost(topology, x, y) for x, y in zip(a.devices, b.devices, strict=False)]
        if len(a.devices) != len(b.devices):
            pairs = [transfer_cost(topology, x, y) for x in a.devices for y in b.devices]
        out.append(max(pairs, key=lambda c: (c.ms_per_byte, c.latency_ms)))
    return out
