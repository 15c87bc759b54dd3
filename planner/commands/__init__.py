"""CLI verbs, one module each; every module exposes ``register(app)``.

Add a module to :data:`COMMAND_MODULES` to make its verb appear in ``pipeplan --help``.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["COMMAND_MODULES"]

COMMAND_MODULES: list[ModuleType] = []
