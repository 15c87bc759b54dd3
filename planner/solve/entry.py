""":func:`solve`, the entry point: the arguments checked, pipeplan's own search, the peers
simulated and their plans as seeds, the best plan that fits (the preferred one among those
within the fastest plan's band: :mod:`planner.solve.ties`) returned as a
:class:`~planner.plan.Plan` (or an :class:`InfeasibleError` saying what memory is missing).

``time_limit`` bounds the whole solve: no simulation starts after it (:class:`TimeUp`), and
the best plan simulated by then is returned, its ``solver.status`` ``"time limit"``.

Example::

    plan = solve("profiles/mlp.json", "topologies/nvlink.yaml", num_microbatches=8)
    plan.predicted.iteration_ms, [s.layers for s in plan.stages]
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence

from planner.errors import InputError
from planner.plan import Plan
from planner.precision import check_fp16_schedule
from planner.profile.schema import Profile, as_profile
from planner.schedule.families import family
from planner.solve.arguments import batch_settings, check_args, check_batch_settings
from planner.solve.infeasible import nothing_fits, schedule_does_not_fit
from planner.solve.mesh_search import mesh_search
from planner.solve.options import AUTO_SCHEDULES, MESH_SCALE, SolveOptions
from planner.solve.own_search import own_search
from planner.solve.peer_report import PeerReport, peer_report, seeded_by_peers
from planner.solve.scored import Scored
from planner.solve.search import Search, TimeUp
from planner.solve.ties import choose_plan
from planner.solve.to_plan import to_plan
from planner.topology import Topology, as_topology

__all__ = ["searched", "solve"]


def solve(
    profile: Profile | str | os.PathLike[str],
    topology: Topology | str | os.PathLike[str],
    *,
    global_batch: int | None = None,
    num_microbatches: int | None = None,
    schedule: str = "auto",
    time_limit: float = 60.0,
    profile_path: str | None = None,
    topology_path: str | None = None,
    options: SolveOptions | None = None,
    microbatches: int | None = None,
) -> Plan:
    """The fastest plan (by the simulator) whose every device fits in its memory.

    ``global_batch`` fixes the samples per iteration (the microbatch size is searched over
    the profiled sizes that divide it); ``num_microbatches`` fixes the number of
    microbatches (the size is searched, the objective is then time per sample; the plan
    JSON's and ``simulate``'s name); neither: ``2 x devices`` microbatches. ``time_limit``
    (seconds) bounds the whole solve: past it no simulation starts, every phase stops and
    the best plan simulated so far is returned (``plan.solver.status == "time limit"``;
    an :class:`InputError` naming ``--time-limit`` if none fits yet). Raises
    :class:`InfeasibleError` with the memory that would be needed when nothing fits.
    ``microbatches`` is the old name of ``num_microbatches``: it still works, with a
    DeprecationWarning, for one release.

    Example::

        plan = solve(load_profile("profiles/mlp.json"), load_topology("topologies/nvlink.yaml"),
                     global_batch=64, schedule="auto", time_limit=10)
        plan = solve("profiles/mlp.json", "topologies/nvlink.yaml", num_microbatches=8)
        plan.save("plan.json")
    """
    clock = time.perf_counter()
    if isinstance(profile, str | os.PathLike):
        profile_path = profile_path or str(profile)
    if isinstance(topology, str | os.PathLike):
        topology_path = topology_path or str(topology)
    profile, topology = as_profile(profile), as_topology(topology)
    num_microbatches = _renamed(microbatches, num_microbatches)
    opts = options or SolveOptions()
    check_args(topology, global_batch, num_microbatches, schedule, time_limit)
    if schedule != "auto":
        check_fp16_schedule(profile.precision, schedule, family(schedule).flush, field="--schedule")
    settings = batch_settings(profile, global_batch, num_microbatches, len(topology.devices))
    flag = (
        "--global-batch"
        if global_batch is not None and num_microbatches is None
        else "--microbatches"
    )
    settings = check_batch_settings(settings, profile, len(topology.devices), flag)
    schedules = list(AUTO_SCHEDULES) if schedule == "auto" else [schedule]
    search = Search(profile, topology, opts, time_limit, deadline=clock + time_limit)
    try:
        own = searched(search, settings, schedules)
    except TimeUp:
        own = search.found()  # nothing from the peers yet: the search's own plans
    final = [x for x in own if x.shape.schedule in schedules]
    peers: PeerReport | None = None
    if opts.baselines:
        peers = peer_report(search, settings, schedule)
        try:
            final.extend(seeded_by_peers(search, peers, final, schedules))
        except TimeUp:
            final.extend(x for x in search.found() if x.shape.schedule in schedules)
    if search.cut is not None and not any(x.fits for x in final):
        raise InputError(
            f"no plan that fits was found in {time_limit:g} s ({search.sims} simulations, "
            f"stopped in {search.cut}); expected more time",
            field="--time-limit",
        )
    if not any(x.fits for x in final):  # as min(final, key=Scored.key).fits
        if not any(x.fits for x in own):
            raise nothing_fits(profile, topology, settings)
        raise schedule_does_not_fit(schedule)
    # Plans within the fastest one's band are ties, broken by a preference that is no time
    # (planner.solve.ties), so that noise inside the band cannot flip the choice.
    choice = choose_plan(final, search)
    mine = [x for x in own if x.shape.schedule in schedules and x.fits]
    return to_plan(
        search,
        choice,
        peers,
        profile_path,
        topology_path,
        time.perf_counter() - clock,
        # What the search found on its own: its fastest, before any tie-break.
        unseeded=min(mine, key=Scored.key) if mine else None,
    )


def searched(
    search: Search, settings: Sequence[tuple[int, int]], schedules: Sequence[str]
) -> list[Scored]:
    """pipeplan's own search, before any peer plan joins: the plain search
    (:func:`~planner.solve.own_search.own_search`) and, where the profile has
    tensor-parallel entries, the search over tensor parallelism, sequence parallelism and
    sharding (:func:`~planner.solve.mesh_search.mesh_search`) beside it; on big instances
    (devices x microbatches above :data:`~planner.solve.options.MESH_SCALE`) the latter
    alone, its degree 1 covering the plain plans.

    Example::

        best = min(searched(search, [(4, 8)], ["1f1b"]), key=Scored.key)
    """
    if search.profile.tensor_parallel is None:
        return own_search(search, settings, schedules)
    scale = len(search.topology.devices) * max(m for _, m in settings)
    own = own_search(search, settings, schedules) if scale <= MESH_SCALE else []
    return [*own, *mesh_search(search, settings, schedules, own)]


def _renamed(microbatches: int | None, num_microbatches: int | None) -> int | None:
    """``num_microbatches``, or the deprecated ``microbatches`` (with a warning)."""
    if microbatches is None:
        return num_microbatches
    warnings.warn(
        "solve(microbatches=...) is deprecated; use num_microbatches=... (the plan's and "
        "simulate's name for it)",
        DeprecationWarning,
        stacklevel=3,
    )
    if num_microbatches is not None and microbatches != num_microbatches:
        raise InputError(
            "give num_microbatches (or its old name microbatches), not both",
            field="num_microbatches",
        )
    return microbatches
