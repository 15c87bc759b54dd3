"""Signals that end a command: Ctrl-C (SIGINT), SIGTERM and SIGHUP become :class:`Interrupted`.

While :func:`handle_signals` is active (the command line, every ``run`` worker and every
child that runs a user's ``model.py``), each of these signals raises :class:`Interrupted`
in the main thread, wherever it is; ``try``/``finally`` blocks then stop the processes the
command started and remove its temporary files, and the command line exits with
:attr:`Interrupted.exit_code`, ``128 + signal number`` as a shell reports a command a signal
ended (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).

* ``Interrupted`` derives from ``BaseException``, so ``except Exception`` in pipeplan or in
  user code does not swallow it, and it is not ``KeyboardInterrupt``: while these handlers
  are installed a ``KeyboardInterrupt`` can only have been raised by user code
  (:func:`handling` tells), which :mod:`planner.profile.user_exits` reports as such.
* Only the first signal raises; one that arrives while the clean-up runs is counted but does
  not interrupt the clean-up (it takes a few seconds at most).
* SIGINT is handled even when the command was started with it ignored (a background job of a
  non-interactive shell ignores it), as torchrun does: whoever sends it to pipeplan means it.
  SIGHUP stays ignored when it was ignored on entry (``nohup``).

Example::

    with handle_signals():
        try:
            work()
        except Interrupted as exc:
            print(f"interrupted by {exc.name}"); raise SystemExit(exc.exit_code)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["HANDLED_SIGNALS", "Interrupted", "handle_signals", "handling"]

HANDLED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that end a command cleanly."""


class Interrupted(BaseException):
    """A handled signal arrived; ``exit_code`` is ``128 + signum``.

    Example::

        Interrupted(signal.SIGTERM).exit_code   # 143
    """

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"interrupted by {self.name}")

    @property
    def name(self) -> str:
        """The signal's name, e.g. ``SIGINT``."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:  # pragma: no cover - not one of the handled signals
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        """What a shell reports for a command this signal ended: 128 + its number."""
        return 128 + self.signum


class _State:
    """Whether the handlers are installed, and the signals received since."""

    depth = 0
    received: list[int] = []  # one record per process


def handling() -> bool:
    """True while :func:`handle_signals` is active in this process: a ``KeyboardInterrupt``
    then never comes from a signal.

    Example::

        with handle_signals():
            assert handling()
    """
    return _State.depth > 0


def _raise(signum: int, frame: FrameType | None) -> None:
    _State.received.append(signum)
    if len(_State.received) == 1:  # later ones must not interrupt the clean-up
        raise Interrupted(signum)


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Interrupted` while the block runs; the
    previous handlers come back afterwards. Outside the main thread (where Python cannot
    install handlers) it changes nothing.

    Example::

        with handle_signals():
            run_plan("plan.json", "model.py")
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}
    if _State.depth == 0:
        _State.received = []
        for sig in HANDLED_SIGNALS:
            if sig == signal.SIGHUP and previous[sig] == signal.SIG_IGN:
                continue  # nohup: keep running when the terminal goes
            signal.signal(sig, _raise)
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if _State.depth == 0:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
