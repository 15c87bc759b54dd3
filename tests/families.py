"""Schedule names for tests, read off the family table (``planner.schedule.FAMILIES``) by
what each family does: tests loop over these instead of listing names, so a new schedule
gets their coverage by itself."""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedule import FAMILIES, family


def schedules(
    *, flush: bool | None = None, interleaved: bool | None = None, searched: bool | None = False
) -> list[str]:
    """The families with these properties (None: either), in table order."""
    return [
        name
        for name, f in FAMILIES.items()
        if (flush is None or f.flush == flush)
        and (interleaved is None or f.interleaved == interleaved)
        and (searched is None or f.searched == searched)
    ]


# Made by a generator, one stage per device: gpipe, 1f1b, zb, 2bw today.
GENERATED = schedules(interleaved=False)
# Of those, the ones with a flush (one iteration at a time): gpipe, 1f1b, zb.
FLUSHED = schedules(flush=True, interleaved=False)
# Every generated family (what `solve --schedule` and `build_schedule` take).
BUILT = schedules()
# Generated and synchronous (a run equals one process): gpipe, 1f1b, interleaved, zb.
SYNCHRONOUS = schedules(flush=True)


def partition(name: str, ranges: Sequence[str], devices: Sequence[str]) -> str:
    """A ``--stages`` text the family can run: the layer ranges one per device, or, for a
    family with several chunks per device, spread over the devices as it places them
    (``len(ranges)`` a multiple of the devices).

    Example::

        partition("interleaved", ["0", "1-2", "3", "4"], ["cpu0", "cpu1"])
        # '0:cpu0;1-2:cpu1;3:cpu0;4:cpu1'
    """
    fam = family(name)
    if fam.interleaved:
        where = fam.place(list(devices), len(ranges) // len(devices))
    else:
        where = list(devices)
    return ";".join(f"{r}:{d}" for r, d in zip(ranges, where, strict=True))
