"""Schedules over data-parallel replicas: one pipeline schedule per replica, not one for all.

A stage on ``r`` devices runs microbatch ``k`` on replica ``k % r``. A generator's order
over all ``M`` microbatches, dealt out round robin, would give each replica only a slice
of the schedule's warm-up: under 1F1B with ``r`` replicas, stage ``s``'s warm-up of
``p - s - 1`` microbatches would be shared by ``r`` devices, so a device would wait for
its first backward before its second forward and the replicas' pipelines would run one
microbatch at a time. What DeepSpeed, Megatron-LM and torch.distributed.pipelining run
with data parallelism is instead one full schedule per pipeline replica, each over its own
``M / r`` microbatches.

:func:`per_replica_order` builds that: the generator's order over ``ceil(M / R)``
*rounds* per iteration (``R`` the largest replica count, a multiple of every other),
each op on round ``i`` standing for microbatches ``i R .. i R + R - 1`` (the last round of
an iteration holds what is left when ``R`` does not divide ``M``). :func:`replica_round`
says where rounds pay off; elsewhere the order is dealt out round robin. Replica ``j`` of a
stage with ``r`` replicas then sees exactly the generator's order over its own
microbatches (``R / r`` of every full round): with equal replica counts and ``M`` a
multiple of ``r``, the schedule of one pipeline over ``M / r`` microbatches. GPipe's order
is the same either way.

Example::

    base = onef1b_order(2, 4)                     # 2 stages, 4 rounds
    order = per_replica_order(base, 2, 8)         # 8 microbatches on 2 replicas per stage
    order = per_replica_order(onef1b_order(3, 3), 3, 8)   # (3, 1, 1) replicas, M = 8
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedule.expand import ComputeOp

__all__ = ["per_replica_order", "replica_round", "round_count"]


def replica_round(group_sizes: Sequence[int], num_microbatches: int) -> int:
    """Microbatches per round: the largest replica count where every other divides it and
    the rounds fit ``M`` (whole, or at least two with a shorter last one); else 1, and the
    order over all microbatches is dealt out as is.

    A round as long as the lcm of unrelated counts (2 and 3: 6) would make the stages
    without replicas run that many forwards in a row, and one short round out of one or
    two would leave most of the pipeline idle; dealt out round robin, those shapes run
    faster (pipeplan simulate on the PipeDream VGG-16 profile, M from 2 to 16).

    Example::

        replica_round([2, 2], 8)   # 2
        replica_round([3, 1], 8)   # 3: rounds of 3, 3 and 2 microbatches
        replica_round([3, 1], 4)   # 1: rounds of 3 and 1
        replica_round([2, 3], 12)  # 1: a round of 6
    """
    m = num_microbatches
    r = max(group_sizes, default=1)
    if r <= 1 or r > m or any(r % g for g in group_sizes):
        return 1
    return r if m % r == 0 or m >= 2 * r else 1


def round_count(num_microbatches: int, rounds: int) -> int:
    """Rounds of one iteration: ``ceil(M / R)``.

    Example::

        round_count(8, 3)   # 3
    """
    return -(-num_microbatches // rounds)


def per_replica_order(
    order: dict[int, list[ComputeOp]], rounds: int, num_microbatches: int
) -> dict[int, list[ComputeOp]]:
    """Each op on round ``q`` becomes the ops on that round's microbatches.

    ``order`` numbers rounds through consecutive iterations (a 2bw stream): round ``q`` is
    round ``q % n`` of iteration ``q // n``, ``n = ceil(M / R)``, and holds microbatches
    ``iteration * M + (q % n) * R + j`` for ``j < R`` that stay below the iteration's
    ``M``.

    Example::

        per_replica_order({0: [("F", 0, 0), ("B", 0, 0)]}, 2, 2)[0]
        # [('F', 0, 0), ('F', 0, 1), ('B', 0, 0), ('B', 0, 1)]
    """
    if rounds == 1:
        return order
    m = num_microbatches
    n = round_count(m, rounds)
    out: dict[int, list[ComputeOp]] = {}
    for rank, ops in order.items():
        expanded: list[ComputeOp] = []
        for kind, s, q in ops:
            iteration, i = divmod(q, n)
            first = i * rounds
            base = iteration * m
            expanded.extend((kind, s, base + k) for k in range(first, min(first + rounds, m)))
        out[rank] = expanded
    return out
