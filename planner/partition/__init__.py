"""Partitioning: splitting a profile's layers into pipeline stages.

The baselines reproduce what other systems do (DeepSpeed, torchgpipe, PipeDream); see
docs/baselines.md.

Example::

    from planner.partition import uniform_partition, parameter_balanced_partition
    uniform_partition(10, 3)                    # [(0, 3), (4, 6), (7, 9)]
"""

from planner.partition.baselines import (
    Level,
    PipeDreamPlan,
    block_partition,
    deepspeed_partition_balanced,
    deepspeed_partition_balanced_bisect,
    deepspeed_partition_uniform,
    parameter_balanced_partition,
    pipedream_partition,
    pipedream_plan,
    ranges_from_bounds,
    time_balanced_partition,
    uniform_partition,
)

# The solver's own partitioners (exact chain DP, joint partition + mapping ILP).
from planner.partition.dp import (
    ChainPartition,
    LayerCosts,
    Slot,
    layer_costs,
    partition_chain,
    partition_chain_depths,
)
from planner.partition.ilp import IlpResult, solve_ilp

__all__ = [
    # baselines: what other systems do
    "Level",
    "PipeDreamPlan",
    "block_partition",
    "deepspeed_partition_balanced",
    "deepspeed_partition_balanced_bisect",
    "deepspeed_partition_uniform",
    "parameter_balanced_partition",
    "pipedream_partition",
    "pipedream_plan",
    "ranges_from_bounds",
    "time_balanced_partition",
    "uniform_partition",
    # the solver's own
    "ChainPartition",
    "IlpResult",
    "LayerCosts",
    "Slot",
    "layer_costs",
    "partition_chain",
    "partition_chain_depths",
    "solve_ilp",
]
