"""A plan from a simulated partition (``pipeplan simulate -o``).

Example::

    plan = plan_from_result(result, stages, profile_path="p.json", topology_path=None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planner.fileio import sha256_file
from planner.plan import Plan, StageSpec
from planner.simulate.result import SimResult

__all__ = ["plan_from_result"]


def plan_from_result(
    result: SimResult,
    stages: Sequence[StageSpec],
    *,
    profile_path: str | None,
    topology_path: str | None,
    solver: dict[str, Any] | None = None,
    baselines: list[dict[str, Any]] | None = None,
) -> Plan:
    """A :class:`~planner.plan.Plan` holding a simulated partition and its schedule.

    The profile's and topology's sha256 are recorded so ``show`` and ``run`` can refuse
    a plan whose inputs changed.

    Example::

        plan = plan_from_result(result, stages, profile_path="p.json", topology_path=None)
        plan.save("plan.json")
    """

    def ref(path: str | None) -> dict[str, Any]:
        if path is None:
            return {"path": None, "sha256": None}
        return {"path": str(path), "sha256": sha256_file(path)}

    return Plan(
        profile=ref(profile_path),
        topology=ref(topology_path),
        microbatch_size=result.microbatch_size,
        num_microbatches=result.num_microbatches,
        stages=[StageSpec(s.id, (s.first, s.last), list(s.devices), s.recompute) for s in stages],
        schedule=result.schedule.to_dict(),
        predicted=result.predicted(),
        solver=solver or {"method": "manual", "status": "given", "seconds": 0.0, "gap": None},
        baselines=list(baselines or []),
    )
