"""pipeplan's own search, before any peer plan joins its pool: exhaustive on tiny instances,
else the DP's candidates, the depth x replication grid, the ILP and local search; then every
allowed schedule on the winner and interleaved re-cuts of the best few.

Example::

    scored = own_search(search, [(4, 8)], AUTO_SCHEDULES)
    best = min(scored, key=Scored.key)
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.partition.dp import layer_costs
from planner.partition.mapping import candidate_paths, identical_devices, uniform_network
from planner.schedule.families import family
from planner.shape import PlanShape
from planner.solve.dp_candidates import dp_candidates
from planner.solve.exhaustive import exhaustive, exhaustive_size
from planner.solve.grid import by_bound, grid_interleaved, grid_shapes
from planner.solve.ilp_candidate import run_ilp
from planner.solve.local import distinct_starts, local_budget, local_search
from planner.solve.options import INTERLEAVED_BASE, INTERLEAVED_SEEDS, LOCAL_STARTS
from planner.solve.recut import interleaved
from planner.solve.scored import Scored
from planner.solve.search import Search, make_shape

__all__ = ["other_schedules", "own_search"]


def _candidate_search(
    search: Search,
    settings: Sequence[tuple[int, int]],
    schedules: Sequence[str],
    primary: Sequence[str],
) -> list[Scored]:
    """The DP's best few per setting and schedule, the grid (and its interleaved re-cuts)
    by bound, the ILP where the DP is not exact, then local search from the best few."""
    profile, topology, opts = search.profile, search.topology, search.options
    names = topology.device_names()
    scored: list[Scored] = []
    homogeneous = identical_devices(topology) and uniform_network(topology)
    # Each simulation costs about devices x microbatches; big instances simulate fewer.
    scale = len(names) * max(m for _, m in settings)
    search.methods.append("dp")
    paths = [names] if homogeneous else candidate_paths(topology)
    top = max(1, min(opts.top_candidates, opts.top_candidates * 2048 // scale))
    grid: list[PlanShape] = []
    for mb, m in settings:
        costs = layer_costs(profile, mb)
        for sched in primary:
            cands = dp_candidates(search, costs, paths, sched, m)
            for c in cands[:top]:
                cand = make_shape(search, c.ranges, c.groups, sched, mb, m, recompute=c.recompute)
                scored.append(search.evaluate(cand, "dp"))
            grid.extend(grid_shapes(search, cands, sched, mb, m))
    starts = LOCAL_STARTS if scale <= 2048 else 1
    scored.extend(by_bound(search, grid, scored, "grid", starts))
    for sched in (s for s in schedules if family(s).interleaved):
        chunked = grid_interleaved(search, grid, scored, sched)
        scored.extend(by_bound(search, chunked, scored, "grid interleaved", starts))
    use_ilp = opts.use_ilp
    if use_ilp is None:
        use_ilp = not homogeneous
    if use_ilp and scored:
        # The ILP (CBC) gets half of what is left of the time limit: the local search and
        # the peers that follow get the other half.
        search.check_clock("ilp")
        left = min(search.time_limit, search.seconds_left()) / 2
        from_ilp = run_ilp(search, min(scored, key=Scored.key), primary, left)
        if from_ilp is not None:
            scored.append(from_ilp)
    # Local search from the best few distinct plans (the best gets the full budget).
    firsts = distinct_starts(scored, starts)
    if firsts:
        search.methods.append("local search")
    for rank, start in enumerate(firsts):
        budget = local_budget(opts.local_search_evals, start)
        scored.append(local_search(search, start, budget if rank == 0 else budget // 6))
    return scored


def own_search(
    search: Search, settings: Sequence[tuple[int, int]], schedules: Sequence[str]
) -> list[Scored]:
    """pipeplan's own search, without any peer plan in its pool: exhaustive on tiny
    instances, else DP candidates, the ILP and local search; then every allowed schedule
    on the winner and interleaved re-cuts of the best few.

    Example::

        own_search(search, [(4, 8)], [INTERLEAVED_BASE])
    """
    primary = [s for s in schedules if not family(s).interleaved] or [INTERLEAVED_BASE]
    chunked = [s for s in schedules if family(s).interleaved]
    names = search.topology.device_names()
    space = exhaustive_size(search.profile.num_layers, len(names)) * len(settings) * len(primary)
    scale = len(names) * max(m for _, m in settings)
    if space <= search.options.exhaustive_limit:
        search.methods.append("exhaustive")
        scored = exhaustive(search, primary, settings)
    else:
        scored = _candidate_search(search, settings, schedules, primary)
    if not any(x.fits for x in scored):  # as min(scored, key=Scored.key).fits
        return scored
    best = min(scored, key=Scored.key)
    scored.extend(other_schedules(search, best, schedules))
    if chunked:
        # Seeds were planned for flushing one-chunk schedules; re-cut the best few.
        count = INTERLEAVED_SEEDS if scale <= 2048 else 1
        pipelines = [x for x in scored if x.shape.virtual_stages == 1 and len(x.shape.stages) > 1]
        for seed in distinct_starts(pipelines, count):
            for e in (e for sched in chunked for e in interleaved(search, seed.shape, sched)):
                if not search.cannot_beat(e, best):
                    scored.append(search.evaluate(e, "interleaved"))
                    best = min(best, scored[-1], key=Scored.key)
    return scored


def other_schedules(search: Search, best: Scored, schedules: Sequence[str]) -> list[Scored]:
    """The winner's partition under every other schedule the user allowed.

    Example::

        other_schedules(search, best, AUTO_SCHEDULES)
    """
    c = best.shape
    out: list[Scored] = []
    for sched in schedules:
        if sched == c.schedule:
            continue
        if family(sched).interleaved:
            extra = interleaved(search, c, sched)
        else:
            ranges = [s.layers for s in c.stages]
            groups = [s.devices for s in c.stages]
            extra = [
                make_shape(search, ranges, groups, sched, c.microbatch_size, c.num_microbatches)
            ]
        # One that cannot beat the winner by its bound could change nothing.
        out.extend(
            search.evaluate(e, f"schedule {sched}")
            for e in extra
            if not search.cannot_beat(e, best)
        )
    return out
