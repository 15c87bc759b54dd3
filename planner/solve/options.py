"""The search's knobs: :class:`SolveOptions` (what a caller may set) and the fixed sizes.

:data:`SCHEDULE_CHOICES` are the ``--schedule`` values; ``"auto"`` tries
:data:`AUTO_SCHEDULES`. The other constants size the search; every one is counted in plans
or simulations, never in wall time, so a solve is deterministic.

Example::

    plan = solve(profile, topology, options=SolveOptions(exhaustive_limit=0, baselines=False))
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.schedule.families import FAMILIES

__all__ = [
    "AUTO_SCHEDULES",
    "INTERLEAVED_BASE",
    "ILP_MAX_CELLS",
    "ILP_MAX_DEVICES",
    "INTERLEAVED_SEEDS",
    "LOCAL_FLOOR",
    "LOCAL_STARTS",
    "MAX_FRONT_DPS",
    "MESH_BOUNDED",
    "MESH_SCALE",
    "SCHEDULE_CHOICES",
    "VIRTUAL_CHUNKS",
    "SolveOptions",
]

SCHEDULE_CHOICES = ("auto", *(n for n, f in FAMILIES.items() if not f.searched))
# Synchronous schedules "auto" tries, most conventional first (ties keep the earlier one):
# the families that say so (Family.auto), by their rank.
AUTO_SCHEDULES = tuple(
    f.name for f in sorted(FAMILIES.values(), key=lambda f: f.auto or 0) if f.auto is not None
)
# Interleaved with one chunk per device is 1F1B: the shapes the search re-cuts into chunks,
# and the schedule the peers' defaults use when the request is auto or interleaved.
INTERLEAVED_BASE = "1f1b"

# The ILP's model grows with stages x devices^2; beyond this the DP + local search decide.
ILP_MAX_DEVICES = 32
ILP_MAX_CELLS = 48 * 32
# Stage counts tried by per-count DPs (where one backward DP cannot answer them all).
MAX_FRONT_DPS = 8
# Plans re-cut into interleaved chunks, and the chunks per device tried.
INTERLEAVED_SEEDS = 6
VIRTUAL_CHUNKS = (2, 3, 4)
# Plans the local search starts from, and the fewest simulations it gets from the best.
LOCAL_STARTS = 3
LOCAL_FLOOR = 24
# The search over tensor parallelism and sharding (profiles with tensor-parallel entries):
# beyond MESH_SCALE devices x microbatches, only the MESH_BOUNDED most promising shapes of
# its sweep (by a quick estimate) have their bounds worked out, and pipeplan's plain search
# (DP candidates, ILP, local search over single devices) is left to the sweep's degree 1.
MESH_SCALE = 8192
MESH_BOUNDED = 64


@dataclass
class SolveOptions:
    """Knobs of the search beyond the contract's flags (defaults are what the CLI uses).

    Example::

        SolveOptions(exhaustive_limit=0)  # never enumerate, even on tiny instances
    """

    exhaustive_limit: int = 4000  # simulate everything when the space is at most this big
    top_candidates: int = 6  # DP candidates simulated per (microbatch size, schedule)
    local_search_evals: int = 400  # simulator calls the local search may spend
    use_ilp: bool | None = None  # None: only where the DP is not exact
    baselines: bool = True
