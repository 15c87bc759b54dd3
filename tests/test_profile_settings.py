"""Profile.settings: the settings later commands read, typed and checked, kept in meta."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.gpus import Efficiency, gpu_spec
from planner.profile import load_profile
from planner.profile.schema import profile_from_dict
from planner.profile.settings import AnalyticInfo, Calibration, ProfileSettings

ROOT = Path(__file__).resolve().parents[1]


def _mlp() -> dict:  # type: ignore[type-arg]
    data: dict = json.loads((ROOT / "profiles" / "mlp.json").read_text())  # type: ignore[type-arg]
    return data


def test_a_measured_profile_reads_its_settings_and_writes_meta_back_unchanged() -> None:
    data = _mlp()
    profile = profile_from_dict(copy.deepcopy(data), source="mlp.json")
    assert profile.settings.threads == 1 and profile.settings.clock == "thread_time"
    # Older than graph capture: read as captured with torch.fx (the one default).
    assert profile.settings.capture is None and profile.settings.capture_method == "fx"
    assert "threads" not in profile.meta and profile.meta["split_at"] is None  # null: a fact
    assert profile.to_dict()["meta"] == data["meta"]


def test_settings_round_trip_through_a_file(tmp_path: Path) -> None:
    settings = ProfileSettings(
        capture="export",
        split_at="blocks.*",
        threads=2,
        clock="perf_counter",
        timing="pass",
        batch_dependent=("1 (BatchNorm1d)",),
        analytic=AnalyticInfo(gpu_spec("h100-sxm"), Efficiency(matmul=0.6), layers_counted=3),
        calibrated=Calibration("1f1b", 2, {"0": [1.1, 0.9]}, 0.5),
    )
    profile = dataclasses.replace(load_profile(ROOT / "profiles" / "mlp.json"), settings=settings)
    profile.save(tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again.settings == settings
    assert again.settings.analytic is not None and again.settings.analytic.gpu.name == "h100-sxm"
    assert again.to_dict() == profile.to_dict()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("threads", 0, "expected an integer from 1 to 4,096, got 0"),
        ("capture", "trace", "expected one of fx, export, export-eval, got 'trace'"),
        ("timing", "wall", "expected one of layer, pass"),
        ("split_at", "a\nb", "without control characters"),
        ("batch_dependent", "bn", "expected a list"),
        ("analytic", {"gpu": {}}, "missing"),
        ("calibrated", {"stage_ratios": {}}, "missing"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_field(key: str, value: object, message: str) -> None:
    data = _mlp()
    data["meta"][key] = value
    with pytest.raises(InputError) as info:
        profile_from_dict(data, source="mlp.json")
    assert info.value.file == "mlp.json"
    assert info.value.field is not None and info.value.field.startswith(f"meta.{key}")
    assert message in info.value.message
