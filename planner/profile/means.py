"""A layer's times as the profile file holds them (medians) and as the planner adds them up (means).

The profile format (``../shared/contract.md``) says a layer's ``forward_ms``,
``backward_ms``, ``backward_input_ms`` and ``backward_weight_ms`` are medians over the
timed repeats; the file keeps them so. Beside them a measured entry (a layer's timing, a
tensor-parallel shard's) has ``mean``: the means of the same repeats, e.g.
``{"forward_ms": 1.2871, ...}``. A run adds up every layer's runs, the machine's slow spells
included, which a median leaves out (docs/profile.md, issue 23), so the planner computes
with the means: read in, each field holds its mean and ``median`` keeps the file's value,
which is written back in its place.

A median outside its own spread (``spread``'s quartiles) cannot have been measured with
it: the field was edited by hand, so it is used as written and that mean and spread are
dropped.
Entries without ``mean`` (analytic and imported profiles, files written before it) are read
as they are.

Example::

    t = LayerTiming(1.0, 2.0, 1.0, 1.0, 64, 64, spread={"forward_ms": [0.9, 1.2]})
    t.mean = {"forward_ms": 1.1}
    take_means(t)                     # t.forward_ms == 1.1, t.median == {"forward_ms": 1.0}
    timing_fields(t, {"forward_ms": t.forward_ms})
    # {"forward_ms": 1.0, "mean": {"forward_ms": 1.1}}
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["SPIKE", "Timed", "measured", "spike_free_mean", "take_means", "timing_fields"]


SPIKE = 2.0
"""A timed run over ``SPIKE`` times its median is a spike (see :func:`spike_free_mean`)."""


def spike_free_mean(samples: Sequence[float]) -> float:
    """The mean of ``samples`` without its spikes: runs over :data:`SPIKE` times the median.

    A spike is the operating system running something else on the core in the middle of one
    timed run (a layer's 2 ms forward timed at 8 ms). While a co-located profile times its
    layers, every core is busy (the measuring process and its companions), so such work
    can only preempt a timed run; in the plan's run the same work falls in the stages'
    waits. Measured on the 2-core VM (issue 23, 2026-11-28): in co-located profiles of the
    five examples 2-6% of the layers' runs were spikes (up to 10x the median), which put
    the means 5-20% above what the runs then measured per stage. Slow spells (runs at
    1.1-1.5x the median, a few rounds long) are not spikes and stay in the mean: a run's
    steps add them up as well.

    Example::

        round(spike_free_mean([1.0, 1.1, 1.2, 9.0]), 3)   # 1.1: the 9.0 is a spike
        spike_free_mean([1.0, 1.0, 1.4, 1.5])   # 1.225: a slow spell, kept
    """
    middle = statistics.median(samples)
    kept = [x for x in samples if x <= SPIKE * middle]
    return statistics.fmean(kept)


class Timed(Protocol):
    """A layer's timing or a shard's: the four times, ``spread``, ``mean`` and ``median``."""

    spread: dict[str, list[float]]
    mean: dict[str, float]
    median: dict[str, float]


def measured(timing: Timed, medians: dict[str, float], means: dict[str, float]) -> Timed:
    """``timing`` holding ``means`` in its fields and ``medians`` beside them, as a
    profiler leaves a freshly measured entry.

    Example::

        measured(t, {"forward_ms": 1.0}, {"forward_ms": 1.1}).forward_ms   # 1.1
    """
    for name, value in means.items():
        setattr(timing, name, value)
    timing.median = dict(medians)
    timing.mean = {}
    return timing


def take_means(timing: Timed) -> None:
    """Move the ``mean`` read from a file into ``timing``'s fields, keeping the file's
    medians in ``median`` (a median outside its spread was edited: kept, its mean dropped).

    Example::

        take_means(t)   # after read_record: t.forward_ms is the mean now
    """
    medians: dict[str, float] = {}
    for name, mean in timing.mean.items():
        median = float(getattr(timing, name))
        ends = timing.spread.get(name) or []
        if len(ends) == 2 and not min(ends) <= median <= max(ends):
            # Edited by hand: the field as written, and the spread, which was not
            # measured around it, dropped (the band would reach back to it otherwise).
            del timing.spread[name]
            continue
        medians[name] = median
        setattr(timing, name, mean)
    timing.median = medians
    timing.mean = {}


def timing_fields(timing: Timed, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` (``timing``'s fields as written) with the medians in the time fields and
    the means, the fields' values, under ``mean``; unchanged where there are no medians.

    Example::

        timing_fields(t, pass_costs_dict(t))["mean"]["forward_ms"]
    """
    if not timing.median:
        return out
    out["mean"] = {name: out[name] for name in timing.median}
    for name, median in timing.median.items():
        out[name] = median
    return out
