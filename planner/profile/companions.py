"""Companion processes: the model's training step, run beside a co-located profile.

``pipeplan profile --colocate N`` times the layers while N - 1 companions compute next to
the measuring process, as the other N - 1 processes of a plan's run would
(:mod:`planner.profile.colocation`). Each companion is ``python -m
planner.profile.companions CONFIG`` (the JSON config on the command line, no files): it
loads ``model.py``, builds the model under the profiler's seed and, with the profile's
threads, precision and optimizer, runs forward, loss and backward on each profiled
microbatch size in turn and one optimizer step after each round, until it is stopped. It
says ``ready`` once it has warmed up. :class:`Companions` starts them all when its
``with`` begins (they warm up while the profiler prepares its own work),
:meth:`Companions.wait_ready` waits for every ``ready``, and the end of the ``with`` stops
them (SIGTERM, SIGKILL after a grace period), also on an error or Ctrl-C. Companions run
in their own session (Ctrl-C reaches only the profiler, which stops them) and ask the
kernel to kill them if the profiler dies
(``PR_SET_PDEATHSIG``), so none outlives a profile. A companion's output goes to an
unnamed temporary file (unlinked at once), read only to name its error if it fails.

Example::

    with Companions(CompanionConfig("examples/gpt.py", [1, 2]), count=1) as companions:
        ...   # prepare
        companions.wait_ready()
        ...   # time the layers here
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from planner.errors import InputError, RunFailed

__all__ = ["READY", "CompanionConfig", "Companions", "check_companion_memory", "main"]

READY = "ready"
# Seconds a companion may take to import torch, build the model and warm up.
_START_S = 180.0
# Seconds a stopped companion gets before it is killed.
_STOP_S = 5.0


@dataclass(frozen=True)
class CompanionConfig:
    """What a companion runs: the model file, the microbatch sizes, and the profile's
    threads, precision and optimizer; ``warmup`` rounds before it says it is ready."""

    model: str
    sizes: list[int]
    threads: int = 1
    precision: str = "fp32"
    optimizer: str = "adam"
    warmup: int = 2

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CompanionConfig:
        return cls(**json.loads(text))


def check_companion_memory(count: int, *, field: str = "--colocate") -> None:
    """InputError when ``count`` companions cannot fit in the host's available memory: each
    needs at least what this process holds now (torch imported, the model file loaded; it
    then builds the model and trains it too), so the check refuses only what must fail.
    Nothing is checked where ``/proc`` cannot tell.

    Example::

        check_companion_memory(1)   # passes on any machine that runs pipeplan
    """
    each, available = _rss_bytes(), _available_bytes()
    if each is None or available is None or count * each <= available:
        return
    gib = 1024**3
    raise InputError(
        f"{count} companion processes need at least {count * each / gib:.1f} GiB (each at "
        f"least this process's {each / gib:.2f} GiB) and {available / gib:.1f} GiB is "
        "available; give fewer processes",
        field=field,
    )


def _rss_bytes() -> int | None:
    """This process's resident memory now (``/proc/self/statm``)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _available_bytes() -> int | None:
    """The host's available memory (``MemAvailable`` in ``/proc/meminfo``)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class Companions:
    """``count`` companion processes running ``config``'s training step, from the start of
    the ``with`` to its end (warm once :meth:`wait_ready` returns)."""

    def __init__(self, config: CompanionConfig, count: int):
        self.config = config
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.ready: set[int] = set()

    def __enter__(self) -> Companions:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if kind is None:
                self.check()
        finally:
            self.stop()

    def start(self) -> Companions:
        """Start every companion (all stopped again if one cannot start).

        Example::

            companions = Companions(config, 1).start()
        """
        try:
            for _ in range(self.count):
                self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def check(self) -> None:
        """RunFailed naming the first companion that has died (it stopped computing
        beside the measurement), if any."""
        failed = self._failed()
        if failed is not None:
            raise RunFailed(failed)

    def _start(self) -> None:
        # Unlinked at once, so nothing is left behind; closed by stop().
        log = tempfile.TemporaryFile()  # noqa: SIM115
        self.logs.append(log)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # this planner, first on the path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "planner.profile.companions",
                    self.config.to_json(),
                    str(os.getpid()),  # the companion ends at once if this one is gone
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        )

    def wait_ready(self) -> None:
        """Wait until every companion has warmed up; RunFailed names one that exits first
        (the ``with`` then stops the others)."""
        deadline = time.monotonic() + _START_S
        waiting = {
            p.stdout.fileno(): k
            for k, p in enumerate(self.procs)
            if p.stdout and k not in self.ready
        }
        said = dict.fromkeys(waiting, "")
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunFailed(
                    f"co-located profiling: {len(waiting)} companion process(es) did not start "
                    f"within {_START_S:.0f} s"
                )
            readable, _, _ = select.select(list(waiting), [], [], min(left, 1.0))
            for fd in readable:
                k = waiting[fd]
                chunk = os.read(fd, 64).decode("utf-8", "replace")
                said[fd] += chunk
                if READY in said[fd]:
                    del waiting[fd]
                    self.ready.add(k)
                elif not chunk:  # the companion closed its end: it exited
                    self.procs[k].wait()
                    raise RunFailed(self._message(k))

    def _failed(self) -> str | None:
        """The first companion that died while the layers were timed, if any."""
        for k, p in enumerate(self.procs):
            if p.poll() is not None:
                return self._message(k)
        return None

    def _message(self, k: int) -> str:
        code = self.procs[k].returncode
        how = (
            f"was killed by {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"exited with code {code}"
        )
        log = self.logs[k]
        log.seek(0)
        lines = [x for x in log.read().decode("utf-8", "replace").splitlines() if x.strip()]
        last = f": {' '.join(lines[-1].split())[:300]}" if lines else ""
        return f"co-located profiling: companion process {k + 1} {how}{last}"

    def stop(self) -> None:
        """Stop every companion (SIGTERM, then SIGKILL) and wait for it; close the logs."""
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        deadline = time.monotonic() + _STOP_S
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        for log in self.logs:
            log.close()
        self.procs, self.logs, self.ready = [], [], set()


def _train_forever(config: CompanionConfig, ready: IO[str]) -> None:
    """The model's training step on every size in turn, until the process is stopped."""
    from planner.profile.loader import load_model_file

    user = load_model_file(config.model)  # first: a missing file fails before torch loads

    import torch

    from planner.allocator import keep_freed_memory
    from planner.optimizers import make_optimizer
    from planner.precision import autocast
    from planner.profile.export_graph import call_for_training

    torch.set_num_threads(config.threads)
    keep_freed_memory()  # as the profiler and every run worker do
    torch.manual_seed(0)
    model = user.build()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(config.optimizer, params) if params else None
    batches = [user.batch(size) for size in config.sizes]
    rounds = 0
    while True:
        for inputs, targets in batches:
            with autocast("cpu", config.precision):
                loss = user.loss(call_for_training(model, inputs), targets)
            loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        rounds += 1
        if rounds == config.warmup:
            ready.write(READY + "\n")
            ready.flush()


def main(argv: list[str] | None = None) -> None:
    """``python -m planner.profile.companions CONFIG_JSON [PARENT_PID]``: what
    :class:`Companions` starts. It dies with the profiler (Linux), and ends at once where the
    profiler is already gone (it started in a session of its own: a Ctrl-C of the
    profiler's reaches it only through the profiler).

    Example::

        python -m planner.profile.companions '{"model": "examples/gpt.py", "sizes": [1, 2]}'
    """
    # Here, not at the top: `python -m planner.profile.isolated` imports this module first.
    from planner.profile.isolated import die_with_parent

    args = sys.argv[1:] if argv is None else argv
    die_with_parent(int(args[1]) if len(args) > 1 else None)
    # The ready line goes to the pipe; anything the model prints goes to the log.
    ready = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        _train_forever(CompanionConfig.from_json(args[0]), ready)
    except BaseException as exc:  # one line for the profiler to name, then end at once
        text = exc.one_line() if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
        sys.stderr.write(" ".join(text.split())[:500] + "\n")
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
