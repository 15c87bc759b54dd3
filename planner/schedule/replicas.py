"""Schedules over data-parallel replicas: one pipeline schedule per replica, not one for all.

A stage on ``r`` devices runs microbatch ``k`` on replica ``k % r``. A generator's order
over all ``M`` microbatches, dealt out round robin, would give each replica only a slice
of the schedule's warm-up: under 1F1B with ``r`` replicas, stage ``s``'s warm-up of
``p - s - 1`` microbatches would be shared by ``r`` devices, so a device would wait for
its first backward before its second forward and the replicas' pipelines would run one
microbatch at a time. What DeepSpeed, Megatron-LM and torch.distributed.pipelining run
with data parallelism is instead one full schedule per pipeline replica, each over its own
``M / r`` microbatches.

:func:`per_replica_order` builds that: the generator's order over ``M / R`` *rounds*
(``R`` the least common multiple of the stages' replica counts), each op on round ``i``
standing for microbatches ``i R .. i R + R - 1``. Replica ``j`` of a stage with ``r``
replicas then sees exactly the generator's order over its own microbatches (``R / r`` of
every round): with equal replica counts, the schedule of one pipeline over ``M / r``
microbatches. GPipe's order is the same either way.

Example::

    base = onef1b_order(2, 4)                 # 2 stages, 4 rounds
    order = per_replica_order(base, rounds=2) # 8 microbatches on 2 replicas per stage
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.schedule.expand import ComputeOp

__all__ = ["per_replica_order", "replica_round"]


def replica_round(group_sizes: Sequence[int], num_microbatches: int) -> int:
    """Microbatches per round: the lcm of the replica counts, or 1 where that does not
    divide ``num_microbatches`` (then the order over all microbatches is dealt out as is).

    Example::

        replica_round([2, 2], 8)   # 2
        replica_round([3, 1], 8)   # 1: 3 does not divide 8
    """
    r = math.lcm(*group_sizes) if group_sizes else 1
    return r if r > 1 and num_microbatches % r == 0 else 1


def per_replica_order(order: dict[int, list[ComputeOp]], rounds: int) -> dict[int, list[ComputeOp]]:
    """Each op on round ``i`` becomes ``rounds`` ops on microbatches ``i * rounds + j``.

    Example::

        per_replica_order({0: [("F", 0, 0), ("B", 0, 0)]}, 2)[0]
        # [('F', 0, 0), ('F', 0, 1), ('B', 0, 0), ('B', 0, 1)]
    """
    if rounds == 1:
        return order
    return {
        rank: [(kind, s, k * rounds + j) for kind, s, k in ops for j in range(rounds)]
        for rank, ops in order.items()
    }
