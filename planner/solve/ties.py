"""The solver's final choice: plans equal within the noise of their profile are ties.

Two profiles of one model on one machine differ within their spread, and so do the times
the simulator gives their plans; the fastest plan by a hair would flip from solve to
solve. The rule (docs/solve.md#ties-within-the-noise):

1. the *anchor* is the fastest plan that fits (:meth:`Scored.key`);
2. its band is :func:`planner.simulate.band.prediction_band` (every layer at the low and
   at the high end of its profiled spread);
3. every plan that fits and whose predicted time per sample exceeds the anchor's by at
   most :func:`tie_tolerance` (about 0.59 of the band's relative width for a profile of 5
   repeats: how far apart two profiles' medians typically are; at most 10%) is a tie, the
   anchor included; a profile without spreads has a band of zero width, and then only plans
   exactly as fast tie;
4. among the ties the preferred plan is chosen by :func:`preference`: fewer devices, the
   more conventional schedule (1f1b, gpipe, zb, interleaved, then the others), fewer
   chunks per device, fewer stages, fewer recompute stages, the larger microbatch, fewer
   microbatches, the stages' layer ranges in order; only plans with the same compute on
   other devices (where communication alone differs, which the profile's noise does not
   move) are then ordered by their time, and last by device names.

Example::

    choice = choose_plan(final, search)
    choice.best, choice.band.as_list(), choice.fastest, choice.ties
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.profile.schema import Profile
from planner.simulate.band import Band, prediction_band
from planner.solve.options import AUTO_SCHEDULES
from planner.solve.scored import Scored
from planner.solve.search import Search

__all__ = ["MAX_TIE_TOLERANCE", "Choice", "choose_plan", "preference", "tie_tolerance"]

# The median of n samples varies with a standard deviation of about 1.25 sigma / sqrt(n);
# two such medians differ by sqrt(2) times that; an interquartile range is 1.35 sigma.
_SPREAD_TO_TIE = 1.25 * math.sqrt(2.0) / 1.35

MAX_TIE_TOLERANCE = 0.10
"""The most two plans may differ and still tie: a profile measured on a busy machine has
layer spreads so wide that its band would tie plans 2x apart (seen on the 2-core VM under
load 4), and there choosing a slower plan is the larger risk than a flip between solves."""


@dataclass(frozen=True)
class Choice:
    """The chosen plan and its band, the fastest plan (the anchor) and its band, how many
    distinct plans tied, and the tolerance (relative) they tied within."""

    best: Scored
    band: Band
    fastest: Scored
    fastest_band: Band
    ties: int
    tolerance: float


def preference(scored: Scored) -> tuple[Any, ...]:
    """The order among ties (smaller is preferred): the plan's shape first; its time only
    between plans whose layer ranges and microbatching are the same.

    Example::

        min(ties, key=preference)
    """
    c = scored.shape
    schedule = AUTO_SCHEDULES.index(c.schedule) if c.schedule in AUTO_SCHEDULES else 9
    return (
        sum(len(s.devices) for s in c.stages),
        schedule,
        c.schedule,
        c.virtual_stages,
        len(c.stages),
        sum(1 for s in c.stages if s.recompute),
        -c.microbatch_size,
        c.num_microbatches,
        tuple(s.layers for s in c.stages),
        # The same compute on other devices: only communication differs, which the
        # profile's noise does not move, so the faster placement is the stable choice.
        round(scored.per_sample_ms, 9),
        tuple(s.devices for s in c.stages),
    )


def tie_tolerance(profile: Profile, band: Band, predicted_ms: float) -> float:
    """How much slower than the fastest plan a tie may be, relative: the standard deviation
    of the difference between two profiles' medians over ``repeat`` runs each, taken from
    the band (which spans the repeats' quartiles: about 1.35 standard deviations), i.e.
    ``1.25 * sqrt(2) / 1.35 / sqrt(repeat)`` times the band's relative width (0.59 of it
    for the profiler's 5 repeats), at most :data:`MAX_TIE_TOLERANCE`. 0 for a band of zero
    width.

    Example::

        tie_tolerance(profile, Band(90.0, 110.0), 100.0)   # 0.117 with 5 repeats
    """
    if predicted_ms <= 0:
        return 0.0
    repeat = profile.meta.get("repeat")
    n = repeat if isinstance(repeat, int) and not isinstance(repeat, bool) and repeat > 0 else 5
    width = (band.high_ms - band.low_ms) / predicted_ms
    return min(MAX_TIE_TOLERANCE, _SPREAD_TO_TIE / math.sqrt(n) * width)


def choose_plan(pool: Sequence[Scored], search: Search) -> Choice:
    """The preferred plan among those tied with the fastest fitting plan (the module's
    rule). ``pool`` must hold a plan that fits.

    Example::

        choose_plan(final, search).best.shape.schedule
    """
    fitting = [x for x in pool if x.fits]
    if not fitting:
        raise ValueError("no plan in the pool fits")
    fastest = min(fitting, key=Scored.key)
    stages = list(fastest.shape.stages)
    band = prediction_band(search.profile, search.topology, stages, search.result_of(fastest))
    tolerance = tie_tolerance(search.profile, band, fastest.iteration_ms)
    limit = fastest.per_sample_ms * (1.0 + tolerance)
    # The same rounding as Scored.key, so the anchor is always its own tie.
    ties = [x for x in fitting if round(x.per_sample_ms, 9) <= round(limit, 9)]
    best = min(ties, key=preference)
    own = band
    if best is not fastest:
        result = search.result_of(best)
        own = prediction_band(search.profile, search.topology, list(best.shape.stages), result)
    return Choice(best, own, fastest, band, len({x.shape for x in ties}), tolerance)
