"""Starting the ``run`` processes, watching them, and cleaning up.

Local launch (the default): one fresh Python process per rank
(``python -m planner.runtime.worker RANK CONFIG``, so nothing depends on the caller's
``__main__``), rendezvous over a free TCP port on 127.0.0.1. The parent is a
watchdog: when a rank exits non-zero or is killed, or makes no progress for the timeout
(every rank writes a heartbeat each step), it kills every other rank and raises
:class:`RunFailed` with one line naming the rank and its error. Ctrl-C does the same.
Workers also ask the kernel to kill them if the parent dies (``PR_SET_PDEATHSIG``), so no
process outlives a run.

Under ``torchrun`` (:func:`in_torchrun`) each process is already started; the command runs
:func:`planner.runtime.worker.worker_main` directly with ``RANK``/``WORLD_SIZE`` from the
environment, and torchrun does the watching.

Example::

    result = launch_local(config, world_size=2, timeout_s=60)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import RunFailed

if TYPE_CHECKING:
    from planner.runtime.settings import WorkerConfig

__all__ = ["RunFailed", "free_port", "in_torchrun", "launch_local", "worker_env"]

# Seconds a rank may spend starting up (importing torch, building the model) before the
# watchdog also counts it as hung; added to the timeout.
_GRACE_S = 60.0


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a local worker: ``base`` (default: this process's) with this
    planner first on ``PYTHONPATH``, so the workers import the same code.

    Example::

        worker_env({"PYTHONPATH": "/elsewhere"})["PYTHONPATH"]   # '/path/to/pipeplan:/elsewhere'
    """
    env = dict(os.environ if base is None else base)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
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
    """True inside a process started by ``torchrun`` (it sets TORCHELASTIC_RUN_ID).

    Example::

        if in_torchrun(): rank = int(os.environ["RANK"])
    """
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


def launch_local(config: WorkerConfig, world_size: int, *, timeout_s: float) -> dict[str, Any]:
    """Spawn ``world_size`` workers on ``config`` and wait; rank 0's gathered result.

    Example::

        result = launch_local(config, 2, timeout_s=60)
        result["ranks"][0]["step_seconds"]
    """
    import dataclasses
    import subprocess
    import sys

    run_dir = Path(config.run_dir)
    config = dataclasses.replace(config, init_method=f"tcp://127.0.0.1:{free_port()}")
    path = run_dir / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    env = worker_env()
    procs: list[Any] = []
    try:
        for rank in range(world_size):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "planner.runtime.worker", str(rank), str(path)],
                    env=env,
                    # Own session: Ctrl-C reaches the launcher, which stops the ranks itself.
                    start_new_session=True,
                )
            )
        _watch(procs, run_dir, config, timeout_s)
    except BaseException:
        _kill_all(procs)
        raise
    result_path = run_dir / "result.json"
    if not result_path.exists():  # pragma: no cover - rank 0 exited 0 without a result
        raise RunFailed("rank 0 finished without writing its result")
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result


def _watch(procs: list[Any], run_dir: Path, config: WorkerConfig, timeout_s: float) -> None:
    started = time.monotonic()
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            time.sleep(0.2)  # let a failing rank finish writing its error line
            _kill_all(procs)
            raise RunFailed(_failure_message(procs, failed, run_dir, config))
        hung = _hung_rank(procs, run_dir, timeout_s, started)
        if hung is not None:
            _kill_all(procs)
            raise RunFailed(
                f"rank {hung} ({_devices(config, hung)}) made no progress for "
                f"{timeout_s:.0f} s; stopped every rank (raise --timeout if steps are slow)"
            )
        time.sleep(0.05)


def _hung_rank(procs: list[Any], run_dir: Path, timeout_s: float, started: float) -> int | None:
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


_SECONDARY = ("Timed out", "timed out", "Connection reset", "Connection closed", "Broken pipe")


def _failure_message(
    procs: list[Any], failed: list[int], run_dir: Path, config: WorkerConfig
) -> str:
    # The rank that failed first: one that died without a word (killed), else one with a
    # real error, else the earliest line; ranks that only lost or waited for a peer (a
    # communication timeout or reset) come last.
    def order(rank: int) -> tuple[int, float]:
        path = run_dir / f"error-{rank}.txt"
        if not path.exists():
            return (0, 0.0)
        secondary = any(word in path.read_text() for word in _SECONDARY)
        return (2 if secondary else 1, path.stat().st_mtime)

    rank = min(failed, key=order)
    path = run_dir / f"error-{rank}.txt"
    if path.exists():
        line = path.read_text().strip().splitlines()[0]
    else:
        code = procs[rank].poll()
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        line = f"rank {rank} ({_devices(config, rank)}) {how}"
    if order(rank)[0] == 2:
        running = [r for r in range(len(procs)) if r not in failed]
        if running:
            who = ", ".join(f"{r} ({_devices(config, r)})" for r in running)
            line += f"; still running then, probably hung: rank {who}"
    return f"{line}; stopped every rank"


def _devices(config: WorkerConfig, rank: int) -> str:
    return ", ".join(config.placement.devices_of(rank))


def _kill_all(procs: list[Any]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(OSError):  # already gone
                p.kill()
    for p in procs:
        with contextlib.suppress(Exception):  # a process that cannot even be killed
            p.wait(timeout=10)
