"""`pipeplan run` from the command line: report, trace, calibration, refusals, failures.

Every command runs in a subprocess with a hard timeout, so a hang fails the test instead of
blocking CI, and failure tests check that no worker process survives the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from planner.cli import main
from planner.fileio import sha256_file
from planner.plan import FileRef, Plan, Prediction, parse_stages
from planner.profile.measure import profile_model
from planner.schedule import build_schedule

PIPEPLAN = [sys.executable, "-m", "planner.cli"]
HARD_TIMEOUT_S = 90

TINY = textwrap.dedent(
    """
    import torch
    from torch import nn

    def build_model():
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def sample_batch(batch_size):
        return torch.randn(batch_size, 6), torch.randn(batch_size, 3)
    """
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model, its profile, and a 2-stage 1F1B plan made from that profile."""
    root = tmp_path_factory.mktemp("run")
    model = root / "tiny.py"
    model.write_text(TINY)
    profile = profile_model(model, [2], repeat=1, warmup=0, min_time_s=0)
    profile_path = root / "tiny.json"
    profile.save(profile_path)
    stages = parse_stages("0-1:cpu0;2:cpu1")
    plan = Plan(
        profile=FileRef(str(profile_path), sha256_file(profile_path)),
        topology=FileRef("topologies/cpu.yaml", ""),
        microbatch_size=2,
        num_microbatches=4,
        stages=stages,
        schedule=build_schedule("1f1b", stages, 4),
        predicted=Prediction(5.0, 1600.0, 0.0, 5.0, {"cpu0": 1000, "cpu1": 1000}, {}),
    )
    plan_path = root / "plan.json"
    plan.save(plan_path)
    return {"root": root, "model": model, "profile": profile_path, "plan": plan_path}


def pipeplan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PIPEPLAN, *args],
        capture_output=True,
        text=True,
        timeout=HARD_TIMEOUT_S,
        env={**os.environ, **(env or {})},
    )


def test_json_report_trace_and_calibration(setup: dict[str, Path]) -> None:
    root = setup["root"]
    trace, calibrated = root / "measured.json", root / "calibrated.json"
    done = pipeplan(
        "run", str(setup["plan"]), "--model", str(setup["model"]), "--steps", "2",
        "--warmup", "1", "--timeout", "60", "--json", "--trace", str(trace),
        "--calibrate", str(calibrated),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["schedule"] == "1f1b" and report["world_size"] == 2
    assert report["predicted"]["iteration_ms"] == 5.0
    measured = report["measured"]["iteration_ms"]
    assert measured > 0 and report["ratio"] == pytest.approx(measured / 5.0, rel=1e-3)
    assert len(report["losses"]) == 3 and len(report["measured"]["step_ms"]) == 2
    assert {"F0", "B0", "F1", "B1", "STEP0", "STEP1"} <= set(report["measured"]["stage_ms"])
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"F0.0", "B1.3", "STEP0"} <= names  # same naming as show --trace
    processes = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {"measured devices", "predicted devices"} <= processes  # side by side
    meta = json.loads(calibrated.read_text())["meta"]["calibrated"]
    assert set(meta["stage_ratios"]) == {"0", "1"}


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run in-process (refusals start no worker); the one stderr line of exit code 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *args])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_refuses_a_different_model_source(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    other = setup["root"] / "other.py"
    other.write_text(TINY + "\n# edited after profiling\n")
    line = refused(capsys, str(setup["plan"]), "--model", str(other))
    assert "not the one profiled" in line and "other.py" in line


def test_refuses_a_changed_profile(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(setup["plan"].read_text())
    data["profile"]["sha256"] = "0" * 64
    stale = setup["root"] / "stale.json"
    stale.write_text(json.dumps(data))
    line = refused(capsys, str(stale), "--model", str(setup["model"]))
    assert "changed since this plan was made" in line and "profile.sha256" in line


def test_refuses_a_model_with_other_layers(
    setup: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(setup["plan"].read_text())
    data["profile"] = {"path": "<memory>", "sha256": ""}  # no profile: the split still counts
    data["stages"][-1]["layers"] = [2, 3]
    data["stages"] = [data["stages"][0], data["stages"][1]]
    odd = setup["root"] / "four_layers.json"
    odd.write_text(json.dumps(data))
    line = refused(capsys, str(odd), "--model", str(setup["model"]))
    assert "splits into 3" in line


def _children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(x) for x in text.split()}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_raising_worker_stops_every_rank(setup: dict[str, Path]) -> None:
    done = pipeplan(
        "run", str(setup["plan"]), "--model", str(setup["model"]), "--steps", "50",
        "--timeout", "30",
        env={"PIPEPLAN_FAULT": "1:1:raise"},
    )  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pipeplan: error: rank 1 (cpu1): RuntimeError: injected fault"), last
    assert "stopped every rank" in last


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_killing_a_worker_mid_run_ends_the_run(setup: dict[str, Path]) -> None:
    proc = subprocess.Popen(
        [*PIPEPLAN, "run", str(setup["plan"]), "--model", str(setup["model"]),
         "--steps", "100000", "--timeout", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while len(workers) < 2 and time.monotonic() < deadline:
            # spawn also starts a resource tracker; workers are the children named pipeplan-N
            workers = {c for c in _children(proc.pid) if "pipeplan" in _cmdline(c) or _is_worker(c)}
            time.sleep(0.2)
        assert len(workers) >= 2, "workers did not start"
        time.sleep(4)  # mid-run: past start-up, training steps
        victim = max(workers)
        os.kill(victim, signal.SIGKILL)
        started = time.monotonic()
        _, err = proc.communicate(timeout=HARD_TIMEOUT_S)
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert "was killed by SIGKILL" in last and "stopped every rank" in last, err
    time.sleep(0.5)
    assert not [pid for pid in workers if _alive(pid)], "a worker outlived the run"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _is_worker(pid: int) -> bool:
    # multiprocessing spawn children run "python -c 'from multiprocessing.spawn import ...'"
    line = _cmdline(pid)
    return "spawn_main" in line and "resource_tracker" not in line


def test_under_torchrun_ranks_come_from_the_environment(setup: dict[str, Path]) -> None:
    """torchrun starts the ranks; they train exactly as one process does."""
    from planner.runtime.launch import free_port
    from planner.runtime.reference import train_single_process

    params = setup["root"] / "torchrun-params.pt"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), "-m", "planner.cli", "run", str(setup["plan"]),
         "--model", str(setup["model"]), "--steps", "2", "--warmup", "1", "--timeout", "60",
         "--save-params", str(params), "--json"],
        capture_output=True, text=True, timeout=HARD_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])  # rank 0 alone prints
    assert report["world_size"] == 2 and set(report["placement"]) == {"cpu0", "cpu1"}
    assert report["outputs"]["parameters"] == str(params)
    # The profile's optimizer (adam) at its default rate, 3 steps of 4 microbatches of 2.
    ref = train_single_process(setup["model"], steps=3, batch_size=8, optimizer="adam")
    assert report["losses"] == pytest.approx(ref.losses, rel=1e-5)
    trained = torch.load(params)
    assert set(trained) == set(ref.parameters)
    for name, value in ref.parameters.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)
