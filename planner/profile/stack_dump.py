"""Where a process that crashed or hung stood in ``model.py``: Python's own stack dumps.

A process that runs user code (a ``run`` worker, the child of ``profile`` or ``export``)
calls :func:`record_stacks`: :mod:`faulthandler` then writes the Python stack of every
thread to one file on a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL) and to
another when asked with SIGUSR1 (:func:`ask_for_stack`: a watchdog's "where are you?"
before it stops a rank that made no progress). The watching process reads a dump with
:func:`where_in`, which names the innermost frame in the user's file.

Example::

    record_stacks(Path(run_dir, "crash-1.txt"), Path(run_dir, "stack-1.txt"))   # in the rank
    where_in(Path(run_dir, "crash-1.txt").read_text(), Path("model.py"))
    # 'in sample_batch (model.py line 9)'
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import time
from pathlib import Path
from typing import IO

__all__ = ["ask_for_stack", "read_dump", "record_stacks", "where_in"]

_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)\s*$')
_open_files: list[IO[str]] = []  # faulthandler writes to these until the process ends


def record_stacks(crash: Path, asked: Path | None = None) -> None:
    """Dump every thread's Python stack to ``crash`` on a fatal signal and, when ``asked``
    is given, to ``asked`` on SIGUSR1.

    Example::

        record_stacks(Path("/tmp/run/crash-0.txt"), Path("/tmp/run/stack-0.txt"))
    """
    handle = open(crash, "w")  # noqa: SIM115 - open for the life of the process
    _open_files.append(handle)
    faulthandler.enable(file=handle, all_threads=True)
    if asked is not None and hasattr(signal, "SIGUSR1"):
        ask = open(asked, "w")  # noqa: SIM115 - open for the life of the process
        _open_files.append(ask)
        faulthandler.register(signal.SIGUSR1, file=ask, all_threads=True, chain=False)


def ask_for_stack(pid: int, asked: Path, wait_s: float = 1.0) -> str:
    """Ask process ``pid`` (which called :func:`record_stacks` with ``asked``) for its
    stacks; the dump, or "" when none came within ``wait_s``.

    Example::

        dump = ask_for_stack(proc.pid, Path(run_dir, "stack-1.txt"))
    """
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:  # already gone
        return ""
    deadline = time.monotonic() + wait_s
    last = ""
    while time.monotonic() < deadline:
        time.sleep(0.1)
        text = read_dump(asked)
        if text and text == last:  # written, and no longer growing
            return text
        last = text
    return last


def read_dump(path: Path) -> str:
    """The text of a dump file; "" when there is none.

    Example::

        read_dump(Path("/tmp/run/crash-0.txt"))
    """
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def where_in(dump: str, model: Path) -> str | None:
    """Where a dump shows ``model``'s code, from the first thread inside it: ``at import of
    NAME (line N)`` or ``in FUNC (NAME line N)``, with ``, called from OUTER`` (or ``called
    at import``) when the outermost frame in ``model`` is another; None when no thread was
    in it.

    Example::

        where_in('  File "/m/model.py", line 9 in sample_batch', Path("/m/model.py"))
        # 'in sample_batch (model.py line 9)'
    """
    wanted = os.path.realpath(model)
    for thread in re.split(r"^(?:Current thread|Thread) .*$", dump, flags=re.MULTILINE):
        frames = [  # innermost first
            (m["func"], m["line"])
            for m in map(_FRAME.match, thread.splitlines())
            if m is not None and os.path.realpath(m["file"]) == wanted
        ]
        if not frames:
            continue
        (func, number), outer = frames[0], frames[-1][0]
        if func == "<module>":
            return f"at import of {model.name} (line {number})"
        called = "" if outer == func else f", called from {outer}"
        called = called.replace("called from <module>", "called at import")
        return f"in {func} ({model.name} line {number}{called})"
    return None
