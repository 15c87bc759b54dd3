"""The environment variables a run reads: malformed ones are one line naming the variable
and what it must be, exit 2, before any process starts; an unreachable rendezvous is one
line (exit 1) after a bounded wait, not torch's traceback."""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

import pytest

from planner.cli import main
from planner.errors import InputError, RunFailed
from planner.fileio import sha256_file
from planner.plan import FileRef, Plan, Prediction, parse_stages
from planner.runtime.environment import (
    TorchrunEnv,
    parse_fault,
    torchrun_env,
    wait_for_rendezvous,
)
from planner.runtime.launch import worker_env
from planner.schedule import build_schedule

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "mlp.py"
GOOD = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@pytest.mark.parametrize(
    ("env", "variable", "says"),
    [
        ({**GOOD, "RANK": "abc"}, "RANK", "expected a whole number from 0 to 1, got 'abc'"),
        ({**GOOD, "RANK": "2"}, "RANK", "from 0 to 1"),
        ({**GOOD, "WORLD_SIZE": "-3"}, "WORLD_SIZE", "from 1 to 1,000,000, got '-3'"),
        ({**GOOD, "WORLD_SIZE": "9" * 5000}, "WORLD_SIZE", "expected a whole number"),
        ({**GOOD, "MASTER_PORT": "0"}, "MASTER_PORT", "a TCP port from 1 to 65535"),
        ({**GOOD, "MASTER_ADDR": " "}, "MASTER_ADDR", "rank 0's machine"),
        ({**GOOD, "LOCAL_RANK": "x"}, "LOCAL_RANK", "a whole number >= 0"),
        ({"TORCHELASTIC_RUN_ID": "x"}, "RANK", "not set, but TORCHELASTIC_RUN_ID is"),
        ({"RANK": "abc"}, "WORLD_SIZE", "not set, but RANK is"),
        ({"WORLD_SIZE": "-3"}, "RANK", "unset WORLD_SIZE to launch the ranks locally"),
    ],
)
def test_malformed_torchrun_variables_name_the_variable(
    env: dict[str, str], variable: str, says: str
) -> None:
    with pytest.raises(InputError) as info:
        torchrun_env(env)
    assert info.value.field == f"environment variable {variable}"
    assert says in info.value.one_line() and len(info.value.one_line()) < 300


def test_torchrun_variables_read() -> None:
    assert torchrun_env({"MASTER_ADDR": "x", "LOCAL_RANK": "3"}) is None  # not torchrun
    env = torchrun_env({**GOOD, "LOCAL_RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert env == TorchrunEnv(1, 2, 0, "127.0.0.1", 29500, agent_store=True)


@pytest.mark.parametrize("spec", ["x", ":::", "a:b:c", "0:0:explode", "1:-1:raise", "2:0:kill"])
def test_a_malformed_fault_names_pipeplan_fault(spec: str) -> None:
    with pytest.raises(InputError, match="environment variable PIPEPLAN_FAULT: expected RANK"):
        parse_fault(spec, world_size=2)


def test_a_fault_read() -> None:
    fault = parse_fault("1:3:hang", world_size=2)
    assert fault is not None and (fault.rank, fault.step, fault.kind) == (1, 3, "hang")
    assert parse_fault("") is None and parse_fault(None) is None


def test_local_workers_get_no_torchrun_variables() -> None:
    env = worker_env({**GOOD, "LOCAL_RANK": "5", "TORCHELASTIC_RUN_ID": "x", "HOME": "/h"})
    assert not set(TORCHRUN) & set(env) and env["HOME"] == "/h"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once it is closed


def test_an_unreachable_rendezvous_is_one_line_after_the_timeout() -> None:
    env = TorchrunEnv(1, 2, None, "127.0.0.1", closed_port())
    started = time.monotonic()
    with pytest.raises(RunFailed, match="rank 1 could not reach the rendezvous at MASTER_ADDR"):
        wait_for_rendezvous(env, timeout_s=1.0)
    assert 1.0 <= time.monotonic() - started < 5


def test_rank_0_refuses_a_master_addr_of_another_machine() -> None:
    env = TorchrunEnv(0, 2, None, "192.0.2.1", 29500)  # TEST-NET-1: never this machine
    with pytest.raises(InputError, match="MASTER_ADDR: '192.0.2.1' is not an address of this"):
        wait_for_rendezvous(env, timeout_s=60)


def test_a_rendezvous_that_answers_is_reached() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = int(server.getsockname()[1])
        wait_for_rendezvous(TorchrunEnv(1, 2, None, "127.0.0.1", port), timeout_s=5)


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    from planner.profile.schema import load_profile

    profile = ROOT / "profiles" / "mlp.json"
    stages = parse_stages(f"0-2:cpu0;3-{load_profile(profile).num_layers - 1}:cpu1")
    path = tmp_path / "plan.json"
    Plan(
        profile=FileRef(str(profile), sha256_file(profile)),
        topology=FileRef("topologies/cpu.yaml", ""),
        microbatch_size=8,  # a profiled size
        num_microbatches=2,
        stages=stages,
        schedule=build_schedule("1f1b", stages, 2),
        predicted=Prediction(5.0, 1600.0, 0.0, 5.0, {"cpu0": 1, "cpu1": 1}, {}),
    ).save(path)
    return path


@pytest.mark.parametrize(
    ("env", "code", "says"),
    [
        ({"PIPEPLAN_FAULT": "0:0:explode"}, 2, "environment variable PIPEPLAN_FAULT: expected"),
        ({"PIPEPLAN_FAULT": "5:0:raise"}, 2, "with RANK from 0 to 1, got '5'"),
        ({"TORCHELASTIC_RUN_ID": "x"}, 2, "environment variable RANK: not set"),
        ({**GOOD, "RANK": "abc"}, 2, "environment variable RANK: expected a whole number"),
        ({**GOOD, "MASTER_PORT": "closed"}, 1, "could not reach the rendezvous"),
    ],
)
def test_run_checks_the_environment_before_any_process_starts(
    plan_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    code: int,
    says: str,
) -> None:
    for name in (*TORCHRUN, "PIPEPLAN_FAULT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(closed_port()) if value == "closed" else value)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(SystemExit) as info:
        main(["run", str(plan_file), "--model", str(MLP), "--timeout", "1"])
    err = capsys.readouterr().err
    assert info.value.code == code, err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err
    assert list(scratch.iterdir()) == []  # no run folder: nothing started
