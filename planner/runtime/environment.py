"""The environment variables a run reads, checked before any process starts.

* torchrun's (:func:`torchrun_env`): a process is one rank of a torchrun job when
  ``TORCHELASTIC_RUN_ID``, ``RANK`` or ``WORLD_SIZE`` is set; then ``RANK`` (0 to
  ``WORLD_SIZE - 1``), ``WORLD_SIZE`` (1 to :data:`MAX_WORLD_SIZE`), ``MASTER_ADDR`` and
  ``MASTER_PORT`` (1-65535) must all be set and well formed, and ``LOCAL_RANK`` (when set)
  a whole number >= 0. Anything else is one line naming the variable and what it must be
  (InputError, exit 2). A local launch passes none of them to its workers.
* ``PIPEPLAN_FAULT`` (:func:`parse_fault`): ``RANK:STEP:raise|kill|hang``, a rank of the
  run and a step >= 0.
* The rendezvous (:func:`wait_for_rendezvous`): under torchrun a rank that cannot reach
  ``MASTER_ADDR:MASTER_PORT`` waits at most the run's ``--timeout`` (default 300 s), then
  fails with one line (RunFailed, exit 1); rank 0, which hosts it, is refused at once when
  ``MASTER_ADDR`` is not an address of its own machine.

Example::

    env = torchrun_env()          # None outside torchrun; InputError when malformed
    fault = parse_fault(os.environ.get(FAULT_ENV), world_size=2)
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

from planner.errors import InputError, RunFailed

__all__ = [
    "FAULT_ENV",
    "FAULT_KINDS",
    "MAX_WORLD_SIZE",
    "TORCHRUN_VARIABLES",
    "Fault",
    "TorchrunEnv",
    "parse_fault",
    "torchrun_env",
    "wait_for_rendezvous",
]

FAULT_ENV = "PIPEPLAN_FAULT"
"""``RANK:STEP:raise|kill|hang``: make one rank fail at a step (to test the failure paths)."""

FAULT_KINDS = ("raise", "kill", "hang")

MAX_WORLD_SIZE = 1_000_000
"""More ranks than any cluster runs; a larger ``WORLD_SIZE`` is refused."""

TORCHRUN_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
)
"""What torchrun sets for its ranks; a local launch removes them from its workers'
environment (its ranks rendezvous on their own port)."""


@dataclass(frozen=True)
class TorchrunEnv:
    """This process's place in a torchrun job, from the environment.

    ``agent_store``: torchrun's agent hosts the rendezvous store (every rank connects to
    it, rank 0 too).

    Example::

        TorchrunEnv(rank=1, world_size=2, local_rank=1, master_addr="node0", master_port=29500)
    """

    rank: int
    world_size: int
    local_rank: int | None
    master_addr: str
    master_port: int
    agent_store: bool = False


@dataclass(frozen=True)
class Fault:
    """An injected failure: ``kind`` at step ``step`` on rank ``rank``.

    Example::

        Fault(rank=1, step=2, kind="kill")   # what PIPEPLAN_FAULT=1:2:kill asks for
    """

    rank: int
    step: int
    kind: str


def _whole(name: str, text: str, low: int, high: int, expected: str) -> int:
    """``text`` as a whole number in ``low .. high``; InputError naming variable ``name``."""
    value = None
    stripped = text.strip()
    if 0 < len(stripped) <= 12 and stripped.lstrip("+-").isdigit():  # no 5000-digit parse
        value = int(stripped)
    if value is None or not low <= value <= high:
        raise InputError(
            f"expected {expected}, got {text[:40]!r}", field=f"environment variable {name}"
        )
    return value


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """This rank's torchrun settings; None when no torchrun variable is set.

    Example::

        torchrun_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "node0",
                      "MASTER_PORT": "29500"}).rank   # 1
    """
    env = os.environ if environ is None else environ
    if not any(name in env for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE")):
        return None
    given = [name for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE") if name in env]
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name not in env:
            raise InputError(
                f"not set, but {' and '.join(given)} {'is' if len(given) == 1 else 'are'}: a "
                "torchrun rank has RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (unset "
                f"{', '.join(given)} to launch the ranks locally)",
                field=f"environment variable {name}",
            )
    world = _whole(
        "WORLD_SIZE", env["WORLD_SIZE"], 1, MAX_WORLD_SIZE,
        f"a whole number of processes from 1 to {MAX_WORLD_SIZE:,}",
    )  # fmt: skip
    rank = _whole("RANK", env["RANK"], 0, world - 1, f"a whole number from 0 to {world - 1}")
    local = env.get("LOCAL_RANK")
    local_rank = None
    if local is not None:
        local_rank = _whole("LOCAL_RANK", local, 0, world - 1, "a whole number >= 0")
    addr = env["MASTER_ADDR"].strip()
    if not addr or any(c.isspace() for c in addr):
        raise InputError(
            f"expected the host name or address of rank 0's machine, got {addr[:40]!r}",
            field="environment variable MASTER_ADDR",
        )
    port = _whole("MASTER_PORT", env["MASTER_PORT"], 1, 65535, "a TCP port from 1 to 65535")
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return TorchrunEnv(rank, world, local_rank, addr, port, agent)


def parse_fault(spec: str | None, world_size: int | None = None) -> Fault | None:
    """``PIPEPLAN_FAULT`` checked: None when unset or empty; InputError when malformed or
    naming a rank the run does not have.

    Example::

        parse_fault("1:2:kill", world_size=2)   # Fault(rank=1, step=2, kind='kill')
    """
    if not spec:
        return None
    field = f"environment variable {FAULT_ENV}"
    parts = spec.split(":")
    expected = f"RANK:STEP:{'|'.join(FAULT_KINDS)} (e.g. 1:2:raise)"
    if len(parts) != 3 or parts[2] not in FAULT_KINDS:
        raise InputError(f"expected {expected}, got {spec[:40]!r}", field=field)
    high = MAX_WORLD_SIZE if world_size is None else world_size - 1
    rank = _whole(FAULT_ENV, parts[0], 0, high, f"{expected} with RANK from 0 to {high}")
    step = _whole(FAULT_ENV, parts[1], 0, 10**9, f"{expected} with STEP >= 0")
    return Fault(rank, step, parts[2])


def wait_for_rendezvous(env: TorchrunEnv, timeout_s: float) -> None:
    """Make sure this rank can reach torchrun's rendezvous before torch waits for it.

    Rank 0 hosts the store (unless torchrun's agent does): ``MASTER_ADDR`` must be an
    address of this machine. Every other rank connects to ``MASTER_ADDR:MASTER_PORT``,
    trying again for at most ``timeout_s`` seconds (rank 0 may start later).

    Example::

        wait_for_rendezvous(torchrun_env(), timeout_s=300)
    """
    field = "environment variable MASTER_ADDR"
    try:
        infos = socket.getaddrinfo(env.master_addr, env.master_port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise InputError(f"cannot resolve {env.master_addr!r}: {exc}", field=field) from None
    if env.rank == 0 and not env.agent_store:
        if not any(_is_local(info) for info in infos):
            raise InputError(
                f"{env.master_addr!r} is not an address of this machine, but RANK 0 hosts "
                "the rendezvous there: set MASTER_ADDR to rank 0's host",
                field=field,
            )
        return
    deadline = time.monotonic() + timeout_s
    reason = "no answer"
    while True:
        for family, kind, proto, _, address in infos:
            try:
                with socket.socket(family, kind, proto) as probe:
                    probe.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
                    probe.connect(address)
                return
            except OSError as exc:
                reason = exc.strerror or type(exc).__name__
        if time.monotonic() >= deadline:
            break
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    raise RunFailed(
        f"rank {env.rank} could not reach the rendezvous at MASTER_ADDR:MASTER_PORT = "
        f"{env.master_addr}:{env.master_port} within {timeout_s:g} s ({reason}); is rank 0 "
        "running, and do MASTER_ADDR and MASTER_PORT name its machine and port? (--timeout "
        "sets the wait)"
    )


def _is_local(info: tuple[object, ...]) -> bool:
    family, kind, proto, _, address = info
    try:
        with socket.socket(family, kind, proto) as s:  # type: ignore[arg-type]
            s.bind((address[0], 0))  # type: ignore[index]
        return True
    except OSError as exc:
        return exc.errno != errno.EADDRNOTAVAIL
