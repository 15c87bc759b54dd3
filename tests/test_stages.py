"""The one stage type: frozen and hashable, replicas as tensor-parallel groups (parsed and
written, refused by everything that cannot simulate or run them yet)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner.cli import main
from planner.cost import synthetic_profile
from planner.errors import InputError
from planner.plan import FileRef, plan_from_simulation
from planner.shape import PlanShape
from planner.simulate import simulate, simulate_shape
from planner.stages import (
    StageSpec,
    as_stages,
    parse_stages,
    stages_from_data,
    validate_stages,
    with_parallelism,
)

TP_TEXT = "0-1:gpu0+gpu1,gpu2+gpu3;2-3:gpu4+gpu5"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0), capsys.readouterr().err


def test_a_stage_is_frozen_hashable_and_keeps_its_devices_as_a_tuple() -> None:
    stage = StageSpec(0, [0, 3], ["gpu0", "gpu1"])  # type: ignore[arg-type]
    assert stage.devices == ("gpu0", "gpu1") and stage.layers == (0, 3)
    assert stage == StageSpec(0, (0, 3), ("gpu0", "gpu1"))
    assert {stage: 1}[StageSpec(0, (0, 3), ("gpu0", "gpu1"))] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        stage.recompute = True  # type: ignore[misc]
    assert stage.with_recompute(True).recompute and not stage.recompute
    assert stage.with_recompute(False) is stage
    assert StageSpec(0, (0, 0), "gpu0").devices == ("gpu0",)  # type: ignore[arg-type]
    assert stage.replicas == 2 and stage.replica_groups == (("gpu0",), ("gpu1",))
    assert [stage.replica(k) for k in range(3)] == ["gpu0", "gpu1", "gpu0"]


def test_plus_joins_a_tensor_parallel_group() -> None:
    first, second = parse_stages(TP_TEXT, recompute=[1])
    assert first.devices == ("gpu0", "gpu1", "gpu2", "gpu3")
    assert first.tensor_parallel == 2 and first.replicas == 2
    assert first.replica_groups == (("gpu0", "gpu1"), ("gpu2", "gpu3"))
    assert second.replica_groups == (("gpu4", "gpu5"),) and second.recompute
    with pytest.raises(InputError, match="groups of one size"):
        parse_stages("0-1:gpu0+gpu1,gpu2")
    with pytest.raises(InputError, match="at least one device"):
        parse_stages("0-1:")
    # An empty member would silently be another degree ("gpu0+" a plain stage, "a++b" TP2).
    for text in ("0-1:gpu0,+", "0-1:gpu0+", "0-1:gpu0++gpu1", "0-1:gpu0,,gpu1"):
        with pytest.raises(InputError, match="a device name is empty"):
            parse_stages(text)


def test_tensor_parallel_is_written_only_where_it_is_not_one() -> None:
    plain = parse_stages("0-1:gpu0,gpu1")[0].to_dict()
    assert list(plain) == ["id", "layers", "devices", "recompute"]
    grouped = [s.to_dict() for s in parse_stages(TP_TEXT)]
    assert grouped[0]["tensor_parallel"] == 2 and grouped[0]["devices"] == [
        "gpu0",
        "gpu1",
        "gpu2",
        "gpu3",
    ]
    assert stages_from_data(grouped) == parse_stages(TP_TEXT)
    assert as_stages(grouped) == parse_stages(TP_TEXT)
    for bad in (0, 3, True, "2"):
        with pytest.raises(InputError) as info:
            stages_from_data([{**grouped[0], "tensor_parallel": bad}], source="s.json")
        assert info.value.field == "stages[0].tensor_parallel" and info.value.file == "s.json"


def test_sequence_parallel_and_sharding_are_written_only_where_they_are_set() -> None:
    stages = with_parallelism(parse_stages(TP_TEXT), sequence_parallel=True, sharding="zero1")
    first, second = (s.to_dict() for s in stages)
    assert first["sequence_parallel"] is True and first["sharding"] == "zero1"
    assert second["sequence_parallel"] is True and "sharding" not in second  # one replica
    assert stages_from_data([first, second]) == stages
    assert list(parse_stages("0:a,b")[0].to_dict()) == ["id", "layers", "devices", "recompute"]
    assert stages[0].describe() == "gpu0+gpu1,gpu2+gpu3 (sequence parallel, zero1)"
    for key, bad in (("sequence_parallel", "yes"), ("sharding", "zero3"), ("sharding", 1)):
        with pytest.raises(InputError) as info:
            stages_from_data([{**first, key: bad}], source="s.json")
        assert info.value.field == f"stages[0].{key}" and info.value.file == "s.json"


@pytest.mark.parametrize(
    ("stage", "field", "message"),
    [
        ({"sequence_parallel": True}, "sequence_parallel", "tensor_parallel of 2 or more"),
        ({"devices": ["a"], "sharding": "fsdp"}, "sharding", "has one"),
        (
            {"devices": ["a", "b"], "tensor_parallel": 2, "sharding": "zero1"},
            "sharding",
            "has one",
        ),
    ],
)
def test_options_a_stage_cannot_take_are_refused(
    stage: dict[str, object], field: str, message: str
) -> None:
    item = {"layers": [0, 1], "devices": ["a", "b"], **stage}
    with pytest.raises(InputError, match=message) as info:
        stages_from_data([item], source="s.json")
    assert info.value.field == f"stages[0].{field}"
    built = StageSpec(
        0,
        (0, 1),
        tuple(item["devices"]),
        **{  # type: ignore[arg-type]
            k: v for k, v in stage.items() if k != "devices"
        },
    )
    with pytest.raises(InputError, match=message):
        validate_stages([built], 2, None)


def test_boundary_pieces_reshard_along_the_sequence() -> None:
    """Each receiver gets its range once: from every sender it overlaps where the senders
    split the sequence, from one sender where they hold it whole; the first piece of each
    receiver carries the values that are not split."""
    from fractions import Fraction as F

    from planner.stages import boundary_peers, boundary_pieces

    def pieces(a: str, b: str, split: tuple[bool, bool]) -> list[tuple[str, str, str, bool]]:
        out = boundary_pieces(tuple(a), tuple(b), split=split)
        return [(p.sender, p.receiver, f"{p.start}-{p.stop}", p.first) for p in out]

    assert pieces("ab", "c", (True, False)) == [
        ("a", "c", "0-1/2", True),
        ("b", "c", "1/2-1", False),
    ]
    assert pieces("c", "ab", (False, True)) == [
        ("c", "a", "0-1/2", True),
        ("c", "b", "1/2-1", True),
    ]
    assert pieces("ab", "cdef", (True, True)) == [
        ("a", "c", "0-1/4", True), ("a", "d", "1/4-1/2", True),
        ("b", "e", "1/2-3/4", True), ("b", "f", "3/4-1", True),
    ]  # fmt: skip
    assert pieces("abcd", "ef", (True, True)) == [
        ("a", "e", "0-1/4", True), ("b", "e", "1/4-1/2", False),
        ("c", "f", "1/2-3/4", True), ("d", "f", "3/4-1", False),
    ]  # fmt: skip
    for a, b in (("ab", "c"), ("c", "ab"), ("ab", "cdef"), ("abc", "de")):
        whole = boundary_pieces(tuple(a), tuple(b), split=(False, False))
        assert [(p.sender, p.receiver) for p in whole] == boundary_peers(tuple(a), tuple(b))
        for split in ((True, False), (False, True), (True, True), (False, False)):
            got = boundary_pieces(tuple(a), tuple(b), split=split)
            for j, r in enumerate(b):
                mine = [p for p in got if p.receiver == r]
                need = (F(j, len(b)), F(j + 1, len(b))) if split[1] else (F(0), F(1))
                assert mine[0].start == need[0] and mine[-1].stop == need[1]
                assert all(p.stop == q.start for p, q in zip(mine, mine[1:], strict=False))
                assert [p.first for p in mine] == [True] + [False] * (len(mine) - 1)


def test_groups_line_up_from_stage_to_stage() -> None:
    validate_stages(parse_stages(TP_TEXT), 4, None)  # simulated now: no refusal here
    validate_stages(parse_stages("0-1:a+b;2-3:c"), 4, None)  # mixed degrees, replicated
    validate_stages(parse_stages("0-1:a;2-3:b+c,d+e"), 4, None)
    sp = with_parallelism(parse_stages("0-1:a+b"), sequence_parallel=True)
    second = StageSpec(1, (2, 3), ("c", "d"), tensor_parallel=2)
    with pytest.raises(InputError, match="stage 0 .tensor_parallel 2 with sequence par") as info:
        validate_stages([*sp, second], 4, None)
    assert info.value.field == "stages[1].sequence_parallel"
    assert "stage 1 (tensor_parallel 2) differ in sequence parallelism" in str(info.value)
    wide = StageSpec(1, (2, 3), ("c", "d", "e", "f"), tensor_parallel=4, sequence_parallel=True)
    validate_stages([*sp, wide], 4, None)  # resharded along the sequence (boundary_pieces)
    validate_stages([*sp, StageSpec(1, (2, 3), ("c",))], 4, None)
    third = StageSpec(2, (3, 3), ("d", "e"), tensor_parallel=2)
    with pytest.raises(InputError, match="differ in sequence parallelism") as info:
        validate_stages([sp[0], StageSpec(1, (2, 2), ("c",)), third], 4, None)
    assert info.value.field == "stages[2].sequence_parallel"
    interleaved = parse_stages("0:a+b;1:c+d;2:a+b;3:c+d")
    validate_stages(interleaved, 4, None, allow_shared_devices=True)
    with pytest.raises(InputError, match="keeps its tensor-parallel group") as info:
        validate_stages(parse_stages("0:a+b;1:c+d;2:b+a;3:c+d"), 4, None, allow_shared_devices=True)
    assert info.value.field == "stages[2].devices"


def test_the_flags_apply_to_every_stage_that_can_take_them() -> None:
    mixed = parse_stages("0-1:a,b;2-3:c")
    assert [s.sharding for s in with_parallelism(mixed, sharding="fsdp")] == ["fsdp", "none"]
    with pytest.raises(InputError, match="no stage is tensor parallel") as info:
        with_parallelism(mixed, sequence_parallel=True)
    assert info.value.field == "--sequence-parallel"
    with pytest.raises(InputError, match="nothing to shard") as info:
        with_parallelism(parse_stages("0:a;1:b"), sharding="zero1")
    assert info.value.field == "--sharding"
    with pytest.raises(InputError, match="expected one of none, zero1, fsdp"):
        with_parallelism(mixed, sharding="zero2")
    zero = with_parallelism(mixed, sharding="zero1")
    assert [s.sharding for s in with_parallelism(zero, sharding="none")] == ["none", "none"]
    assert with_parallelism(zero) == zero


def test_a_plan_shape_is_hashable_and_a_plan_exposes_its_own(tmp_path: Path) -> None:
    stages = parse_stages("0-1:gpu0,gpu1;2-3:gpu2")
    shape = PlanShape(stages, "1f1b", 2, 4)  # type: ignore[arg-type]
    assert shape.stages == tuple(stages) and shape.samples == 8 and shape.devices_used == 3
    assert {shape: 1}[PlanShape(tuple(parse_stages("0-1:gpu0,gpu1;2-3:gpu2")), "1f1b", 2, 4)]
    marked = shape.with_recompute([False, True])
    assert [s.recompute for s in marked.stages] == [False, True] and marked != shape
    profile = synthetic_profile(4, microbatch_size=2)
    result = simulate_shape(profile, None, shape)
    assert result.iteration_ms == simulate(profile, None, stages, "1f1b", 4, 2).iteration_ms
    plan = plan_from_simulation(
        result, stages, profile=FileRef.in_memory({}), topology=FileRef(None)
    )
    assert plan.shape == shape
