"""A user's exits while ``model.py``'s code runs: ``sys.exit``, ``os._exit``, KeyboardInterrupt.

A ``model.py`` that ends the process must never decide pipeplan's exit code or stop a run
half-way without a word. While :func:`user_code` is active (around the import of
``model.py`` and every call of its functions, :mod:`planner.profile.loader`):

* ``sys.exit(n)`` / ``raise SystemExit`` becomes an :class:`~planner.errors.InputError`
  naming the file, the function and the code;
* ``os._exit(n)`` cannot be caught where it happens, so it is replaced while user code runs
  by a function that raises instead (a process forked by user code, e.g. a DataLoader
  worker, still exits for real: the replacement checks the process id);
* a ``KeyboardInterrupt`` while pipeplan handles the signals itself
  (:func:`planner.interrupts.handling`: the command line, the ``run`` workers) was raised by
  user code, not by Ctrl-C, and is reported the same way. Without pipeplan's handlers (the
  Python API in a notebook) it passes through as the Ctrl-C it may be.

A segfault or a hang cannot be turned into an exception in the process it happens in: the
command line runs user code in child processes (:mod:`planner.profile.isolated`, the ``run``
workers) and reports those from outside, with :mod:`planner.profile.stack_dump`.

Example::

    with user_code(Path("model.py"), "build_model", "build_model()"):
        model = module.build_model()
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import NoReturn

from planner.errors import InputError
from planner.interrupts import handling

__all__ = ["UserExit", "user_code", "user_line"]

_real_exit = os._exit


class UserExit(BaseException):
    """Raised by ``os._exit(code)`` while user code runs (see :func:`user_code`).

    Example::

        UserExit(3).code   # 3
    """

    def __init__(self, code: int):
        self.code = code
        super().__init__(f"os._exit({code})")


class _Guard:
    """How many threads are inside user code, and the process that replaced ``os._exit``."""

    lock = threading.Lock()
    depth = 0
    pid = 0


def _exit_instead(status: int) -> NoReturn:
    if os.getpid() != _Guard.pid:  # a process forked by user code: its exit is real
        _real_exit(status)
    raise UserExit(status)


def _enter() -> None:
    with _Guard.lock:
        if _Guard.depth == 0:
            _Guard.pid = os.getpid()
            os._exit = _exit_instead
        _Guard.depth += 1


def _leave() -> None:
    with _Guard.lock:
        _Guard.depth -= 1
        if _Guard.depth == 0:
            os._exit = _real_exit


def user_line(tb: TracebackType | None, source: Path) -> int | None:
    """The line of ``source`` deepest in traceback ``tb`` (None when it is not in it).

    Example::

        user_line(exc.__traceback__, Path("model.py"))   # 12
    """
    line = None
    resolved = os.path.realpath(source)
    for frame in traceback.extract_tb(tb):
        if os.path.realpath(frame.filename) == resolved:
            line = frame.lineno
    return line


@contextlib.contextmanager
def user_code(source: Path, what: str | None, call: str) -> Iterator[None]:
    """Run the block as ``model.py``'s code: its exits become an InputError.

    ``what`` is the function (the error's field; None for the import), ``call`` how the
    message shows the call, e.g. ``sample_batch(8)``.

    Example::

        with user_code(Path("model.py"), "sample_batch", "sample_batch(8)"):
            batch = module.sample_batch(8)
    """
    _enter()
    try:
        yield
    except SystemExit as exc:
        how = f"called sys.exit({_code(exc.code)})"
        raise _exited(source, what, call, how, exc.__traceback__) from None
    except UserExit as exc:
        how = f"called os._exit({exc.code})"
        raise _exited(source, what, call, how, exc.__traceback__) from None
    except KeyboardInterrupt as exc:
        if not handling():
            raise  # may be a real Ctrl-C: pipeplan does not handle the signals here
        how = "raised KeyboardInterrupt"
        raise _exited(source, what, call, how, exc.__traceback__) from None
    finally:
        _leave()


def _code(code: object) -> str:
    return "" if code is None else repr(code)


def _exited(
    source: Path, what: str | None, call: str, how: str, tb: TracebackType | None
) -> InputError:
    line = user_line(tb, source)
    where = f" (line {line})" if line is not None else ""
    if how.startswith("raised"):  # pipeplan handles Ctrl-C itself: this came from the code
        why = "no Ctrl-C: the code raised it itself"
    else:
        why = "model.py's code must return or raise an error, not end the process"
    return InputError(f"{call} {how}{where}; {why}", file=str(source), field=what)
