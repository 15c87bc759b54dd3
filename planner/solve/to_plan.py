"""The winning candidate as a :class:`~planner.plan.Plan`: its simulation, the solver's
record (method, status, gap to the global lower bound, simulations, ILP, what the search
found without the peers) and the peers' rows, through :func:`planner.plan.plan_from_simulation`.

Example::

    plan = to_plan(search, choice, peers, "profiles/mlp.json", "topologies/nvlink.yaml", 1.2)
    plan.solver.method  # "dp+ilp+local search -> dp"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.cost import stage_compute_ms
from planner.plan import Plan, plan_from_simulation
from planner.plan_parts import FileRef, SolverInfo, WithoutPeers
from planner.profile.schema import Profile
from planner.solve.peer_report import PeerReport, peer_rows
from planner.solve.scored import Scored
from planner.solve.search import Search
from planner.solve.ties import Choice

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["global_lower_bound_ms", "to_plan"]


def global_lower_bound_ms(
    profile: Profile, topology: Topology, mb: int, num_microbatches: int
) -> float:
    """No plan beats every device computing an equal share of the work, never idle.

    Example::

        global_lower_bound_ms(profile, topology, 4, 8)
    """
    f, b = stage_compute_ms(profile, 0, profile.num_layers - 1, mb)
    total_speed = sum(d.speed for d in topology.devices)
    return num_microbatches * (f + b) / total_speed


def _file_ref(path: str | None, obj: Any) -> FileRef:
    """The input as the plan records it: its file, or the object itself when unsaved."""
    return FileRef.of_file(path) if path is not None else FileRef.in_memory(obj)


def _solver_info(
    search: Search, choice: Choice, lower_bound_ms: float, seconds: float, unseeded: Scored | None
) -> SolverInfo:
    """How the plan was found: methods, status (``time limit`` where the limit stopped the
    search), gap to the bound, the ties within the band, the search alone."""
    best = choice.best
    c = best.shape
    lb = lower_bound_ms
    gap = best.iteration_ms / lb - 1.0 if lb > 0 else None
    method = "+".join(search.methods) + f" -> {best.origin}"
    status = "optimal" if "exhaustive" in search.methods else "best found"
    if search.cut is not None:
        # The time limit stopped the search: the best plan simulated before it.
        method, status = f"{method} (stopped in {search.cut})", "time limit"
    solver = SolverInfo(
        method=method,
        status=status,
        seconds=round(seconds, 3),
        gap=None if gap is None else round(gap, 6),
        simulations=search.sims,
        ilp=search.ilp,
        ties=choice.ties,
        tie_tolerance=round(choice.tolerance, 6),
        fastest_ms=None if best is choice.fastest else choice.fastest.per_sample_ms * c.samples,
    )
    if unseeded is not None:
        # What the search found on its own, before any peer plan joined the pool.
        u = unseeded.shape
        solver.without_peers = WithoutPeers(
            iteration_ms=unseeded.per_sample_ms * c.samples,
            microbatch_size=u.microbatch_size,
            num_microbatches=u.num_microbatches,
            schedule=u.schedule,
            stages=[(s.layers, s.devices) for s in u.stages],
            origin=unseeded.origin,
        )
    return solver


def to_plan(
    search: Search,
    choice: Choice,
    peers: PeerReport | None,
    profile_path: str | None,
    topology_path: str | None,
    seconds: float,
    *,
    unseeded: Scored | None = None,
) -> Plan:
    """The plan of ``choice.best`` (simulated) with its band, the solver's record and the
    peers' rows.

    Example::

        to_plan(search, choose_plan(pool, search), None, None, None, 0.5).predicted.iteration_ms
    """
    best = choice.best
    c = best.shape
    topo = search.topology
    lb = global_lower_bound_ms(search.profile, topo, c.microbatch_size, c.num_microbatches)
    return plan_from_simulation(
        search.result_of(best),
        list(c.stages),
        profile=_file_ref(profile_path, search.profile.to_dict()),
        topology=_file_ref(topology_path, topo.to_dict()),
        solver=_solver_info(search, choice, lb, seconds, unseeded),
        baselines=peer_rows(peers, c.samples),
        global_lower_bound_ms=lb,
        band_ms=choice.band.as_list(),
    )
