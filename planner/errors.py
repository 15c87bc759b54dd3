"""The exceptions the command line turns into one line: bad input, and a failed run.

The CLI turns an :class:`InputError` into a single line on stderr and exit code 2, a
:class:`RunFailed` into a single line and exit code 1; anything else is a bug and keeps
its traceback.

Example::

    raise InputError("expected a positive integer", file="plan.json", field="num_microbatches")
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from planner.terminal import printable

__all__ = ["MAX_MESSAGE_CHARS", "InfeasibleError", "InputError", "RunFailed", "naming_file"]

MAX_MESSAGE_CHARS = 1000
"""Characters of one error line: every message of pipeplan's own is far shorter; a value
from a file quoted in one (a 5000-digit number, a long list) is cut to fit."""


class InputError(Exception):
    """Bad user input: names the file and field at fault and what was expected."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.message = message
        self.file = file
        self.field = field
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """``file: field: message`` with the missing parts left out, on one line, with any
        control character (a terminal escape in a name or path) shown escaped, and at most
        :data:`MAX_MESSAGE_CHARS` long (a hostile value quoted in it is cut short).

        Example::

            InputError("expected a name", file="t.yaml", field="name").one_line()
        """
        parts = [str(p) for p in (self.file, self.field) if p]
        text = printable(" ".join(": ".join([*parts, self.message]).split()))
        if len(text) > MAX_MESSAGE_CHARS:
            cut = len(text) - MAX_MESSAGE_CHARS + 40
            text = f"{text[: MAX_MESSAGE_CHARS - 40]}... ({cut:,} more characters)"
        return text


@contextlib.contextmanager
def naming_file(source: str | None, prefix: str = "stages") -> Iterator[None]:
    """An InputError about a field under ``prefix`` that names no file names ``source``
    (a check that runs where the file or flag is not known, e.g. a partition's).

    Example::

        with naming_file("--stages"):
            validate_stages(specs, profile.num_layers, topology)
    """
    try:
        yield
    except InputError as exc:
        if exc.file is None and source is not None and (exc.field or "").startswith(prefix):
            exc.file = source
        raise


class InfeasibleError(InputError):
    """The inputs are well formed but admit no plan (e.g. nothing fits in memory)."""


class RunFailed(RuntimeError):
    """A training run failed: a rank raised, died or hung; the message names it (one line,
    control characters escaped)."""

    def __str__(self) -> str:
        return printable(" ".join(super().__str__().split()))
