"""The exceptions the command line turns into one line: bad input, and a failed run.

The CLI turns an :class:`InputError` into a single line on stderr and exit code 2, a
:class:`RunFailed` into a single line and exit code 1; anything else is a bug and keeps
its traceback.

Example::

    raise InputError("expected a positive integer", file="plan.json", field="num_microbatches")
"""

from __future__ import annotations

from planner.terminal import printable

__all__ = ["InfeasibleError", "InputError", "RunFailed"]


class InputError(Exception):
    """Bad user input: names the file and field at fault and what was expected."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.message = message
        self.file = file
        self.field = field
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """``file: field: message`` with the missing parts left out, on one line, with any
        control character (a terminal escape in a name or path) shown escaped."""
        parts = [str(p) for p in (self.file, self.field) if p]
        text = ": ".join([*parts, self.message])
        return printable(" ".join(text.split()))


class InfeasibleError(InputError):
    """The inputs are well formed but admit no plan (e.g. nothing fits in memory)."""


class RunFailed(RuntimeError):
    """A training run failed: a rank raised, died or hung; the message names it (one line,
    control characters escaped)."""

    def __str__(self) -> str:
        return printable(" ".join(super().__str__().split()))
