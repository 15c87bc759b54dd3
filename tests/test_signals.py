"""Ctrl-C, SIGTERM and SIGHUP: every command ends within seconds, with one line and exit
128 + the signal, every process it started gone and its temporary files removed.

Real processes and real signals: each command runs in its own session with its own TMPDIR
and a tag in its environment, which every process it starts inherits, so the test finds
them all in /proc afterwards (none may be left) and sees every temporary file it made.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.fileio import sha256_file
from planner.interrupts import Interrupted, handle_signals, handling
from planner.plan import FileRef, Plan, Prediction, parse_stages
from planner.profile.measure import profile_model
from planner.schedule import build_schedule

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")

ROOT = Path(__file__).resolve().parents[1]
PIPEPLAN = [sys.executable, "-m", "pipeplan_cli"]  # what the console script runs
TAG = "PIPEPLAN_TEST_TAG"
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


def tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``TAG=tag``."""
    mark = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone, or not ours to read
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def kill_tagged(tag: str) -> list[int]:
    """Kill what is left of a test's processes; returns who was left."""
    left = tagged(tag)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


@dataclass
class Started:
    """A pipeplan command started in its own session, its processes found by their tag."""

    proc: subprocess.Popen[str]
    tag: str
    tmp: Path

    def processes(self) -> list[int]:
        return tagged(self.tag)

    def wait_for(self, ready: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
        deadline = time.monotonic() + limit_s
        while not ready():
            assert self.proc.poll() is None, f"ended before {what}: {self.proc.communicate()}"
            assert time.monotonic() < deadline, f"no {what} within {limit_s} s"
            time.sleep(0.1)

    def finish(self, limit_s: float = HARD_TIMEOUT_S) -> tuple[int, str]:
        """Exit code and stderr; kills everything tagged when the command overran."""
        try:
            _, err = self.proc.communicate(timeout=limit_s)
        finally:
            self.kill_leftovers()
        return self.proc.returncode, err

    def kill_leftovers(self) -> list[int]:
        left = kill_tagged(self.tag)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        return left

    def leftover_files(self) -> list[str]:
        # torch keeps its compile cache (torchinductor_USER) in TMPDIR: not pipeplan's
        return sorted(p.name for p in self.tmp.iterdir() if not p.name.startswith("torchinductor"))


def start(
    args: list[str],
    tmp_path: Path,
    env: dict[str, str] | None = None,
    *,
    ignore_sigint: bool = False,
) -> Started:
    """``pipeplan ARGS`` in its own session; ``ignore_sigint`` starts it as a script's
    background job is started (SIGINT ignored)."""
    tag = uuid.uuid4().hex
    tmp = tmp_path / f"tmp-{tag[:8]}"
    tmp.mkdir()
    full_env = {**os.environ, **(env or {}), TAG: tag, "TMPDIR": str(tmp)}

    def ignore() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [*PIPEPLAN, *args], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=ignore if ignore_sigint else None,
    )  # fmt: skip
    return Started(proc, tag, tmp)


def assert_ended_cleanly(started: Started, code: int, err: str, expected: int, line: str) -> None:
    lines = err.strip().splitlines()
    assert code == expected, err[-2000:]
    assert lines == [f"pipeplan: error: {line}"], err[-2000:]
    left = started.kill_leftovers()
    assert not left, f"processes outlived the command: {left}"
    assert started.leftover_files() == [], "temporary files left behind"


