"""``pipeplan profile`` and ``pipeplan demo`` end to end, and the bundled profiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import main
from planner.fileio import sha256_file
from planner.profile import load_profile

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"
FAST = ["--repeat", "2", "--warmup", "1", "--min-time", "0", "--min-time", "0"]


def torch_cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_profile_writes_a_valid_profile_and_prints_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "skip.json"
    code, out, _ = _run(
        ["profile", str(MODELS / "skip.py"), "-b", "1,2", "-o", str(target), "--json", *FAST],
        capsys,
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["output"] == str(target)
    profile = load_profile(target)
    assert summary["profile"] == profile.to_dict()
    assert profile.microbatch_sizes == [1, 2]
    assert profile.source_sha256 == sha256_file(MODELS / "skip.py")
    assert profile.model == "skip" and profile.device == "cpu" and profile.optimizer == "adam"
    assert profile.meta["repeat"] == 2 and profile.meta["warmup"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["skip.json"]  # no temporary left behind


def test_profile_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "p.json"
    code, out, err = _run(
        ["profile", str(MODELS / "skip.py"), "-b", "2", "-o", str(target), *FAST], capsys
    )
    assert code == 0
    for header in ("layer", "fwd", "bwd", "params", "act"):
        assert header in out
    assert "blocks.3" in out and "total" in out
    assert f"wrote {target}" in " ".join(err.split())


def test_profile_warns_once_when_the_microbatch_size_matters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """BatchNorm in training mode normalises over each microbatch: one warning line (not an
    error), and the profile records the modules; a model without it gets none."""
    target = tmp_path / "bn.json"
    code, _, err = _run(
        ["profile", str(MODELS / "batchnorm.py"), "-b", "2", "-o", str(target), "-q", *FAST],
        capsys,
    )
    assert code == 0
    text = " ".join(err.split())
    assert text.count("warning: the model's result depends on the microbatch size") == 1
    assert "1 (BatchNorm1d)" in text
    assert load_profile(target).settings.batch_dependent == ("1 (BatchNorm1d)",)
    code, _, err = _run(
        [
            "profile",
            str(MODELS / "skip.py"),
            "-b",
            "2",
            "-o",
            str(tmp_path / "s.json"),
            "-q",
            *FAST,
        ],
        capsys,
    )
    assert code == 0 and "microbatch size" not in err
    assert "batch_dependent" not in json.loads((tmp_path / "s.json").read_text())["meta"]


def test_batch_dependent_modules() -> None:
    from torch import nn

    from planner.profile.batch_dependence import batch_dependent_modules

    frozen = nn.BatchNorm1d(4).eval()  # running statistics: each sample on its own
    no_stats = nn.BatchNorm2d(4, track_running_stats=False).eval()  # still the batch's
    model = nn.ModuleDict(
        {
            "bn": nn.BatchNorm1d(4),
            "sync": nn.SyncBatchNorm(4),
            "lazy": nn.LazyBatchNorm1d(),
            "frozen": frozen,
            "no_stats": no_stats,
            "per_sample": nn.Sequential(
                nn.LayerNorm(4), nn.GroupNorm(2, 4), nn.InstanceNorm1d(4, track_running_stats=True)
            ),
        }
    )
    assert batch_dependent_modules(model) == [
        "bn (BatchNorm1d)",
        "sync (SyncBatchNorm)",
        "lazy (LazyBatchNorm1d)",
        "no_stats (BatchNorm2d)",
    ]


def _bad_cases(tmp: Path) -> list[tuple[list[str], str]]:
    ok = str(MODELS / "skip.py")
    out = ["-o", str(tmp / "p.json")]
    return [
        (["profile", str(tmp / "nope.py"), *out], "nope.py: file does not exist"),
        (
            ["profile", str(MODELS / "raises_on_import.py"), *out],
            "raised on import: RuntimeError: weights file ckpt.pt not found (line 3)",
        ),
        (["profile", str(MODELS / "no_build_model.py"), *out], "build_model: defines no function"),
        (
            ["profile", str(MODELS / "rejected_batch.py"), *out],
            "sample_batch: the model rejected sample_batch(1) inputs [(1, 5) float32]",
        ),
        (["profile", ok, "-b", "0", *out], "-b: expected positive whole numbers"),
        (["profile", ok, "-b", "1,x", *out], "got 'x'"),
        (["profile", ok, "-o", str(tmp / "missing" / "p.json")], "does not exist"),
        (["profile", ok, "--optimizer", "lion", *out], "--optimizer: expected one of"),
        (["profile", ok, "--split-at", "nothing*", *out], "--split-at"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_bad_input_is_one_line_exit_2_and_no_file(
    case: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args, expected = _bad_cases(tmp_path)[case]
    code, out, err = _run(args, capsys)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    assert lines[0].startswith("pipeplan: error: ")
    assert expected in lines[0]
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_console_script_reports_bad_input_without_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "planner.cli", "profile", str(MODELS / "raises_on_import.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "weights file ckpt.pt not found" in result.stderr
    assert list(tmp_path.iterdir()) == []  # the default profiles/ folder is not even created


def test_default_output_is_profiles_model_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, _ = _run(["profile", str(MODELS / "skip.py"), "-b", "1", "-q", *FAST], capsys)
    assert code == 0
    assert load_profile(tmp_path / "profiles" / "skip.json").num_layers == 6


def test_demo_profiles_a_bundled_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole chain: a profile, a plan made from it, a run of that plan that trains as
    one process does."""
    from planner.plan import Plan
    from planner.runtime.reference import train_single_process

    code, out, _ = _run(["demo", "--model", "mlp", "--out", str(tmp_path), "--json"], capsys)
    assert code == 0
    result = json.loads(out)
    files = result["files"]
    profile = load_profile(files["profile_path"])
    assert profile.model == "mlp" and profile.num_layers == 6
    plan = Plan.load(files["plan_path"])
    assert plan.profile.sha256 == sha256_file(files["profile_path"])
    assert plan.stages[-1].last == profile.num_layers - 1
    run = result["run"]
    assert run["world_size"] == len({d for s in plan.stages for d in s.devices})
    assert plan.predicted is not None
    assert run["predicted"]["iteration_ms"] == plan.predicted.iteration_ms
    assert run["steps"] == 6 and len(run["measured"]["step_ms"]) == 6
    ref = train_single_process(
        ROOT / "examples" / "mlp.py",
        steps=7,
        optimizer=profile.optimizer,
        batch_size=plan.microbatch_size * plan.num_microbatches,
    )  # fmt: skip (one warm-up step, then the six measured ones)
    assert run["losses"] == pytest.approx(ref.losses, rel=1e-5, abs=1e-6)  # fp32 rounding


