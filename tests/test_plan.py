"""The plan format: round trip, validation naming the field, the --stages shorthand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cost import synthetic_profile
from planner.errors import InputError
from planner.plan import Plan, parse_stages, stages_from_data, validate_stages
from planner.simulate import plan_from_result, simulate
from planner.topology import uniform_topology


def _plan(tmp_path: Path) -> Plan:
    prof = synthetic_profile(4)
    prof_path = tmp_path / "p.json"
    prof.save(prof_path)
    stages = parse_stages("0-1:gpu0;2-3:gpu1")
    result = simulate(prof, None, stages, "1f1b", 4)
    return plan_from_result(result, stages, profile_path=str(prof_path), topology_path=None)


def test_round_trip(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    out = tmp_path / "plan.json"
    plan.save(out)
    again = Plan.load(out)
    assert again.to_dict() == plan.to_dict()
    data = json.loads(out.read_text())
    assert data["schema"] == "pipeplan.plan/v1"
    assert data["solver"]["method"] == "manual"
    assert data["schedule"]["devices"]["gpu0"][:2] == ["F0.0", "SEND_F0.0->gpu1"]
    for key in (
        "iteration_ms",
        "samples_per_s",
        "bubble_fraction",
        "lower_bound_ms",
        "memory_bytes",
        "memory_limit_bytes",
    ):
        assert key in data["predicted"]
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(schema="x"), "schema"),
        (lambda d: d.update(num_microbatches=0), "num_microbatches"),
        (lambda d: d["stages"][1].update(layers=[1, 3]), "stages[1].layers"),
        (lambda d: d["stages"][0].update(devices="gpu0"), None),  # a single name is accepted
        (lambda d: d["stages"][0].update(devices=[3]), "stages[0].devices"),
        (lambda d: d.update(profile="p.json"), "profile"),
        (lambda d: d.update(schedule=[]), "schedule"),
    ],
)
def test_bad_plans_name_the_field(tmp_path: Path, mutate, field: str | None) -> None:  # type: ignore[no-untyped-def]
    data = _plan(tmp_path).to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    if field is None:
        Plan.load(path)
        return
    with pytest.raises(InputError) as info:
        Plan.load(path)
    assert field in info.value.one_line()
    assert "bad.json" in info.value.one_line()


def test_parse_stages_shorthand() -> None:
    stages = parse_stages("0-3:gpu0,gpu1; 4-7:gpu2;8:gpu3", recompute=[1])
    assert [s.layers for s in stages] == [(0, 3), (4, 7), (8, 8)]
    assert stages[0].devices == ["gpu0", "gpu1"]
    assert [s.recompute for s in stages] == [False, True, False]
    assert stages[0].replica(3) == "gpu1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected stages"),
        ("0-3", "at least one device"),
        ("a-b:gpu0", "FIRST-LAST"),
        ("0-3:", "at least one device"),
    ],
)
def test_parse_stages_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_stages(text)
    with pytest.raises(InputError, match="stage 5 does not exist"):
        parse_stages("0:a", recompute=[5])


def test_validate_stages_with_a_topology() -> None:
    topo = uniform_topology(2)
    validate_stages(parse_stages("0-1:gpu0;2-3:gpu1"), 4, topo)
    with pytest.raises(
        InputError, match=r"unknown device 'gpu7'; the topology has \['gpu0', 'gpu1'\]"
    ):
        validate_stages(parse_stages("0-1:gpu0;2-3:gpu7"), 4, topo)
    validate_stages(parse_stages("0:gpu0;1:gpu1;2:gpu0;3:gpu1"), 4, topo, allow_shared_devices=True)


def test_stages_from_data_checks_ids() -> None:
    with pytest.raises(InputError, match="stage ids 0, 1, 2"):
        stages_from_data([{"id": 1, "layers": [0, 1], "devices": ["a"]}])
