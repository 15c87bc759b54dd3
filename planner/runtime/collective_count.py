"""The collectives a run's forwards and backwards issue, counted as they are dispatched.

A tensor-parallel stage's collectives run inside its modules (torch's DTensor, behind
``parallelize_module``). With ``run_plan(..., count_collectives=True)`` each ``F``, ``B``,
``I`` and ``W`` action runs inside the profiler's own dispatch-mode recorder
(:class:`~planner.profile.collective_log.CollectiveLog`, whose counts equal torch's
``CommDebugMode``'s), so a run's collectives can be put beside what the plan's profile lists
per layer and the simulator times per microbatch: same operations, same sizes, same phase
(``forward``; ``backward`` for ``B`` and ``I``, whose input half is where tensor
parallelism communicates; ``W`` issues none); and with :meth:`CollectiveCounter.sent` the
messages each SEND hands to another stage's device (their bytes, to whom), which the
simulator's transfers carry. The recording slows a step down; it is for checking, not for
timing.

Example::

    counter = CollectiveCounter()
    with counter.action("gpu0", "F", 0, 3):
        runtime.forward(3, inputs)
    counter.take()   # [CountedCollective(device='gpu0', kind='F', stage=0, microbatch=3,
                     #   op='all_reduce', bytes=4096, phase='forward'), ...]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from planner.profile.collective_log import CollectiveLog
from planner.runtime.measured import CountedCollective

__all__ = ["CollectiveCounter"]


class CollectiveCounter:
    """Records each action's collectives; :meth:`take` hands over those of the step."""

    def __init__(self) -> None:
        self.entries: list[CountedCollective] = []

    @contextlib.contextmanager
    def action(self, device: str, kind: str, stage: int, microbatch: int) -> Iterator[None]:
        """Record the collectives dispatched while one action of ``device`` runs.

        Example::

            with counter.action("gpu1", "B", 1, 0):
                runtime.backward(0, grads)
        """
        log = CollectiveLog()
        log.phase = "forward" if kind == "F" else "backward"
        with log:
            yield
        for c in log.collectives:
            self.entries.append(
                CountedCollective(device, kind, stage, microbatch, c.op, c.bytes, c.phase)
            )

    def sent(
        self, device: str, kind: str, stage: int, microbatch: int, peer: str, nbytes: int
    ) -> None:
        """Record a message ``device`` sent to another stage's ``peer`` (a SEND action).

        Example::

            counter.sent("gpu0", "SEND_F", 0, 3, "gpu2", 4096)
        """
        phase = "forward" if kind == "SEND_F" else "backward"
        self.entries.append(
            CountedCollective(device, kind, stage, microbatch, "send", nbytes, phase, peer)
        )

    def take(self) -> list[CountedCollective]:
        """The entries recorded since the last call, in the order they ran.

        Example::

            counted = counter.take()
        """
        out, self.entries = self.entries, []
        return out
