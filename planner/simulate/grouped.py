"""A plan with tensor-parallel groups, timed through its leaders.

The members of a group run their leader's actions (:mod:`planner.schedule.groups`) on
their own shards, symmetrically, so the engines run the leaders alone
(:func:`leader_schedule`, over :func:`~planner.schedule.groups.leader_stages`), with each
group's compute at its slowest member's speed, every transfer between groups timed as its
members' transfers together and every replica all-reduce as the slowest of the ``t``
parallel rings (:mod:`planner.simulate.group_comm`). :func:`with_members` then gives every
member its leader's memory, busy time and memory curve (and its own memory limit), so a
result lists every device of the plan.

Example::

    lead = leader_schedule(schedule, stages)
    result = with_members(result, stages, topology)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.schedule import Schedule
from planner.schedule.action import Action
from planner.schedule.groups import group_of_leader, leader_stages
from planner.simulate.result import SimResult
from planner.stages import StageSpec

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["leader_schedule", "with_members"]


def leader_schedule(schedule: Schedule, stages: Sequence[StageSpec]) -> Schedule:
    """The leaders' part of ``schedule``: its compute order over the leader stages (a
    generated one), or the leaders' lists (lists read from a plan are mirrors, checked by
    :func:`~planner.schedule.validate_schedule`).

    Example::

        leader_schedule(build_schedule("1f1b", parse_stages("0:a+b;1:c+d"), 4), stages)
    """
    lead = leader_stages(stages)
    if schedule.order is not None and not schedule.is_expanded:
        return Schedule(
            schedule.name,
            schedule.num_stages,
            schedule.num_microbatches,
            virtual_stages=schedule.virtual_stages,
            flush=schedule.flush,
            iterations=schedule.iterations,
            meta=schedule.meta,
            order=schedule.order,
            stages=lead,
            generated=schedule.generated,
        )
    leaders = {d for st in lead for d in st.devices}
    return Schedule(
        schedule.name,
        schedule.num_stages,
        schedule.num_microbatches,
        {d: _to_leaders(acts, leaders) for d, acts in schedule.devices.items() if d in leaders},
        virtual_stages=schedule.virtual_stages,
        flush=schedule.flush,
        iterations=schedule.iterations,
        meta=schedule.meta,
    )


def _to_leaders(acts: list[Action], leaders: set[str]) -> list[Action]:
    """A leader's list without its sends to other members of a larger group (next to a
    stage of another degree: :func:`~planner.schedule.groups.mirror`); the list itself
    where it has none."""
    if all(a.peer is None or a.peer in leaders for a in acts):
        return acts
    return [a for a in acts if a.peer is None or a.peer in leaders]


def with_members(
    result: SimResult, stages: Sequence[StageSpec], topology: Topology | None
) -> SimResult:
    """``result`` (of the leaders) with every member of every group listed after its
    leader in the per-device maps, holding its leader's numbers, and ``groups`` set; the
    events stay the leaders' (``device_names``).

    Example::

        with_members(result, stages, topology).memory_bytes["gpu1"]   # gpu0's
    """
    groups = group_of_leader(stages)
    order = [m for d in result.device_names for m in groups.get(d, (d,))]
    leader = {m: g[0] for g in groups.values() for m in g}

    def spread(values: dict[str, int]) -> dict[str, int]:
        return {d: values[leader.get(d, d)] for d in order if leader.get(d, d) in values}

    result.memory_bytes = spread(result.memory_bytes)
    result.static_bytes = spread(result.static_bytes)
    result.busy_ms = {d: result.busy_ms[leader.get(d, d)] for d in order}
    result.memory_timeline = {
        d: result.memory_timeline[leader.get(d, d)]
        for d in order
        if leader.get(d, d) in result.memory_timeline
    }
    if topology is not None:
        result.memory_limit_bytes = {d: topology.device(d).memory_bytes for d in order}
    result.groups = groups
    return result
