"""Starting the ``run`` processes, watching them, and cleaning up.

Local launch (the default): one fresh Python process per rank
(``python -m planner.runtime.worker RANK CONFIG PARENT``, so nothing depends on the caller's
``__main__``), each in its own session, rendezvous over a free TCP port on 127.0.0.1;
torchrun's variables are not passed on (:data:`planner.runtime.environment.TORCHRUN_VARIABLES`).
The parent is a watchdog and never runs the user's code: when a rank exits non-zero, is
killed, or exits 0 without finishing (``os._exit`` in the user's code), or makes no progress
for the timeout (every rank rewrites its heartbeat file each step; a hung rank is asked for
its Python stack first, so the line says where in ``model.py`` it stood), it kills every
rank's process group and raises one line naming the rank and its error: InputError (exit 2)
when the rank failed on bad input while loading the model, RunFailed (exit 1) otherwise.
A signal (Ctrl-C, SIGTERM, SIGHUP: :mod:`planner.interrupts`) does the same on its way out.
Workers also ask the kernel to kill them if the parent dies (``PR_SET_PDEATHSIG``, and exit
at once when it died before they asked), so no process outlives a run.

Under ``torchrun`` (:func:`in_torchrun`) each process is already started; the command runs
:func:`planner.runtime.worker.worker_main` directly with ``RANK``/``WORLD_SIZE`` from the
environment, and torchrun does the watching.

Example::

    result = launch_local(config, world_size=2, timeout_s=60)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import InputError, RunFailed
from planner.profile.isolated import child_env, stop_process_group
from planner.profile.stack_dump import ask_for_stack, read_dump, where_in
from planner.records import read_record, record_dict
from planner.runtime.environment import TORCHRUN_VARIABLES, torchrun_env
from planner.runtime.measured import RunResult

if TYPE_CHECKING:
    from planner.runtime.settings import WorkerConfig

__all__ = ["RunFailed", "free_port", "in_torchrun", "launch_local", "worker_env"]

# Seconds a rank may spend starting up (importing torch, the rendezvous) before the
# watchdog also counts it as hung; added to the timeout.
_GRACE_S = 60.0


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a local worker: ``base`` (default: this process's) with this
    planner first on ``PYTHONPATH``, so the workers import the same code, without torchrun's
    variables (the workers rendezvous on their own port), and with torch's C++ log at
    ``ERROR`` unless ``TORCH_CPP_LOG_LEVEL`` says otherwise.

    Example::

        worker_env({"PYTHONPATH": "/elsewhere"})["PYTHONPATH"]   # '/path/to/pipeplan:/elsewhere'
    """
    env = child_env(base)
    for name in TORCHRUN_VARIABLES:
        env.pop(name, None)
    # torch's C++ warnings when a peer goes away (a rank that failed, stopped by the
    # watchdog) would bury the one line that says why; errors still show.
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now.

    Example::

        init = f"tcp://127.0.0.1:{free_port()}"
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def in_torchrun() -> bool:
    """True inside a process started by ``torchrun`` (``TORCHELASTIC_RUN_ID``, ``RANK`` or
    ``WORLD_SIZE`` set); InputError when its variables are malformed or incomplete.

    Example::

        if in_torchrun(): rank = int(os.environ["RANK"])
    """
    return torchrun_env() is not None


def launch_local(
    config: WorkerConfig, world_size: int, *, timeout_s: float, model_shown: str | None = None
) -> RunResult:
    """Spawn ``world_size`` workers on ``config`` and wait; rank 0's gathered result.
    ``model_shown``: the model file as the user named it, for the error lines.

    Example::

        result = launch_local(config, 2, timeout_s=60)
        result.ranks[0].step_seconds
    """
    run_dir = Path(config.run_dir)
    config = dataclasses.replace(config, init_method=f"tcp://127.0.0.1:{free_port()}")
    path = run_dir / "config.json"
    path.write_text(json.dumps(record_dict(config)))
    env = worker_env()
    procs: list[subprocess.Popen[Any]] = []
    try:
        for rank in range(world_size):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "planner.runtime.worker",
                        str(rank),
                        str(path),
                        str(os.getpid()),
                    ],
                    env=env,
                    # Own session: Ctrl-C reaches the launcher, which stops the ranks itself.
                    start_new_session=True,
                )
            )
        _watch(procs, run_dir, config, timeout_s)
    except (InputError, RunFailed) as exc:
        _kill_all(procs)
        if model_shown is None:
            raise
        raise _as_shown(exc, config.model, model_shown) from None
    except BaseException:
        _kill_all(procs)
        raise
    result_path = run_dir / "result.json"
    if not result_path.exists():  # pragma: no cover - rank 0 finished without a result
        raise RunFailed("rank 0 finished without writing its result")
    return read_record(RunResult, json.loads(result_path.read_text()), file=str(result_path))


def _watch(
    procs: list[subprocess.Popen[Any]], run_dir: Path, config: WorkerConfig, timeout_s: float
) -> None:
    started = time.monotonic()
    while True:
        codes = [p.poll() for p in procs]
        done = [c == 0 and (run_dir / f"done-{r}").exists() for r, c in enumerate(codes)]
        if all(done):
            return
        failed = [r for r, c in enumerate(codes) if c is not None and not done[r]]
        if failed:
            time.sleep(0.2)  # let a failing rank finish writing its error line
            failure = _failure(procs, failed, run_dir, config)  # may ask the others where
            _kill_all(procs)
            raise failure
        hung = _hung_rank(procs, run_dir, timeout_s, started)
        if hung is not None:
            dump = ask_for_stack(procs[hung].pid, run_dir / f"stack-{hung}.txt")
            where = where_in(dump, Path(config.model))
            _kill_all(procs)
            raise RunFailed(
                f"rank {hung} ({_devices(config, hung)}) made no progress for "
                f"{timeout_s:g} s{' ' + where if where else ''}; stopped every rank (raise "
                "--timeout if steps are slow)"
            )
        time.sleep(0.05)


