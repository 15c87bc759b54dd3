"""What a profile saw beside it: the co-located processes, and the other work on the host.

A plan run on CPU puts one process per plan device on the host, and they compute at the
same time, sharing cores, caches and memory bandwidth; a profile taken by one process
alone does not see that (docs/profile.md#co-location). Two methods, recorded in the
profile's ``meta.colocation`` (:class:`~planner.profile.settings.Colocation`, read as
``profile.settings.colocation``):

- ``alone`` (the default; also every profile written before this was recorded): one
  process timed the layers, on one thread's CPU time (``thread_time``) where it has one
  thread;
- ``companions`` (``pipeplan profile --colocate N``, N > 1): while the layers and the
  optimizer step were timed, N - 1 companion processes
  (:mod:`planner.profile.companions`) ran the model's training step on the same
  microbatch sizes beside the measuring process, and intervals were read from the clock
  the run's own timing uses (``perf_counter``, wall time).

``busy_cores`` (co-located profiles) is the other work on the host just before the
measurement: how many cores were busy, on average over a short sample of ``/proc/stat``,
while the profiler itself slept. A run compares it with the same sample taken before it
starts its processes.

Example::

    colocation = profile_colocation(profile)
    colocation.processes, colocation.method        # (2, 'companions')
    colocation_note(colocation, processes=4)        # 'the profile was measured with ...'
"""

from __future__ import annotations

import time
from typing import Any

from planner.errors import InputError
from planner.profile.schema import Profile
from planner.profile.settings import COLOCATION_METHODS, MAX_COLOCATE, Colocation

__all__ = [
    "BUSY_CORES_NOTE",
    "COLOCATION_METHODS",
    "MAX_COLOCATE",
    "Colocation",
    "busy_cores",
    "check_colocate",
    "colocation_note",
    "load_note",
    "profile_colocation",
]

# Other work on the host that differs by this many busy cores between the profile and the
# run gets a note in the run's report.
BUSY_CORES_NOTE = 0.5


def profile_colocation(profile: Profile) -> Colocation:
    """The profile's record (``alone``, one process, where it has none).

    Example::

        profile_colocation(load_profile("profiles/gpt.json")).method   # 'alone'
    """
    return profile.settings.colocation or Colocation()


def check_colocate(value: Any, device_type: str, *, field: str = "--colocate") -> int:
    """A ``--colocate`` value: an integer from 1 to :data:`MAX_COLOCATE`; above 1 only on
    CPU (on CUDA each plan device has a GPU of its own).

    Example::

        check_colocate(2, "cpu")   # 2
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COLOCATE:
        raise InputError(
            f"expected a whole number of processes from 1 to {MAX_COLOCATE}, got {value!r}",
            field=field,
        )
    if value > 1 and device_type != "cpu":
        raise InputError(
            "co-located profiling is for CPU processes (a CUDA run gives each plan device a "
            f"GPU of its own); got {value} on {device_type}",
            field=field,
        )
    return value


def busy_cores(seconds: float = 0.3) -> float | None:
    """Cores busy with other work, on average over ``seconds`` while this process sleeps
    (``/proc/stat``; None where there is none).

    Example::

        busy_cores()   # e.g. 0.04 on a quiet machine, 1.9 with two busy processes
    """
    first = _cpu_jiffies()
    if first is None:
        return None
    time.sleep(seconds)
    second = _cpu_jiffies()
    if second is None:
        return None
    busy = second[0] - first[0]
    total = second[1] - first[1]
    cores = second[2]
    if total <= 0:
        return None
    return max(0.0, busy / total * cores)


def _cpu_jiffies() -> tuple[int, int, int] | None:
    """(busy, total) jiffies over all cores since boot, and the number of cores."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    if not lines or not lines[0].startswith("cpu "):
        return None
    values = [int(x) for x in lines[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # user .. steal (guest time is counted in user already)
    cores = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return total - idle, total, max(1, cores)


def colocation_note(profiled: Colocation, processes: int) -> str | None:
    """A note where a run (or a plan) puts ``processes`` processes on the host and the
    profile saw another number; None where they agree.

    Example::

        colocation_note(Colocation(), 2)
        # 'the profile was measured by one process alone; this plan runs 2 processes on ...'
    """
    if processes == profiled.processes:
        return None
    return (
        f"the profile was measured {profiled.describe()}; this plan runs {processes} "
        "processes on the host, so its compute may run at another speed than profiled "
        f"(profile with --colocate {processes} to measure what the run will see)"
    )


def load_note(profiled: Colocation, busy_now: float | None) -> str | None:
    """A note where the other work on the host differs by :data:`BUSY_CORES_NOTE` cores
    or more between the profile and now; None where either is unknown or they agree.

    Example::

        load_note(Colocation(2, "companions", 0.1), 1.4)
        # 'other work on the host: 0.1 busy cores when profiled, 1.4 now; ...'
    """
    if profiled.busy_cores is None or busy_now is None:
        return None
    if abs(busy_now - profiled.busy_cores) < BUSY_CORES_NOTE:
        return None
    how = "slower" if busy_now > profiled.busy_cores else "faster"
    return (
        f"other work on the host: {profiled.busy_cores:.1f} busy cores when profiled, "
        f"{busy_now:.1f} now; expect the run {how} than predicted"
    )
