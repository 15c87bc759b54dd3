"""Collectives over a topology: the ring all-reduce that data parallelism and tied
parameters pay.

The ring sends ``2 (n - 1)`` chunks of ``nbytes / n`` around; every step all devices send at
once, so links shared by several ring hops (in the same direction) split their bandwidth,
and the backend reaches ``allreduce_efficiency`` of that model (about 1 for NCCL over
NVLink, about a fifth for gloo over loopback TCP). Of the given device order and the order
grouped by host, the faster ring is used, as NCCL groups rings by host.

Example::

    allreduce_ms(topo, ["gpu0", "gpu8"], 4 * 2**30)   # == topo.allreduce_ms(...)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.errors import InputError
from planner.topology.routing import first_duplicate

if TYPE_CHECKING:
    from planner.topology.graph import Topology

__all__ = ["allreduce_ms", "ring_allreduce_ms"]


def allreduce_ms(topology: Topology, devices: Sequence[str], nbytes: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``devices`` (the better of the given order and
    the order grouped by host); 0.0 for one device.

    Example::

        allreduce_ms(topo, ["gpu0", "gpu1", "gpu2", "gpu3"], 2**30)
    """
    names = list(devices)
    for name in names:
        topology.device_index(name)
    if len(set(names)) != len(names):
        dup = first_duplicate(names)
        raise InputError(f"device {dup!r} appears twice in an all-reduce", file=topology.source)
    if len(names) <= 1:
        return 0.0
    grouped = sorted(names, key=topology.host_index)
    orders = [names] if grouped == names else [names, grouped]
    return min(ring_allreduce_ms(topology, order, nbytes) for order in orders)


def ring_allreduce_ms(topology: Topology, ring: Sequence[str], nbytes: float) -> float:
    """A ring all-reduce in exactly the order ``ring``.

    Example::

        ring_allreduce_ms(topo, ["gpu0", "gpu1"], 2**20)
    """
    n = len(ring)
    hops = [topology.route_links(ring[k], ring[(k + 1) % n]) for k in range(n)]
    use: dict[tuple[str, str], int] = {}
    for links in hops:
        for link in links:
            use[link] = use.get(link, 0) + 1
    chunk = nbytes / n
    step = 0.0
    for k, links in enumerate(hops):
        share = min(topology.link_bandwidth(u, v) / use[(u, v)] for u, v in links)
        share *= topology.allreduce_efficiency
        step = max(step, topology.latency_ms(ring[k], ring[(k + 1) % n]) + chunk / share * 1e3)
    return 2 * (n - 1) * step