def _as_shown(exc: InputError | RunFailed, model: str, shown: str) -> Exception:
    """The error with the model file named as the user named it (the ranks got its
    absolute path)."""
    if isinstance(exc, InputError):
        file = shown if exc.file == model else exc.file
        return InputError(exc.message.replace(model, shown), file=file, field=exc.field)
    return RunFailed(str(exc).replace(model, shown))


def _hung_rank(
    procs: list[subprocess.Popen[Any]], run_dir: Path, timeout_s: float, started: float
) -> int | None:
    now = time.time()
    for rank, p in enumerate(procs):
        if p.poll() is not None:
            continue
        beat = run_dir / f"alive-{rank}"
        try:
            last = beat.stat().st_mtime
            limit = timeout_s + 5.0
        except FileNotFoundError:
            last = now - (time.monotonic() - started)
            limit = timeout_s + _GRACE_S
        if now - last > limit:
            return rank
    return None


# Signals a process's own code dies of (a kill from outside, SIGKILL or SIGTERM, is not).
_CRASHES = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})

_SECONDARY = ("Timed out", "timed out", "Connection reset", "Connection closed", "Broken pipe")


@dataclasses.dataclass(frozen=True)
class _RankError:
    """What a failed rank wrote (``error-RANK.json``, :mod:`planner.runtime.worker`)."""

    line: str
    bad_input: list[str | None] | None  # InputError's message, file, field: exit 2
    written: float  # when

    @classmethod
    def read(cls, run_dir: Path, rank: int) -> _RankError | None:
        path = run_dir / f"error-{rank}.json"
        try:
            data = json.loads(path.read_text())
            return cls(str(data["line"]), data.get("input"), path.stat().st_mtime)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def secondary(self) -> bool:
        """Only lost or waited for a peer (a communication timeout or reset)."""
        return any(word in self.line for word in _SECONDARY)


def _failure(
    procs: list[subprocess.Popen[Any]], failed: list[int], run_dir: Path, config: WorkerConfig
) -> Exception:
    # The rank that failed first: one that died without a word (killed, or exited 0 before
    # finishing), else one with a real error, else the earliest line; ranks that only lost
    # or waited for a peer come last.
    errors = {r: _RankError.read(run_dir, r) for r in failed}

    def order(rank: int) -> tuple[int, float]:
        error = errors[rank]
        if error is None:
            return (0, 0.0)
        return (2 if error.secondary else 1, error.written)

    rank = min(failed, key=order)
    error = errors[rank]
    if error is not None and error.bad_input is not None:
        message, file, field = error.bad_input
        return InputError(str(message), file=file, field=field)
    if error is not None:
        line = error.line
    else:
        line = _death(procs, rank, run_dir, config)
        code = procs[rank].poll()
        by_model = code is not None and (code >= 0 or -code in _CRASHES)  # not a kill
        if by_model and _phase(run_dir, rank) == "loading":  # the model's code ended it
            return InputError(f"{line} while loading the model", file=config.model)
    running = [r for r in range(len(procs)) if r not in failed and procs[r].poll() is None]
    if order(rank)[0] == 2 and running:
        for other in running:  # the one it waited for, if its stack shows the model's code
            dump = ask_for_stack(procs[other].pid, run_dir / f"stack-{other}.txt")
            where = where_in(dump, Path(config.model))
            if where is not None:
                return RunFailed(
                    f"rank {other} ({_devices(config, other)}) hung {where} (rank {rank} "
                    f"({_devices(config, rank)}) timed out waiting for it after "
                    f"{config.timeout_s:g} s); stopped every rank"
                )
        who = ", ".join(f"{r} ({_devices(config, r)})" for r in running)
        line += f"; still running then, probably hung: rank {who}"
    return RunFailed(f"{line}; stopped every rank")


def _death(
    procs: list[subprocess.Popen[Any]], rank: int, run_dir: Path, config: WorkerConfig
) -> str:
    """How a rank that wrote no error ended, and where in model.py when its stack shows it."""
    code = procs[rank].poll()
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    elif code == 0:
        how = "exited with code 0 before it finished (os._exit in the model's code?)"
    else:
        how = f"exited with code {code}"
    where = where_in(read_dump(run_dir / f"crash-{rank}.txt"), Path(config.model))
    return f"rank {rank} ({_devices(config, rank)}) {how}{' ' + where if where else ''}"


def _phase(run_dir: Path, rank: int) -> str:
    """A rank's phase, from its heartbeat file: "starting" before it wrote one."""
    try:
        return (run_dir / f"alive-{rank}").read_text().strip() or "starting"
    except OSError:
        return "starting"


def _devices(config: WorkerConfig, rank: int) -> str:
    return ", ".join(config.placement.devices_of(rank))


def _kill_all(procs: list[subprocess.Popen[Any]]) -> None:
    # Each rank leads its own process group: whatever the user's code started goes too,
    # also when the rank itself is already gone.
    for p in procs:
        with contextlib.suppress(OSError):  # the whole group is gone
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        stop_process_group(p)
