"""A plan whose plan devices all share one GPU (``run``'s shared mode), predicted.

The simulation times each plan device as if it had a GPU of its own. On one GPU the
devices' work runs one action after another, and the GPU holds every device's memory at
once, so the prediction is the sum of every simulated F/B/I/W and each stage's STEP (once:
local replicas step once), and the peak over time of the devices' simulated levels added
up. Kernels of different streams may overlap a little at small sizes, which this leaves out.

Example::

    ms, nbytes = one_device_prediction(simulate(profile, None, stages, "1f1b", 4, 8))
"""

from __future__ import annotations

from planner.simulate.result import SimResult

__all__ = ["one_device_prediction"]


def one_device_prediction(result: SimResult) -> tuple[float, int]:
    """``(iteration ms, peak bytes)`` of ``result``'s plan with every plan device on one GPU.

    Example::

        ms, nbytes = one_device_prediction(simulate(profile, None, stages, "1f1b", 3, 1))
    """
    compute = sum(e.end_ms - e.start_ms for e in result.events if e.kind in ("F", "B", "I", "W"))
    by_time: dict[float, list[tuple[str, int]]] = {}
    for dev, curve in result.memory_timeline.items():
        for t, level in curve:
            by_time.setdefault(t, []).append((dev, level))
    levels = dict.fromkeys(result.memory_timeline, 0)
    peak = 0
    for t in sorted(by_time):
        # The changes of one instant together (each device's last one holds from there).
        for dev, level in by_time[t]:
            levels[dev] = level
        peak = max(peak, sum(levels.values()))
    return compute + sum(result.step_ms), peak
