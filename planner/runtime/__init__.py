"""``pipeplan run``: a thin torch.distributed runtime that executes a plan exactly.

Modules: :mod:`~planner.runtime.placement` (plan devices -> ranks and torch devices),
:mod:`~planner.runtime.comm` (shapes, canonical message order, p2p),
:mod:`~planner.runtime.stage` (one stage's forward/backward),
:mod:`~planner.runtime.optimizer` (the profile's optimizer; 2BW double buffering),
:mod:`~planner.runtime.executor` (one process's action lists),
:mod:`~planner.runtime.worker` (one process), :mod:`~planner.runtime.launch` (spawn,
watchdog, cleanup), :mod:`~planner.runtime.environment` (torchrun's variables,
``PIPEPLAN_FAULT``, the rendezvous), :mod:`~planner.runtime.report` and
:mod:`~planner.runtime.calibrate`.

Example::

    from planner.runtime import run_plan
    report = run_plan("plan.json", "examples/mlp.py", steps=5, device="cpu")
    print(report.iteration_ms, report.ratio)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.runtime.launch import RunFailed
    from planner.runtime.report import RunReport
    from planner.runtime.runner import run_plan

__all__ = ["RunFailed", "RunReport", "run_plan"]


def __getattr__(name: str) -> Any:
    # Lazy: importing planner.runtime must not import torch (keeps `pipeplan --help` fast).
    if name == "run_plan":
        from planner.runtime.runner import run_plan

        return run_plan
    if name == "RunReport":
        from planner.runtime.report import RunReport

        return RunReport
    if name == "RunFailed":
        from planner.runtime.launch import RunFailed

        return RunFailed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
