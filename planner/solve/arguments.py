"""``solve``'s arguments: checked (one line naming the flag), and the batch settings to search.

:func:`batch_settings` turns ``--global-batch`` / ``--microbatches`` into the
(microbatch size, number of microbatches) pairs the search tries, from the profiled sizes.

Example::

    check_args(topology, 32, None, "auto", 10.0)
    batch_settings(profile, 32, None, 4)  # [(1, 32), (2, 16), (4, 8)] for sizes 1, 2, 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.errors import InputError
from planner.limits import (
    MAX_GLOBAL_BATCH,
    MAX_MICROBATCHES,
    MAX_SCHEDULE_OPS,
    MAX_TIME_LIMIT_S,
    check_int,
    check_number,
    check_schedule_size,
)
from planner.profile.schema import Profile
from planner.solve.options import SCHEDULE_CHOICES

if TYPE_CHECKING:
    from planner.topology import Topology

__all__ = ["batch_settings", "check_args", "check_batch_settings"]


def batch_settings(
    profile: Profile,
    global_batch: int | None,
    num_microbatches: int | None,
    num_devices: int,
) -> list[tuple[int, int]]:
    """(microbatch size, number of microbatches) pairs to search.

    Example::

        batch_settings(profile, None, 8, 4)  # [(mb, 8) for every profiled size mb]
    """
    sizes = profile.microbatch_sizes
    if global_batch is not None and num_microbatches is not None:
        if global_batch % num_microbatches:
            raise InputError(
                f"global batch {global_batch} is not divisible by {num_microbatches} microbatches",
                field="--global-batch",
            )
        mb = global_batch // num_microbatches
        if mb not in sizes:
            raise InputError(
                f"global batch {global_batch} / {num_microbatches} microbatches = microbatch size "
                f"{mb}, which was not profiled; profiled sizes are {sizes}",
                field="--microbatches",
            )
        return [(mb, num_microbatches)]
    if global_batch is not None:
        pairs = [(mb, global_batch // mb) for mb in sizes if global_batch % mb == 0]
        if not pairs:
            raise InputError(
                f"global batch {global_batch} is not divisible by any profiled microbatch "
                f"size {sizes}; choose a multiple of one of them",
                field="--global-batch",
            )
        return pairs
    m = num_microbatches if num_microbatches is not None else max(4, 2 * num_devices)
    return [(mb, m) for mb in sizes]


def check_batch_settings(
    pairs: list[tuple[int, int]], profile: Profile, num_devices: int, flag: str
) -> list[tuple[int, int]]:
    """The pairs whose microbatch count is within :data:`MAX_MICROBATCHES` and whose
    deepest pipeline (one stage per device or layer) stays within
    :data:`MAX_SCHEDULE_OPS`; an InputError naming ``flag`` when none is.

    Example::

        check_batch_settings([(1, 64), (2, 32)], profile, 8, "--global-batch")
    """
    depth = max(1, min(num_devices, profile.num_layers))
    kept = [(mb, m) for mb, m in pairs if m <= MAX_MICROBATCHES and depth * m <= MAX_SCHEDULE_OPS]
    if not kept:
        fewest = min(m for _, m in pairs)
        check_schedule_size(depth, fewest, field=flag)
    return kept


def check_args(
    topology: Topology,
    global_batch: int | None,
    num_microbatches: int | None,
    schedule: str,
    time_limit: float,
) -> None:
    """Raise :class:`InputError` naming the flag for the first argument out of range.

    Example::

        check_args(topology, None, 0, "auto", 10.0)  # InputError: --microbatches: ...
    """
    if not topology.devices:
        raise InputError("the topology has no devices", field="devices")
    if not time_limit > 0:
        raise InputError(
            f"expected a positive number of seconds, got {time_limit}", field="--time-limit"
        )
    check_number(time_limit, field="--time-limit", high=MAX_TIME_LIMIT_S, unit=" s")
    for name, value in (("--global-batch", global_batch), ("--microbatches", num_microbatches)):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise InputError(f"expected a positive integer, got {value}", field=name)
    if global_batch is not None:
        check_int(global_batch, field="--global-batch", high=MAX_GLOBAL_BATCH)
    if num_microbatches is not None:
        check_int(num_microbatches, field="--microbatches", high=MAX_MICROBATCHES)
    if schedule not in SCHEDULE_CHOICES:
        raise InputError(
            f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULE_CHOICES)}",
            field="--schedule",
        )
