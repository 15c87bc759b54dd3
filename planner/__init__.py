"""pipeplan: plan, simulate and run pipeline-parallel training of PyTorch models.

The public API (the CLI is a thin layer over it; see docs/api.md)::

    import planner

    profile = planner.load_profile("profiles/gpt.json")
    topology = planner.load_topology("topologies/dgx1-v100.yaml")
    plan = planner.solve(profile, topology, global_batch=32)
    plan.save("plan.json")
    result = planner.simulate(profile, topology, stages=plan.stages,
                              schedule="1f1b", num_microbatches=8, microbatch_size=4)
    result.iteration_ms, result.memory_bytes
    planner.Plan.load("plan.json")

``planner.solve`` and ``planner.simulate`` are the functions; their modules stay importable
as ``from planner.solve import ...`` and ``from planner.simulate import ...``.
"""

from planner.errors import InfeasibleError, InputError
from planner.plan import Plan, PlanShape, StageSpec
from planner.profile import Profile, load_profile, profile_model
from planner.simulate import SimResult, simulate
from planner.solve import solve
from planner.topology import Topology, load_topology

__all__ = [
    "InfeasibleError",
    "InputError",
    "Plan",
    "PlanShape",
    "Profile",
    "SimResult",
    "StageSpec",
    "Topology",
    "load_profile",
    "load_topology",
    "profile_model",
    "simulate",
    "solve",
]
__version__ = "0.1.0"
