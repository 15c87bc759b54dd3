"""Re-cutting the layers over fixed device groups: the DP over given stage groups
(:func:`cut_over`, once per search through :func:`recut`), and the interleaved versions of a
plan (:func:`interleaved`: each group holding ``v`` chunks).

Example::

    recut(search, [("gpu0",), ("gpu1",)], "1f1b", 4, 8)  # even, full-model and compute-only
    interleaved(search, shape, "interleaved")  # the plan's groups with 2, 3 and 4 chunks each
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.partition.baselines import uniform_partition
from planner.partition.dp import layer_costs, partition_chain
from planner.partition.mapping import links_between, slots_along
from planner.schedule.families import family
from planner.shape import PlanShape
from planner.solve.memory import in_flight, weight_versions
from planner.solve.options import VIRTUAL_CHUNKS
from planner.solve.search import Search, make_shape

__all__ = ["cut_over", "interleaved", "recut"]


def interleaved(search: Search, c: PlanShape, schedule: str) -> list[PlanShape]:
    """Versions of a plan whose stages have equally many replicas under ``schedule``, a
    family with several chunks per device: its stages' device groups in order, each
    holding ``v`` chunks (``v`` in :data:`planner.solve.options.VIRTUAL_CHUNKS`) where the
    family places them, the layers re-cut by the DP over the ``v * p`` chunks (with its
    all-reduce term and without it: see :func:`recut`).

    Example::

        {x.virtual_stages for x in interleaved(search, shape, "interleaved")}  # {2, 3, 4}
    """
    sizes = {len(s.devices) for s in c.stages}
    if len(sizes) != 1 or c.virtual_stages > 1:
        return []
    (r,) = sizes
    p = len(c.stages)
    n = search.profile.num_layers
    m = c.num_microbatches
    if p < 2 or m % p or (m // r) % p:
        return []
    groups = [s.devices for s in c.stages]
    place = family(schedule).place
    out = []
    for v in VIRTUAL_CHUNKS:
        if n < v * p:
            break
        out.extend(recut(search, place(groups, v), schedule, c.microbatch_size, m, v))
    return out


# recut is cut_over's cache: the same parameters, written out (duplicates pairs the two
# signatures), so that the cache key names every one of them.
def recut(
    search: Search,
    groups: Sequence[tuple[str, ...]],
    schedule: str,
    mb: int,
    num_microbatches: int,
    virtual: int = 1,
    *,
    full: bool = True,
) -> list[PlanShape]:
    """:func:`cut_over` once per search for each set of arguments (a copy of the list).

    Example::

        recut(search, [("gpu0",), ("gpu1",)], "1f1b", 4, 8)
    """
    key = (tuple(groups), schedule, mb, num_microbatches, virtual, full)
    hit = search.recuts.get(key)
    if hit is None:
        hit = search.recuts[key] = cut_over(
            search, groups, schedule, mb, num_microbatches, virtual, full=full
        )
    return list(hit)


def cut_over(
    search: Search,
    groups: Sequence[tuple[str, ...]],
    schedule: str,
    mb: int,
    num_microbatches: int,
    virtual: int = 1,
    *,
    full: bool = True,
) -> list[PlanShape]:
    """The DP's partitions of all layers over these stage groups (``virtual`` chunks per
    group), twice: with the DP's full model (compute, a per-microbatch share of each
    stage's all-reduce, the transfer to the next group), and with compute alone. In the
    simulator a stage's all-reduce runs once, after its last backward, so it adds to the
    drain rather than to every microbatch, and the replicas' transfers run side by side
    and overlap compute; on many replicas the full model skews the split towards cheap
    all-reduces and cuts, which the compute-only split does not. ``full=False``: only the
    compute-only split (the caller has the other). Plus the equal-layer split.

    Example::

        cut_over(search, [("gpu0", "gpu1"), ("gpu2", "gpu3")], "1f1b", 4, 8)
    """
    r = len(groups[0])
    path = [d for g in groups for d in g]
    slots = slots_along(search.topology, path, replicas=r)
    slots = [
        type(sl)(sl.devices, sl.speed, sl.memory_bytes / virtual, sl.allreduce) for sl in slots
    ]
    bare = [type(sl)(sl.devices, sl.speed, sl.memory_bytes) for sl in slots]
    variants = [slots, bare] if full else [bare]
    k = len(slots)
    stashed = [in_flight(schedule, k, i, num_microbatches, virtual, r) for i in range(k)]
    costs = layer_costs(search.profile, mb)
    out: list[PlanShape] = []
    if len(slots) <= search.profile.num_layers:
        # Equal layer counts: on uniform layers the DP's ties (where the light chunks go)
        # matter to the schedule, and the even split is a tie the DP may not pick.
        even = uniform_partition(search.profile.num_layers, len(slots))
        out.append(
            make_shape(search, even, groups, schedule, mb, num_microbatches, virtual=virtual)
        )
    for variant in variants:
        part = partition_chain(
            costs,
            variant,
            in_flight=stashed,
            num_microbatches=num_microbatches,
            links=links_between(search.topology, variant) if variant is slots else None,
            weight_versions=weight_versions(schedule),
        )
        if part is None:
            continue
        cand = make_shape(
            search,
            part.ranges,
            groups,
            schedule,
            mb,
            num_microbatches,
            recompute=part.recompute,
            virtual=virtual,
        )
        if cand not in out:
            out.append(cand)
    return out