@pytest.fixture(scope="module")
def run_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model, its profile and a two-stage plan over two CPU processes."""
    root = tmp_path_factory.mktemp("signals")
    model = root / "tiny.py"
    model.write_text(TINY)
    profile_path = root / "tiny.json"
    profile_model(model, [2], repeat=1, warmup=0, min_time_s=0).save(profile_path)
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
    plan.save(root / "plan.json")
    return {"model": model, "plan": root / "plan.json"}


def both_ranks_started(started: Started) -> bool:
    """Both ranks of the run met at the rendezvous: each wrote its heartbeat file."""
    return len(list(started.tmp.glob("pipeplan-run-*/alive-*"))) == 2


@pytest.mark.parametrize(
    ("sig", "to_group", "ignored"),
    [
        (signal.SIGINT, True, True),  # a terminal's Ctrl-C, to a job started with & in a script
        (signal.SIGTERM, False, False),
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_mid_run_stops_every_rank_and_removes_the_run_folder(
    run_files: dict[str, Path], tmp_path: Path, sig: signal.Signals, to_group: bool, ignored: bool
) -> None:
    args = ["run", str(run_files["plan"]), "--model", str(run_files["model"]), "--steps",
            "100000", "--timeout", "60"]  # fmt: skip
    started = start(args, tmp_path, ignore_sigint=ignored)
    try:
        started.wait_for(lambda: both_ranks_started(started), "both ranks")
        time.sleep(1.0)  # loading or training
        assert len(started.processes()) == 3  # the launcher and its two ranks
        (os.killpg if to_group else os.kill)(started.proc.pid, sig)
        sent = time.monotonic()
        code, err = started.finish()
        assert time.monotonic() - sent < 10
    finally:
        started.kill_leftovers()
    assert_ended_cleanly(started, code, err, 128 + sig, f"interrupted by {sig.name}")


def test_ctrl_c_while_profiling_stops_the_measuring_child_and_writes_nothing(
    tmp_path: Path,
) -> None:
    model = tmp_path / "wide.py"
    model.write_text(TINY.replace("16", "512"))
    out = tmp_path / "wide.json"
    args = ["profile", str(model), "-b", "1,2,4,8", "--repeat", "10000", "-o", str(out), "-q"]
    started = start(args, tmp_path)
    try:
        started.wait_for(lambda: bool(started.processes()), "pipeplan")
        time.sleep(3.0)  # its child loads the model or measures it
        os.killpg(started.proc.pid, signal.SIGINT)
        code, err = started.finish()
    finally:
        started.kill_leftovers()
    assert_ended_cleanly(started, code, err, 130, "interrupted by SIGINT")
    assert not out.exists()


def test_ctrl_c_while_the_commands_load_is_one_line(tmp_path: Path) -> None:
    """A Ctrl-C in the first second, while the commands import torch (1.5 s of the CLI's
    start on the development VM, seconds on a loaded one): exit 130 and one line, as later."""
    profile, topology = ROOT / "profiles" / "mlp.json", ROOT / "topologies" / "nvlink.yaml"
    args = ["solve", "--profile", str(profile), "--topology", str(topology), "-o", "p.json"]
    started = start(args, tmp_path)
    try:
        time.sleep(0.9)  # past the interpreter's own start (0.4 s with planner.cli)
        os.killpg(started.proc.pid, signal.SIGINT)
        code, err = started.finish()
    finally:
        started.kill_leftovers()
    assert_ended_cleanly(started, code, err, 130, "interrupted by SIGINT")


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal's foreground command has it (a shell script's
    background job, the test run itself perhaps, inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_planner_itself_is_imported_is_one_line(tmp_path: Path) -> None:
    """A Ctrl-C while ``planner`` is still being imported, before planner.cli can handle
    signals (the console script's module handles it): sent as soon as ``-X importtime``
    reports the first of planner's modules, so it lands inside the import on any machine."""
    tag = uuid.uuid4().hex
    args = ["solve", "--profile", str(ROOT / "profiles" / "mlp.json"), "--topology", "x.yaml"]
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "pipeplan_cli", *args],
        env={**os.environ, TAG: tag}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=_default_sigint,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            module = line.rsplit("|", 1)[-1].strip()
            if line.startswith("import time:") and module.startswith("planner"):
                os.killpg(proc.pid, signal.SIGINT)
                break
        _, rest = proc.communicate(timeout=HARD_TIMEOUT_S)
    finally:
        kill_tagged(tag)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    said = [x for x in ("".join(lines) + rest).splitlines() if not x.startswith("import time:")]
    assert proc.returncode == 130, said
    assert said == ["pipeplan: error: interrupted by SIGINT"]


def test_a_child_whose_parent_died_before_it_asked_to_die_with_it_exits() -> None:
    """PR_SET_PDEATHSIG is asked for only once the child runs; a parent that dies earlier
    (a launcher killed while its ranks start) must still take the child with it."""
    tag = uuid.uuid4().hex
    child = (
        "import os, sys, time\n"
        "time.sleep(1.0)  # the parent is gone by now\n"
        "from planner.profile.isolated import die_with_parent\n"
        "die_with_parent(int(sys.argv[1]))\n"
        "time.sleep(60)\n"
    )
    parent = (
        "import os, subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid())])\n"
        "os._exit(0)\n"
    )
    env = {**os.environ, TAG: tag}
    subprocess.run([sys.executable, "-c", parent], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 20
    while tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not kill_tagged(tag), "the orphan kept running"


@pytest.fixture
def main_thread_handlers() -> Iterator[None]:
    """Python's own handlers while the test runs, whatever the suite inherited (a background
    job ignores SIGINT, nohup SIGHUP, and pipeplan rightly keeps an ignored SIGHUP so)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("main_thread_handlers")
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name
)
def test_handled_signals_raise_once_and_the_old_handlers_come_back(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as info, handle_signals():
        assert handling()
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises in here
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # during the clean-up: counted, not raised
            time.sleep(0.1)
    assert (info.value.name, info.value.exit_code) == (sig.name, 128 + sig)
    assert not handling()
    assert signal.getsignal(sig) is before


@pytest.mark.usefixtures("main_thread_handlers")
def test_sighup_ignored_on_entry_stays_ignored() -> None:
    """nohup: the command keeps running when its terminal goes away."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with handle_signals():
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.default_int_handler)
