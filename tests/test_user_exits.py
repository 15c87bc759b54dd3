"""A model.py that exits, crashes, hangs or raises KeyboardInterrupt never decides pipeplan's
exit code: one line naming the file and the function (with the code), exit 2 while the
model loads and is checked, 1 once the work is under way; every process gone.

The in-process tests check the guard around the user's calls; the others run the commands
as a user does (real processes, real segfaults) on ``tests/models/misbehaves.py``, which
misbehaves where ``MISBEHAVE`` says and is profiled once, well behaved.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from test_signals import HARD_TIMEOUT_S, kill_tagged, start

from planner.errors import InputError
from planner.fileio import sha256_file
from planner.interrupts import handle_signals
from planner.plan import FileRef, Plan, Prediction, parse_stages
from planner.profile.loader import load_model_file
from planner.profile.measure import profile_model
from planner.schedule import build_schedule

MISBEHAVES = Path(__file__).parent / "models" / "misbehaves.py"

BODY = textwrap.dedent(
    """
    import os, sys
    import torch
    from torch import nn

    {at_import}

    def build_model():
        {build_model}
        return nn.Sequential(nn.Linear(4, 2))

    def sample_batch(batch_size):
        {sample_batch}
        return torch.randn(batch_size, 4), torch.randn(batch_size, 2)

    def loss_fn(outputs, targets):
        {loss_fn}
        return ((outputs - targets) ** 2).mean()
    """
)


def model_file(tmp_path: Path, where: str, statement: str) -> Path:
    places = dict.fromkeys(("at_import", "build_model", "sample_batch", "loss_fn"), "pass")
    places[where] = statement
    path = tmp_path / f"{where}.py"
    path.write_text(BODY.format(**places))
    return path


def call_everything(path: Path) -> None:
    user = load_model_file(path)
    model = user.build()
    inputs, targets = user.batch(2)
    user.loss(model(*inputs), targets)


@pytest.mark.parametrize("where", ["at_import", "build_model", "sample_batch", "loss_fn"])
@pytest.mark.parametrize(
    ("statement", "says"),
    [("sys.exit(3)", "called sys.exit(3)"), ("raise SystemExit", "called sys.exit()")],
)
def test_sys_exit_in_model_code_is_one_input_error(
    tmp_path: Path, where: str, statement: str, says: str
) -> None:
    path = model_file(tmp_path, where, statement)
    with pytest.raises(InputError) as info:
        call_everything(path)
    line = info.value.one_line()
    assert line.startswith(f"{path}: ") and says in line, line
    assert (info.value.field or "at_import") == where
    assert "(line " in line and "not end the process" in line


def test_keyboard_interrupt_from_model_code_is_its_own_while_pipeplan_handles_signals(
    tmp_path: Path,
) -> None:
    path = model_file(tmp_path, "sample_batch", "raise KeyboardInterrupt")
    with handle_signals(), pytest.raises(InputError, match="sample_batch.2. raised Keyboard"):
        call_everything(path)
    with pytest.raises(KeyboardInterrupt):  # without pipeplan's handlers: maybe a real Ctrl-C
        call_everything(path)


@pytest.fixture(scope="module")
def misbehaves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """misbehaves.py profiled (well behaved), a one-rank and a two-rank plan of it."""
    root = tmp_path_factory.mktemp("misbehaves")
    profile_path = root / "misbehaves.json"
    profile_model(MISBEHAVES, [2], repeat=1, warmup=0, min_time_s=0).save(profile_path)
    files = {"root": root, "profile": profile_path}
    for name, text in (("one", "0-2:cpu0"), ("two", "0-1:cpu0;2:cpu1")):
        stages = parse_stages(text)
        devices = {d for s in stages for d in s.devices}
        Plan(
            profile=FileRef(str(profile_path), sha256_file(profile_path)),
            topology=FileRef("topologies/cpu.yaml", ""),
            microbatch_size=2,
            num_microbatches=4,
            stages=stages,
            schedule=build_schedule("1f1b", stages, 4),
            predicted=Prediction(5.0, 1600.0, 0.0, 5.0, dict.fromkeys(devices, 1000), {}),
        ).save(root / f"{name}.json")
        files[name] = root / f"{name}.json"
    return files


def pipeplan(args: list[str], tmp_path: Path, misbehave: str) -> tuple[int, str]:
    """Run ``pipeplan ARGS`` with ``MISBEHAVE`` set; exit code and stderr, after checking
    that no process it started outlived it and no temporary file is left."""
    started = start(args, tmp_path, {"MISBEHAVE": misbehave})
    try:
        code, err = started.finish(HARD_TIMEOUT_S)
    finally:
        left = kill_tagged(started.tag)
    assert not left, f"processes outlived the command: {left}"
    assert started.leftover_files() == [], "temporary files left behind"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipeplan: error: "), err[-3000:]
    return code, lines[0]


@pytest.mark.parametrize(
    ("misbehave", "says"),
    [
        ("build_model:oexit0", r"misbehaves.py: build_model: build_model\(\) called os._exit\(0\) "
         r"\(line 28\); "),
        ("sample_batch:segv", r"misbehaves.py: its code crashed with SIGSEGV in misbehave "
         r"\(misbehaves.py line 32, called from sample_batch\) while profiling$"),
        ("loss_fn:kbi", r"misbehaves.py: loss_fn: loss_fn\(\.\.\., \.\.\.\) raised "
         r"KeyboardInterrupt \(line 30\); no Ctrl-C"),
    ],
    ids=["os-exit-build_model", "segv-sample_batch", "keyboard-interrupt-loss_fn"],
)  # fmt: skip
def test_profile(misbehaves: dict[str, Path], tmp_path: Path, misbehave: str, says: str) -> None:
    out = tmp_path / "p.json"
    code, line = pipeplan(
        ["profile", str(MISBEHAVES), "-b", "2", "--repeat", "1", "--warmup", "0",
         "--min-time", "0", "-o", str(out)],
        tmp_path,
        misbehave,
    )  # fmt: skip
    assert code == 2 and re.search(says, line), line
    assert not out.exists()


@pytest.mark.parametrize(
    ("plan", "timeout", "misbehave", "expected", "says"),
    [
        ("two", "30", "sample_batch:segv", 2, r"misbehaves.py: rank . \(cpu.\) was killed by "
         r"SIGSEGV in misbehave \(misbehaves.py line 32, called from sample_batch\) while "
         r"loading the model$"),
        ("one", "30", "build_model:oexit0", 2, r"misbehaves.py: build_model: build_model\(\) "
         r"called os._exit\(0\) \(line 28\)"),
        ("one", "30", "loss_fn:exit3", 1, r"^rank 0 \(cpu0\): .*misbehaves.py: loss_fn: "
         r"loss_fn\(.*\) called sys.exit\(3\) .*; stopped every rank$"),
        ("one", "30", "forward:oexit0@4", 1, r"^rank 0 \(cpu0\) exited with code 0 before it "
         r"finished"),
        ("one", "1", "import:loop", 1, r"^rank 0 \(cpu0\) made no progress for 1 s in misbehave "
         r"\(misbehaves.py line 3[45], called at import\); stopped every rank"),
    ],
    ids=["segv-loading", "os-exit-loading", "sys-exit-training", "os-exit-training",
         "hang-import"],
)  # fmt: skip
def test_run(
    misbehaves: dict[str, Path],
    tmp_path: Path,
    plan: str,
    timeout: str,
    misbehave: str,
    expected: int,
    says: str,
) -> None:
    args = ["run", str(misbehaves[plan]), "--model", str(MISBEHAVES), "--steps", "2",
            "--warmup", "0", "--timeout", timeout]  # fmt: skip
    code, line = pipeplan(args, tmp_path, misbehave)
    assert code == expected, line
    assert re.search(says, line.removeprefix("pipeplan: error: ")), line


def test_export_checks_the_model_in_a_child(misbehaves: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "exported"
    code, line = pipeplan(
        ["export", str(misbehaves["two"]), "--to", "torch", "--model", str(MISBEHAVES), "-o",
         str(out)], tmp_path, "build_model:segv",
    )  # fmt: skip
    assert code == 2, line
    assert re.search(
        r"misbehaves.py: its code crashed with SIGSEGV in misbehave \(misbehaves.py line 32, "
        r"called from build_model\) while checking it$",
        line,
    ), line
    assert not out.exists()
