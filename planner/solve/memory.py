"""What a stage keeps in memory as the search sees it, and recompute where it overflows.

:func:`in_flight` is the number of microbatches a stage stashes under a schedule (per chunk
when interleaved); :func:`fix_recompute` switches recompute on exactly for the stages whose
activations would not fit (recompute is never faster).

Example::

    in_flight("1f1b", 4, 0, 8)  # 4: the first of 4 stages holds 4 microbatches under 1F1B
    fix_recompute(profile, topology, [(0, 3), (4, 7)], [("gpu0",), ("gpu1",)], "1f1b", 4, 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.cost import stage_memory_bytes
from planner.profile.schema import Profile
from planner.schedule.families import family
from planner.schedule.replicas import replica_round

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["fix_recompute", "in_flight", "weight_versions"]


def in_flight(
    schedule: str,
    num_stages: int,
    stage: int,
    num_microbatches: int,
    virtual: int = 1,
    rounds: int = 1,
) -> int:
    """Microbatches stage ``stage`` of ``num_stages`` keeps stashed over its replicas (per
    chunk when interleaved: the device's count spread over its ``virtual`` chunks);
    ``rounds`` as :func:`planner.schedule.replicas.replica_round` gives it.

    Example::

        in_flight("gpipe", 4, 3, 8)  # 8: GPipe stashes every microbatch
    """
    if virtual > 1:
        p = num_stages // virtual
        total = family(schedule).in_flight_microbatches(
            p, stage % p, num_microbatches, virtual_stages=virtual, rounds=rounds
        )
        return -(-int(total) // virtual)
    return int(
        family(schedule).in_flight_microbatches(num_stages, stage, num_microbatches, rounds=rounds)
    )


def weight_versions(schedule: str) -> int:
    """Copies of the weights a stage keeps under ``schedule`` (2 for 2BW).

    Example::

        weight_versions("1f1b")  # 1
    """
    return family(schedule).weight_versions


def fix_recompute(
    profile: Profile,
    topology: Topology,
    ranges: Sequence[tuple[int, int]],
    devices: Sequence[Sequence[str]],
    schedule: str,
    mb: int,
    num_microbatches: int,
    virtual: int = 1,
) -> tuple[bool, ...]:
    """Recompute exactly the stages whose activations do not fit (recompute is never faster).

    Example::

        fix_recompute(profile, topology, [(0, 7)], [("gpu0",)], "1f1b", 4, 8)  # (False,)
    """
    s = len(ranges)
    rounds = replica_round([len(d) for d in devices], num_microbatches)
    flags = []
    for k, ((a, b), devs) in enumerate(zip(ranges, devices, strict=True)):
        limit = min(topology.device(d).memory_bytes for d in devs) / virtual
        held = -(-in_flight(schedule, s, k, num_microbatches, virtual, rounds) // len(devs))
        mem = stage_memory_bytes(profile, a, b, mb, held, weight_versions=weight_versions(schedule))
        flags.append(mem > limit)
    return tuple(flags)
