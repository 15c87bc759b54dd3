"""A lower bound on a schedule's iteration time, reported beside the simulated one.

Example::

    lower_bound_ms(profile, topology, stages, 8, 4)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.profile.schema import Profile
from planner.simulate.group_comm import group_transfer_ms
from planner.simulate.reshard import Reshard, plan_reshard, reshard_transfer
from planner.simulate.tables import compute_times, step_table
from planner.stages import StageSpec

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["lower_bound_ms"]


def lower_bound_ms(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    num_microbatches: int,
    microbatch_size: int,
    *,
    flush: bool = True,
    split_backward: bool = False,
    step_ms: float | Sequence[float] | None = None,
) -> float:
    """``max(total work / devices, busiest device's work, one microbatch's critical path)``.

    Work is forward + backward (with recompute) on the device that runs each microbatch
    (without a flush, where the stream deals each replica ``M / r`` per iteration on
    average, that average),
    plus one optimizer step per stage the device holds (every replica steps once per
    iteration; ``step_ms`` as in :func:`simulate`, default the profile's); the critical
    path is forward through every stage, backward back, with the transfers between them
    (no contention; a hand-written order may put a STEP anywhere, so the path leaves it
    out). With ``split_backward`` (zb, optimized) only the input half of each
    backward is on the path, plus the weight half of the stage it ends on. Schedules
    without a flush (2bw) overlap iterations, so only the work terms bound them. A
    tensor-parallel group counts as its leader (its members do the same work), with its
    collectives in its compute and its members' transfers together on the path.

    Example::

        lower_bound_ms(profile, topology, stages, 8, 4)
    """
    times, cut = compute_times(profile, topology, stages, microbatch_size)
    steps = step_table(profile, topology, stages, step_ms)
    work: dict[str, float] = {}
    for st in stages:
        r = st.replicas
        for j, dev in enumerate(st.leaders):
            count: float = num_microbatches // r + (1 if j < num_microbatches % r else 0)
            if not flush:  # a stream deals microbatch k to replica k % r: M / r on average
                count = num_microbatches / r
            f, b, _, _ = times[(st.id, dev)]
            work[dev] = work.get(dev, 0.0) + count * (f + b) + steps[(st.id, dev)]
    bound = max(max(work.values()), sum(work.values()) / len(work))
    if not flush:
        return bound
    path_max = 0.0
    # Microbatch k takes replica k % r of each stage: the paths repeat with the least
    # common multiple of the replica counts, so later ones change nothing.
    period = math.lcm(*(st.replicas for st in stages))
    reshard = plan_reshard(profile, stages, microbatch_size) if topology is not None else None
    for k in range(min(num_microbatches, 64, period)):
        devs = [st.replica(k) for st in stages]
        hops = _hop_ms(topology, stages, devs, cut, backward=False, reshard=reshard)
        back = _hop_ms(topology, stages, devs, cut, backward=True, reshard=reshard)
        # Forward down the pipeline, then the (input-)gradient back up.
        down = 0.0
        for s, st in enumerate(stages):
            down += hops[s]
            down += times[(st.id, devs[s])][0]
        up = down
        for s in range(len(stages) - 1, -1, -1):
            _, b, bi, bw = times[(stages[s].id, devs[s])]
            if s + 1 < len(stages):
                up += back[s + 1]
            if split_backward:
                up += bi
                path_max = max(path_max, up + bw)
            else:
                up += b
        path_max = max(path_max, up)
    return max(bound, path_max)


def _hop_ms(
    topology: Topology | None,
    stages: Sequence[StageSpec],
    devs: list[str],
    cut: list[int],
    *,
    backward: bool,
    reshard: Reshard | None = None,
) -> list[float]:
    """Per stage ``s`` the transfer between it and ``s - 1`` (activations forward, or the
    gradient back; 0 for the first, on one device or without a topology); a group's
    members' transfers together (``reshard``: the resharded boundaries' pieces)."""
    out = [0.0]
    for s in range(1, len(stages)):
        a, b = devs[s - 1], devs[s]
        if topology is None or a == b:
            out.append(0.0)
            continue
        if stages[s].tensor_parallel == stages[s - 1].tensor_parallel == 1:
            out.append(
                topology.transfer_ms(b, a, cut[s])
                if backward
                else topology.transfer_ms(a, b, cut[s])
            )
            continue
        ga, gb = _group_led_by(stages[s - 1], a), _group_led_by(stages[s], b)
        pair = (gb, ga) if backward else (ga, gb)
        parts = reshard.of_cut(s) if reshard is not None else None
        if parts is None:
            out.append(group_transfer_ms(topology, *pair, cut[s]))
            continue
        split = (stages[s - 1].sequence_parallel, stages[s].sequence_parallel)
        _, latency, wire = reshard_transfer(
            topology, *pair, split[::-1] if backward else split, parts
        )
        out.append(latency + wire)
    return out


def _group_led_by(st: StageSpec, leader: str) -> tuple[str, ...]:
    """The replica group of ``st`` that ``leader`` leads (``st.replica_groups``' entry,
    without building them all)."""
    i = st.devices.index(leader)
    return st.devices[i : i + st.tensor_parallel]
