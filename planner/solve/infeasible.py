"""Why no plan fits: the :class:`InfeasibleError` ``solve`` raises, with the memory needed.

:func:`nothing_fits` names a layer too big for every device, or the per-device memory with
which the DP would find a plan on all devices (bisected); :func:`schedule_does_not_fit`
is for a requested schedule that fits no shape where others do.

Example::

    raise nothing_fits(profile, topology, [(4, 8)])
    # InfeasibleError: memory: no plan fits in memory: the largest device has ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.cost import stage_memory_bytes
from planner.errors import InfeasibleError
from planner.partition.dp import Slot, layer_costs, partition_chain
from planner.profile.schema import Profile
from planner.schedule.families import is_interleaved
from planner.solve.memory import in_flight
from planner.units import format_bytes

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["nothing_fits", "schedule_does_not_fit"]


def _size(nbytes: float) -> str:
    return f"{format_bytes(nbytes)} ({int(nbytes)} bytes)"


def _memory_needed(
    profile: Profile, topology: Topology, settings: Sequence[tuple[int, int]], mb: int, need: float
) -> tuple[int, float]:
    """The number of stages, and about the smallest per-device memory with which the DP
    finds a plan over that many devices in order (to 1 MiB)."""
    costs = layer_costs(profile, mb)
    m = min(m for s, m in settings if s == mb)
    path = topology.device_names()
    s = min(len(path), profile.num_layers)
    stashed = [in_flight("1f1b", s, k, m) for k in range(s)]
    lo, hi = float(need), float(stage_memory_bytes(profile, 0, profile.num_layers - 1, mb, m))
    for _ in range(60):
        mid = (lo + hi) / 2
        slots = [Slot((d,), 1.0, mid) for d in path[:s]]
        if partition_chain(costs, slots, in_flight=stashed, num_microbatches=m) is None:
            lo = mid
        else:
            hi = mid
        if hi - lo < 2**20:
            break
    return s, hi


def nothing_fits(
    profile: Profile, topology: Topology, settings: Sequence[tuple[int, int]]
) -> InfeasibleError:
    """Explain why nothing fits: a layer too big for every device, or the memory needed.

    Example::

        str(nothing_fits(profile, topology, [(4, 8)]))  # "no plan fits in memory: ..."
    """
    largest = max(d.memory_bytes for d in topology.devices)
    mb = min(m for m, _ in settings)
    sizes = [
        (stage_memory_bytes(profile, i, i, mb, 1, recompute=True), i)
        for i in range(profile.num_layers)
    ]
    need, worst = max(sizes)
    if need > largest:
        return InfeasibleError(
            f"layer {worst} ({profile.layers[worst].name}) alone needs {_size(need)} at "
            f"microbatch size {mb} even with recompute, more than the largest device "
            f"({_size(largest)}); hint: use devices with more memory or profile a smaller "
            "microbatch size",
            field="memory",
        )
    s, hi = _memory_needed(profile, topology, settings, mb, need)
    return InfeasibleError(
        f"no plan fits in memory: the largest device has {_size(largest)} but the best "
        f"partition over {s} devices needs about {_size(hi)} per device (microbatch size "
        f"{mb}, recompute where needed); hint: add devices or memory, or profile a smaller "
        "microbatch size",
        field="memory",
    )


def schedule_does_not_fit(schedule: str) -> InfeasibleError:
    """A requested schedule with no shape that runs and fits, where others do.

    Example::

        raise schedule_does_not_fit("interleaved")
    """
    if is_interleaved(schedule):
        return InfeasibleError(
            f"no {schedule} plan fits: the interleaved schedule needs a stage per device "
            "with at least 2 layers per device and a number of microbatches that is a "
            "multiple of the pipeline's devices; try --schedule 1f1b or other --microbatches",
            field="--schedule",
        )
    return InfeasibleError(
        f"no {schedule} plan fits in memory where other schedules' do; try --schedule auto",
        field="--schedule",
    )
