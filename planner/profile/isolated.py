"""User code in a child process: how the command line runs a user's ``model.py``.

``os._exit`` in unguarded code, a segfault or a hang cannot be caught in the process they
happen in, so ``pipeplan profile`` and ``pipeplan export --model`` run the user's code in a
child (``python -m planner.profile.isolated``) and only wait for it; ``pipeplan run`` runs it
only in its worker ranks. :func:`call_isolated` sends the child a function and its
arguments (pickled, over a pipe) and returns what the function returned; the child sends
progress on the way. What the function raises comes back as it was (InputError with its
file and field, RunFailed); a child that dies instead becomes one line naming the model file,
how it ended (signal or exit code) and, from its stack dump
(:mod:`planner.profile.stack_dump`), where in ``model.py`` it was. That is an InputError
(exit 2) while the model is being loaded and checked (before the first progress report) and
RunFailed (exit 1) once the work is under way.

The child runs in its own session (a terminal's Ctrl-C reaches only pipeplan, which stops
it), dies with its parent (``PR_SET_PDEATHSIG``), and its folder (the stack dump) is
removed when the call returns, fails or is interrupted.

Example::

    profile = call_isolated(profile_model, "model.py", [1, 2], model=Path("model.py"),
                            doing="profiling", progress=print)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from planner.errors import InputError, RunFailed
from planner.interrupts import Interrupted, handle_signals
from planner.profile.stack_dump import read_dump, record_stacks, where_in

__all__ = ["ChildError", "call_isolated", "child_env", "die_with_parent", "stop_process_group"]

T = TypeVar("T")
ProgressFn = Callable[[int, int, str], None]


class ChildError(RuntimeError):
    """pipeplan's own code failed in the child (a bug): its type, message and traceback.

    Example::

        raise ChildError("KeyError: 'x' in the child process; its traceback: ...")
    """


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: ``base`` (default: this process's) with this
    planner first on ``PYTHONPATH``, so the child imports the same code.

    Example::

        child_env({"PYTHONPATH": "/elsewhere"})["PYTHONPATH"]   # '/path/to/pipeplan:/elsewhere'
    """
    env = dict(os.environ if base is None else base)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux); exit at once when
    the parent (``parent_pid``) is already gone, which closes the window before the request.

    Example::

        die_with_parent(int(sys.argv[3]))   # first thing in a child
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request: nobody waits for this process


def stop_process_group(proc: subprocess.Popen[Any], wait_s: float = 10.0) -> None:
    """Kill a child started with ``start_new_session=True`` and every process it started
    (its process group), then reap it.

    Example::

        stop_process_group(proc)
    """
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            with contextlib.suppress(OSError):
                proc.kill()
    with contextlib.suppress(Exception):  # a process that cannot even be killed
        proc.wait(timeout=wait_s)


def call_isolated(
    fn: Callable[..., T],
    *args: Any,
    model: Path,
    doing: str,
    progress: ProgressFn | None = None,
    **kwargs: Any,
) -> T:
    """``fn(*args, **kwargs)`` in a child process (``fn`` and its arguments picklable);
    ``progress`` receives what ``fn``'s ``progress=`` callback is called with.

    ``model`` and ``doing`` (e.g. ``"profiling"``) name the work in the line of a child that
    dies.

    Example::

        path = call_isolated(check_model_file, "plan.json", "model.py",
                             model=Path("model.py"), doing="checking it")
    """
    proc = None
    folder = Path(tempfile.mkdtemp(prefix="pipeplan-child-"))
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    with Connection(resp_r) as answers, Connection(req_w) as request:
        try:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "planner.profile.isolated",
                     str(req_r), str(resp_w), str(os.getpid()), str(folder)],
                    pass_fds=(req_r, resp_w), env=child_env(), start_new_session=True,
                )  # fmt: skip
            finally:  # the child's ends
                os.close(req_r)
                os.close(resp_w)
            with contextlib.suppress(OSError):  # a child that died at once: _wait tells
                request.send((fn, args, kwargs, progress is not None))
            request.close()
            return _wait(proc, answers, progress, model, doing, folder)
        finally:
            if proc is not None:
                stop_process_group(proc)
            shutil.rmtree(folder, ignore_errors=True)


def _wait(
    proc: subprocess.Popen[Any],
    answers: Connection,
    progress: ProgressFn | None,
    model: Path,
    doing: str,
    folder: Path,
) -> Any:
    """The child's answer; raises what it raised, or a line for a child that died."""
    started = False
    while True:
        try:
            if not answers.poll(0.2):
                if proc.poll() is not None and not answers.poll(0.2):
                    break  # gone without a word
                continue
            message = answers.recv()
        except (EOFError, OSError):
            break
        kind = message[0]
        if kind == "progress":
            started = True
            if progress is not None:
                progress(*message[1:])
        elif kind == "result":
            return message[1]
        elif kind == "input":
            raise InputError(message[1], file=message[2], field=message[3])
        elif kind == "failed":
            raise RunFailed(message[1])
        elif kind == "exit":  # SystemExit or KeyboardInterrupt from user code not guarded
            raise _ended(model, f"its code {message[1]} while {doing}", started)
        else:
            raise ChildError(f"{message[1]} in the child process; its traceback:\n{message[2]}")
    raise _died(proc, model, doing, folder, started)


def _died(
    proc: subprocess.Popen[Any], model: Path, doing: str, folder: Path, started: bool
) -> Exception:
    code = proc.wait()
    where = where_in(read_dump(folder / "crash.txt"), model)
    if code < 0:
        how = f"crashed with {_signal_name(-code)}"
    else:
        how = f"ended the process with exit code {code} (os._exit, or native code)"
    return _ended(model, f"its code {how}{' ' + where if where else ''} while {doing}", started)


def _ended(model: Path, text: str, started: bool) -> Exception:
    # Exit 2 while the model is loaded and checked; 1 once the work is under way.
    if started:
        return RunFailed(f"{model}: {text}")
    return InputError(text, file=str(model))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child_main(req_fd: int, resp_fd: int, parent_pid: int, folder: Path) -> None:
    """The child: read the call, run it under pipeplan's signal handling, send the answer."""
    die_with_parent(parent_pid)
    record_stacks(folder / "crash.txt")
    answers = Connection(resp_fd)
    with handle_signals():
        try:
            with Connection(req_fd) as request:
                fn, args, kwargs, wants_progress = request.recv()
            if wants_progress:
                kwargs["progress"] = lambda *p: answers.send(("progress", *p))
            answers.send(("result", fn(*args, **kwargs)))
        except InputError as exc:
            answers.send(("input", exc.message, exc.file, exc.field))
        except RunFailed as exc:
            answers.send(("failed", str(exc)))
        except Interrupted as exc:  # stopped by someone other than pipeplan
            _flush()
            os._exit(exc.exit_code)
        except KeyboardInterrupt:  # user code outside its guarded calls (no Ctrl-C here)
            answers.send(("exit", "raised KeyboardInterrupt (not a Ctrl-C)"))
        except SystemExit as exc:
            answers.send(("exit", f"called sys.exit({'' if exc.code is None else exc.code!r})"))
        except BaseException as exc:
            answers.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    _flush()
    os._exit(0)


def _flush() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":  # python -m planner.profile.isolated REQ RESP PARENT FOLDER
    _child_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
