"""A profile's spread: every layer at the low or the high end of its measured repeats.

The profiler keeps, beside each timing (the mean of its repeats), its spread over them
(``LayerTiming.spread``, e.g. ``{"forward_ms": [p25, p75]}``: the quartiles; a
tensor-parallel shard's entry, ``LayerTiming.sharded[key].spread``, likewise). A
*quantile profile* is a copy of the profile with every timing replaced by one end of its
spread: ``low`` (the first quartile) or ``high`` (the third). Simulating a plan on both
gives its prediction band (:mod:`planner.simulate.band`). Timings without a spread
(imported or analytic profiles, an older file) keep their value, so a profile without
any spread has a band of zero width.

Example::

    fast, slow = quantile_profile(profile, "low"), quantile_profile(profile, "high")
    has_spread(profile)   # False for an imported PipeDream profile
"""

from __future__ import annotations

import copy
from typing import Literal

from planner.profile.schema import LayerTiming, Profile
from planner.profile.sharding import ShardTiming

__all__ = ["SIDES", "Side", "has_spread", "quantile_profile"]

Side = Literal["low", "high"]
SIDES: tuple[Side, Side] = ("low", "high")

_TIMINGS = ("forward_ms", "backward_ms", "backward_input_ms", "backward_weight_ms")


def has_spread(profile: Profile) -> bool:
    """Whether any timing of ``profile`` has a spread wider than nothing.

    Example::

        has_spread(load_profile("profiles/gpt.json"))   # True: a measured profile
    """
    return any(
        _end(t, name, "low") != _end(t, name, "high")
        for m in profile.measurements
        for layer in m.layers
        for t in _timings(layer)
        for name in _TIMINGS
    )


def quantile_profile(profile: Profile, side: Side) -> Profile:
    """A copy of ``profile`` with every layer timing at the ``side`` end of its spread.

    The ends are ordered (``low`` never above the timing, ``high`` never below it: a
    spread that excludes it, as a mean above the third quartile after a slow spell or a
    hand-edited file may, is widened to include it), so the low profile is never slower
    and the high one never faster than the profile itself. The copy has no spreads of its own.

    Example::

        quantile_profile(profile, "high").measurement(4).layers[1].forward_ms
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    out = copy.deepcopy(profile)
    for measurement in out.measurements:
        for layer in measurement.layers:
            # A tensor-parallel shard's entries have their own spread: a plan with TP
            # stages is timed from them, and its band had zero width without this.
            for t in _timings(layer):
                ends = {name: _end(t, name, side) for name in _TIMINGS}
                t.forward_ms = ends["forward_ms"]
                t.backward_ms = ends["backward_ms"]
                t.backward_input_ms = ends["backward_input_ms"]
                t.backward_weight_ms = ends["backward_weight_ms"]
                t.spread = {}
                t.median = {}
    return out


def _timings(layer: LayerTiming) -> list[LayerTiming | ShardTiming]:
    """The layer's own timing and its tensor-parallel shards' entries."""
    return [layer, *layer.sharded.values()]


def _end(t: LayerTiming | ShardTiming, name: str, side: Side) -> float:
    """One end of a timing's spread, on the right side of the timing (the timing where
    there is no spread)."""
    value = float(getattr(t, name))
    values = t.spread.get(name) or []
    if len(values) < 2:
        return value
    if side == "low":
        return min(value, float(min(values)))
    return max(value, float(max(values)))
