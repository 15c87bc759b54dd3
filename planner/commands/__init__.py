"""CLI verbs, one module each; every module exposes ``register(app)``.

Add a module to :data:`COMMAND_MODULES` to make its verb appear in ``pipeplan --help``.
"""

from __future__ import annotations

from types import ModuleType

from planner.commands import (
    demo,
    export,
    import_,
    profile,
    run,
    show,
    simulate,
    solve,
    topology,
)

__all__ = ["COMMAND_MODULES"]

COMMAND_MODULES: list[ModuleType] = [
    import_,
    profile,
    demo,
    solve,
    topology,
    simulate,
    show,
    run,
    export,
]
