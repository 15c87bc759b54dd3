"""The schedule families pipeplan generates, and what each implies, in one table.

Code that needs to know how a schedule behaves asks its family (or a
:class:`~planner.schedule.actions.Schedule`'s own ``flush`` / ``weight_versions``), never
compares names.

======== ===== ================ ========================================================
family   flush weight versions what else
======== ===== ================ ========================================================
gpipe    yes   1                all forwards, then all backwards
1f1b     yes   1                PipeDream-Flush: one forward, one backward
interleaved yes 1               several chunks (virtual stages) per device
zb       yes   1                backward split into input (I) and weight (W) halves
2bw      no    2                PipeDream-2BW: iterations overlap, gradients one step stale
optimized yes  1                1F1B or ZB-H1 with searched depths (needs a profile)
======== ===== ================ ========================================================

Example::

    family("2bw").weight_versions     # 2
    family("zb").split_backward       # True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from planner.errors import InputError

__all__ = ["FAMILIES", "Family", "family", "is_interleaved"]


@dataclass(frozen=True)
class Family:
    """What a named schedule implies for memory, bounds and execution."""

    name: str
    flush: bool = True  # False: consecutive iterations overlap (no flush between them)
    split_backward: bool = False  # I and W apart (a searched optimized order may be too)
    interleaved: bool = False  # several stages (chunks) per device
    searched: bool = False  # built by simulating candidates: needs a profile

    @property
    def weight_versions(self) -> int:
        """Weight versions a stage keeps: 2 without a flush, else 1."""
        return 1 if self.flush else 2


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        f.name: f
        for f in (
            Family("gpipe"),
            Family("1f1b"),
            Family("interleaved", interleaved=True),
            Family("zb", split_backward=True),
            Family("2bw", flush=False),
            Family("optimized", searched=True),
        )
    }
)


def family(name: str) -> Family:
    """The family called ``name``; one InputError naming the known ones otherwise.

    Example::

        family("1f1b").flush   # True
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise InputError(
            f"unknown schedule {name!r}; expected one of {', '.join(FAMILIES)}", field="schedule"
        ) from None


def is_interleaved(name: str) -> bool:
    """Whether ``name`` is a family that puts several stages on a device; False for a name
    outside the table (a hand-written schedule's).

    Example::

        is_interleaved("interleaved"), is_interleaved("1f1b"), is_interleaved("mine")
        # (True, False, False)
    """
    known = FAMILIES.get(name)
    return known is not None and known.interleaved
