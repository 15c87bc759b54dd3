"""A plan's CPU processes per host against the co-location its profile was measured under.

A plan whose devices are CPU processes (topology devices of kind ``cpu``) runs one process
per plan device; on each host they compute at the same time. The simulator takes the
profile's times as they are, so a prediction holds where the profile saw as many
processes on the host as the plan puts there (:mod:`planner.profile.colocation`). ``solve``
and ``simulate`` print :func:`plan_colocation_note` where it does not.

Example::

    plan_processes_per_host(plan.stages, topology)          # 2 on topologies/cpu.yaml
    plan_colocation_note(profile, topology, plan.stages)     # None, or one line
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from planner.profile.colocation import colocation_note, profile_colocation
from planner.profile.schema import Profile
from planner.stages import StageSpec
from planner.topology import Topology

__all__ = ["cpu_processes_per_host", "plan_colocation_note", "plan_processes_per_host"]


def cpu_processes_per_host(
    topology: Topology | None, devices: Iterable[str] | None = None
) -> int | None:
    """The most CPU processes (devices of kind ``cpu``; of ``devices`` only, where given)
    on one host of ``topology``; None where there are none (GPUs, or no topology).

    Example::

        cpu_processes_per_host(load_topology("topologies/cpu.yaml"))   # 2
    """
    if topology is None:
        return None
    wanted = None if devices is None else set(devices)
    per_host: dict[str, int] = {}
    for device in topology.devices:
        if device.kind == "cpu" and (wanted is None or device.name in wanted):
            per_host[device.host] = per_host.get(device.host, 0) + 1
    return max(per_host.values(), default=None)


def plan_processes_per_host(stages: Sequence[StageSpec], topology: Topology | None) -> int | None:
    """The most CPU processes the plan puts on one host (its devices of kind ``cpu``);
    None where it has none (GPUs, or no topology).

    Example::

        plan_processes_per_host(parse_stages("0-2:cpu0;3-5:cpu1"), load_topology(cpu))  # 2
    """
    return cpu_processes_per_host(topology, (d for s in stages for d in s.devices))


def plan_colocation_note(
    profile: Profile, topology: Topology | None, stages: Sequence[StageSpec]
) -> str | None:
    """One line where a CPU profile saw another number of processes on the host than the
    plan's CPU processes per host; None where they agree or it does not apply.

    Example::

        plan_colocation_note(load_profile("profiles/gpt.json"), cpu_topology, plan.stages)
    """
    if not profile.device.startswith("cpu"):
        return None
    processes = plan_processes_per_host(stages, topology)
    if processes is None:
        return None
    return colocation_note(profile_colocation(profile), processes)
