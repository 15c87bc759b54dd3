"""An analytic profile downstream (issue 21): solve, show, export and run take it as they
take a measured one, and run's report says that the prediction it checks was analytic."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planner.cli import main
from planner.profile import load_profile
from planner.profile.analytic import analytic_profile
from planner.profile.settings import Calibration
from planner.runtime.report import RunReport, note_prediction_source

ROOT = Path(__file__).resolve().parents[1]

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


def _report() -> RunReport:
    return RunReport(
        "1f1b", "cpu", "gloo", 2, False, {}, 2, 1, 2, 4, 10.0, [10.0], 5.0, [1.0], {}, "rss", {}
    )


def _ok(args: list[str]) -> None:
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code, args


def test_the_report_says_where_the_prediction_came_from(tmp_path: Path) -> None:
    analytic = analytic_profile(ROOT / "examples" / "mlp.py", [2], gpu="h100-sxm")
    report = _report()
    note_prediction_source(report, analytic)
    assert report.prediction_source == "analytic (h100-sxm)"
    assert report.to_dict()["predicted"]["from"] == "analytic (h100-sxm)"
    assert any("analytic" in note and "roofline of h100-sxm" in note for note in report.notes)
    measured = _report()
    note_prediction_source(measured, load_profile(ROOT / "profiles" / "mlp.json"))
    assert measured.prediction_source == "measured" and not measured.notes
    analytic.settings = dataclasses.replace(
        analytic.settings, calibrated=Calibration("1f1b", 1, {}, 0.0)
    )
    calibrated = _report()
    note_prediction_source(calibrated, analytic)
    assert calibrated.prediction_source == "analytic (h100-sxm), calibrated by a run"


def test_solve_show_export_and_run_take_an_analytic_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny.py"
    model.write_text(TINY)
    profile, plan = tmp_path / "tiny.json", tmp_path / "plan.json"
    analytic_profile(model, [2], gpu="cpu").save(profile)
    _ok(["solve", "--profile", str(profile), "--topology", str(ROOT / "topologies" / "cpu.yaml"),
         "--microbatches", "4", "--schedule", "1f1b", "-o", str(plan)])  # fmt: skip
    _ok(["show", str(plan)])
    _ok(["export", str(plan), "--to", "torch", "--model", str(model), "-o", str(tmp_path / "x")])
    assert (tmp_path / "x").is_dir()
    capsys.readouterr()
    done = subprocess.run(
        [sys.executable, "-m", "planner.cli", "run", str(plan), "--model", str(model),
         "--steps", "2", "--warmup", "1", "--timeout", "120", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["predicted"]["from"] == "analytic (cpu)"
    assert any("the prediction is analytic" in note for note in report["notes"])
    assert report["measured"]["iteration_ms"] > 0