@pytest.mark.parametrize("name", ["gpt", "mlp", "cnn"])
def test_bundled_profiles_are_current_and_state_their_device(name: str) -> None:
    profile = load_profile(ROOT / "profiles" / f"{name}.json")
    assert profile.source_sha256 == sha256_file(ROOT / "examples" / f"{name}.py"), (
        f"profiles/{name}.json is stale: re-run pipeplan profile examples/{name}.py"
    )
    assert profile.device == "cpu"
    assert (profile.settings.threads or 0) >= 1 and profile.meta["host"]["cpu_count"] >= 1
    assert len(profile.microbatch_sizes) >= 3


@pytest.mark.skipif(torch_cuda_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["profile", str(MODELS / "skip.py"), "--device", "cuda", "-o", str(tmp_path / "p.json")]
    code, _, err = _run(args, capsys)
    assert code == 2
    assert err == "pipeplan: error: --device: CUDA is not available on this machine\n"
    assert list(tmp_path.iterdir()) == []


def test_a_loss_that_fails_names_loss_fn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "src" / "pair.py"
    source.parent.mkdir()
    source.write_text(
        "import torch\n"
        "class Pair(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(3, 3)\n"
        "    def forward(self, x):\n"
        "        return self.fc(x), x\n"
        "def build_model():\n"
        "    return Pair()\n"
        "def sample_batch(n):\n"
        "    return torch.randn(n, 3), torch.randn(n, 3)\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = _run(["profile", str(source), "-o", str(out / "p.json")], capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert "loss_fn: loss_fn(..., ...) raised TypeError: the model returned tuple" in err
    assert list(out.iterdir()) == []
