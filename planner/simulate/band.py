"""How sure a prediction is: the iteration time with every layer at either end of its spread.

The rule (docs/simulate.md#the-band): the plan's very schedule is simulated twice more,
once on the profile with every layer's forward, backward and backward halves at the
first quartile of its repeats and once at the third
(:func:`planner.profile.spread.quantile_profile`). The band is ``[low, high]`` of those
two iteration times, widened where needed to contain the prediction itself. Every layer
moves to the same end at once: a machine that is slow is slow for all of a stage's
layers, so the band is the prediction as the profile's faster and slower quarter of
repeats would have made it, not a sum of independent errors. Transfers, all-reduces and
the optimizer step keep their point values (the profile keeps no spread for them). A
profile without spreads (imported, analytic, older files) gives a band of zero width.

Example::

    result = simulate(profile, topology, stages, "1f1b", 8, 4)
    band = prediction_band(profile, topology, stages, result)
    band.low_ms <= result.iteration_ms <= band.high_ms   # True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.profile.schema import Profile
from planner.profile.spread import has_spread, quantile_profile
from planner.simulate.iteration import simulate
from planner.simulate.result import SimResult
from planner.stages import StageSpec
from planner.topology import Topology

__all__ = ["Band", "prediction_band"]


@dataclass(frozen=True)
class Band:
    """A predicted iteration time's band, ms: ``low_ms <= predicted <= high_ms``.

    Example::

        Band(172.0, 205.0).contains(189.0)   # True
    """

    low_ms: float
    high_ms: float

    def contains(self, ms: float) -> bool:
        """Whether ``ms`` lies inside the band (ends included)."""
        return self.low_ms <= ms <= self.high_ms

    def as_list(self) -> list[float]:
        """``[low_ms, high_ms]``, as a plan stores it."""
        return [self.low_ms, self.high_ms]

    def relative(self, predicted_ms: float) -> tuple[float, float]:
        """The ends over the prediction, e.g. ``(0.91, 1.08)``.

        Example::

            Band(90.0, 110.0).relative(100.0)   # (0.9, 1.1)
        """
        if predicted_ms <= 0:
            return (1.0, 1.0)
        return (self.low_ms / predicted_ms, self.high_ms / predicted_ms)


def prediction_band(
    profile: Profile,
    topology: Topology | None,
    stages: Sequence[StageSpec],
    result: SimResult,
    *,
    step_ms: float | Sequence[float] | None = None,
) -> Band:
    """The band of ``result`` (a simulation of ``stages`` on ``profile`` and ``topology``):
    its schedule simulated again with every layer at the low and at the high end of its
    spread (see the module's rule). ``step_ms`` must be what ``result`` was simulated with.

    Example::

        prediction_band(profile, topology, plan.stages, resimulate(plan, path)).as_list()
    """
    predicted = float(result.iteration_ms)
    if not has_spread(profile):
        return Band(predicted, predicted)
    ends = [
        simulate(
            quantile_profile(profile, side),
            topology,
            stages,
            result.schedule,
            result.num_microbatches,
            result.microbatch_size,
            step_ms=step_ms,
            events=False,
            validate=False,
        ).iteration_ms
        for side in ("low", "high")
    ]
    return Band(min(predicted, float(ends[0])), max(predicted, float(ends[1])))
