"""The Python API as the contract writes it: paths, plain stage forms, and the exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner
from planner.errors import InputError
from planner.plan import StageSpec, as_stages

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "gpt.json"
TOPOLOGY = ROOT / "topologies" / "dgx1-v100.yaml"


def test_contract_names_are_exported() -> None:
    for name in ("load_profile", "load_topology", "solve", "simulate", "Plan"):
        assert callable(getattr(planner, name)), name


@pytest.mark.parametrize(
    "stages",
    [
        "0-2:gpu0;3-5:gpu3",
        [(0, 2, "gpu0"), (3, 5, ["gpu3"])],
        [((0, 2), ["gpu0"]), ((3, 5), ["gpu3"])],
        [{"layers": [0, 2], "devices": ["gpu0"]}, {"layers": [3, 5], "devices": ["gpu3"]}],
        [StageSpec(0, (0, 2), ["gpu0"]), StageSpec(1, (3, 5), ["gpu3"])],
    ],
)
def test_simulate_reads_every_stage_form_alike(stages: object) -> None:
    result = planner.simulate(
        str(PROFILE), str(TOPOLOGY), stages=stages, schedule="1f1b",
        num_microbatches=4, microbatch_size=2,
    )  # fmt: skip
    reference = planner.simulate(
        planner.load_profile(PROFILE),
        planner.load_topology(TOPOLOGY),
        stages=[StageSpec(0, (0, 2), ["gpu0"]), StageSpec(1, (3, 5), ["gpu3"])],
        schedule="1f1b",
        num_microbatches=4,
        microbatch_size=2,
    )
    assert result.iteration_ms == reference.iteration_ms
    assert result.memory_bytes == reference.memory_bytes


@pytest.mark.parametrize(
    "bad",
    [[], [(0, 2)], [(0, "2", "gpu0")], [(0, 2, "gpu0", "yes")], 42, [object()]],
)
def test_bad_stage_forms_name_the_stage(bad: object) -> None:
    with pytest.raises(InputError, match="stages"):
        as_stages(bad)


def test_solve_takes_paths_and_records_them(tmp_path: Path) -> None:
    plan = planner.solve(str(PROFILE), str(TOPOLOGY), num_microbatches=4, time_limit=10)
    assert plan.profile.path == str(PROFILE)
    assert plan.topology.path == str(TOPOLOGY)
    plan.save(tmp_path / "plan.json")
    again = planner.Plan.load(tmp_path / "plan.json")
    assert again.to_dict() == plan.to_dict()
    stages = json.loads((tmp_path / "plan.json").read_text())["stages"]
    rerun = planner.simulate(
        PROFILE, TOPOLOGY, stages=stages, schedule=plan.schedule.name,
        num_microbatches=plan.num_microbatches, microbatch_size=plan.microbatch_size,
    )  # fmt: skip
    assert plan.predicted is not None
    assert rerun.iteration_ms == pytest.approx(plan.predicted.iteration_ms)


def test_solve_rejects_two_different_microbatch_counts() -> None:
    with pytest.raises(InputError, match="num_microbatches"), pytest.deprecated_call():
        planner.solve(PROFILE, TOPOLOGY, microbatches=4, num_microbatches=8)


def test_solves_old_microbatches_keyword_still_works_with_a_deprecation_warning() -> None:
    with pytest.deprecated_call(match="use num_microbatches"):
        old = planner.solve(PROFILE, TOPOLOGY, microbatches=4, time_limit=10)
    new = planner.solve(PROFILE, TOPOLOGY, num_microbatches=4, time_limit=10)
    assert old.num_microbatches == 4
    assert old.shape == new.shape and old.predicted == new.predicted
