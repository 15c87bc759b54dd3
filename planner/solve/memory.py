"""What a stage keeps in memory as the search sees it, and recompute where it overflows.

:func:`in_flight` is the number of microbatches a stage stashes under a schedule (per chunk
when interleaved); :func:`fix_recompute` switches recompute on exactly for the stages whose
activations would not fit (recompute is never faster); :func:`recompute_units` checkpoints
each such stage in the unit that peaks lower (each layer on its own, or the whole stage).

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
from planner.shape import PlanShape
from planner.simulate.shards import member_memory_bytes
from planner.stages import StageSpec

if TYPE_CHECKING:
    from planner.topology import Topology

# recompute_units' choices by (the stage recomputing, microbatch size, microbatches held
# per replica, weight versions): True where each layer is checkpointed on its own.
UnitMemo = dict[tuple[StageSpec, int, int, int], bool]

__all__ = [
    "UnitMemo",
    "fix_recompute",
    "held_per_replica",
    "in_flight",
    "recompute_units",
    "weight_versions",
    "with_recompute",
]


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


def held_per_replica(
    schedule: str,
    num_stages: int,
    stage: int,
    num_microbatches: int,
    replicas: int,
    virtual: int = 1,
    rounds: int = 1,
) -> int:
    """Microbatches one replica of stage ``stage`` keeps stashed: :func:`in_flight`'s count
    spread over its ``replicas`` (round robin), rounded up.

    Example::

        held_per_replica("gpipe", 4, 3, 8, replicas=3)   # 3: ceil(8 / 3)
    """
    total = in_flight(schedule, num_stages, stage, num_microbatches, virtual, rounds)
    return -(-total // replicas)


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
        held = held_per_replica(schedule, s, k, num_microbatches, len(devs), virtual, rounds)
        mem = stage_memory_bytes(profile, a, b, mb, held, weight_versions=weight_versions(schedule))
        flags.append(mem > limit)
    return tuple(flags)


def recompute_units(
    profile: Profile,
    stages: Sequence[StageSpec],
    schedule: str,
    mb: int,
    num_microbatches: int,
    virtual: int = 1,
    memo: UnitMemo | None = None,
) -> tuple[StageSpec, ...]:
    """The stages, each recomputing one checkpointed in the unit whose peak memory is
    lower on one of its devices: every layer on its own (``recompute_layers``: the layers'
    inputs kept, one layer rebuilt at a time; transformer blocks) or the whole stage (its
    input kept, all rebuilt at once; layers that save little beyond their output). Both
    cost one forward more, so memory alone decides; a tie keeps the whole stage.
    ``memo`` (one per profile: a search's :attr:`~planner.solve.search.Search.units`)
    keeps each stage's choice by what it depends on (the stage, the microbatch size, the
    microbatches it holds, the weight versions), so a shape whose flags change one stage
    at a time works out the others once.

    Example::

        recompute_units(profile, shape.stages, "1f1b", 4, 8)[0].recompute_layers
    """
    count = len(stages)
    rounds = replica_round([st.replicas for st in stages], num_microbatches)
    versions = weight_versions(schedule)
    memo = {} if memo is None else memo
    out = []
    for k, st in enumerate(stages):
        if not st.recompute:
            out.append(st)
            continue
        held = held_per_replica(schedule, count, k, num_microbatches, st.replicas, virtual, rounds)
        whole = st.with_recompute(True)
        key = (whole, mb, held, versions)
        layers = memo.get(key)
        if layers is None:
            each = st.with_recompute(True, layers=True)
            need_whole = member_memory_bytes(profile, whole, mb, held, weight_versions=versions)
            need_each = member_memory_bytes(profile, each, mb, held, weight_versions=versions)
            layers = memo[key] = need_each < need_whole
        out.append(st.with_recompute(True, layers=True) if layers else whole)
    return tuple(out)


def with_recompute(
    profile: Profile, shape: PlanShape, flags: Sequence[bool], memo: UnitMemo | None = None
) -> PlanShape:
    """``shape`` with its stages' recompute switched to ``flags``, each recomputing stage in
    the unit that peaks lower (:func:`recompute_units`, with ``memo``).

    Example::

        with_recompute(profile, shape, [True, False]).stages[0].recompute   # True
    """
    flagged = shape.with_recompute(flags)
    stages = recompute_units(
        profile,
        flagged.stages,
        shape.schedule,
        shape.microbatch_size,
        shape.num_microbatches,
        shape.virtual_stages,
        memo,
    )
    return PlanShape(
        stages, shape.schedule, shape.microbatch_size, shape.num_microbatches, shape.virtual_stages
    )
