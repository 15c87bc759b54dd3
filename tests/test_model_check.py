"""One check of a model file against its plan's profile, with one set of messages, for run
and export (planner.profile.model_check)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.export import check_model
from planner.export.source import load_export_source
from planner.plan import FileRef, parse_stages, plan_from_simulation
from planner.profile import load_profile
from planner.profile.loader import load_model_file
from planner.profile.model_check import ProfiledSplit, check_source, check_split
from planner.profile.split import capture_model
from planner.runtime.runner import check_plan
from planner.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
MLP_PROFILE = ROOT / "profiles" / "mlp.json"
MLP = ROOT / "examples" / "mlp.py"


@pytest.fixture
def plan_path(tmp_path: Path) -> Path:
    """A plan of profiles/mlp.json (its 6 layers on two CPU processes)."""
    profile = load_profile(MLP_PROFILE)
    stages = parse_stages("0-2:cpu0;3-5:cpu1")
    result = simulate(profile, None, stages, "1f1b", 4, profile.microbatch_sizes[0])
    plan = plan_from_simulation(
        result, stages, profile=FileRef.of_file(MLP_PROFILE), topology=FileRef(None)
    )
    path = tmp_path / "plan.json"
    plan.save(path)
    return path


def test_run_and_export_refuse_another_model_with_the_same_line(
    plan_path: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other.py"
    other.write_text(MLP.read_text() + "\n# edited after profiling\n")
    source = load_export_source(plan_path)
    with pytest.raises(InputError) as run_error:
        check_plan(source.plan, other, str(plan_path))
    with pytest.raises(InputError) as export_error:
        check_model(source, other)
    line = run_error.value.one_line()
    assert line == export_error.value.one_line()
    assert "not the one profiled" in line and "other.py" in line
    assert run_error.value.field == "source_sha256"


def test_the_profiled_model_passes_and_a_split_that_differs_is_named() -> None:
    profile = load_profile(MLP_PROFILE)
    expected = ProfiledSplit.of(profile)
    assert expected.capture == "fx" and expected.layer_names == tuple(
        layer.name for layer in profile.layers
    )
    user = load_model_file(MLP)
    check_source(str(MLP), user.source_sha256, profile)
    inputs, _ = user.batch(2)
    split = capture_model(user.build(), inputs, expected.split_at, capture=expected.capture)
    check_split(split, expected, model="mlp.py", covered=6)
    with pytest.raises(InputError, match="the plan's stages cover 4 layers") as info:
        check_split(split, expected, model="mlp.py", covered=4)
    assert (info.value.file, info.value.field) == ("mlp.py", "stages")
    renamed = ProfiledSplit("fx", None, ("a", *expected.layer_names[1:]))
    with pytest.raises(InputError, match="splits into 6 layers") as info:
        check_split(split, renamed, model="mlp.py", covered=6)
    assert info.value.field == "layers" and "profile has 6 ['a'" in info.value.message
    # Without the profile (not found): only the plan's layer count is checked.
    check_split(split, ProfiledSplit(), model="mlp.py", covered=6)


def test_export_checks_the_layers_the_plan_covers(plan_path: Path, tmp_path: Path) -> None:
    """export's check is run's: a model.py that is the profiled one passes, and the layer
    names come from the same profile."""
    copy = tmp_path / "mlp.py"
    shutil.copy(MLP, copy)
    assert check_model(load_export_source(plan_path), copy) == str(copy.resolve())
