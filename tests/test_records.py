"""planner.records: the one reader of every file (field types say how each field is read)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

import pytest

from planner.errors import InputError
from planner.records import (
    EMPTY_IS_NONE,
    Default,
    Integer,
    Keys,
    Length,
    Milliseconds,
    Name,
    OneOf,
    read_record,
    read_value,
    record_dict,
)


@dataclass(frozen=True)
class Inner:
    kind: Annotated[str, OneOf(("a", "b"))]
    size: Annotated[int, Integer(1, 10)] = 1


@dataclass
class Outer:
    UNKNOWN_HINT: ClassVar[str] = "a newer file?"

    name: Name
    items: Annotated[list[Inner], Length(1, 3, "item")]
    pair: tuple[int, int]
    time_ms: Milliseconds | None  # required, null allowed
    tags: Annotated[dict[str, int], Keys(OneOf(("x", "y")))] = field(default_factory=dict)
    count: Annotated[int, Integer(0), Default(7)] = 0
    note: str = "none"
    part: Annotated[Inner | None, EMPTY_IS_NONE] = None


@dataclass
class Open:
    value: float
    extra: dict[str, Any] = field(default_factory=dict)


GOOD = {"name": "n", "items": [{"kind": "a"}], "pair": [1, 2], "time_ms": None}


def _refused(data: Any, cls: type = Outer) -> InputError:
    with pytest.raises(InputError) as info:
        read_record(cls, data, file="f.json")
    assert info.value.file == "f.json"
    return info.value


def test_a_record_reads_its_fields_with_their_defaults() -> None:
    got = read_record(Outer, {**GOOD, "note": None, "part": {}}, file="f.json")
    assert got == Outer("n", [Inner("a", 1)], (1, 2), None, count=7)
    got = read_record(Outer, {**GOOD, "count": 3, "time_ms": 2, "part": {"kind": "b"}}, file=None)
    assert got.count == 3 and got.time_ms == 2.0 and got.part == Inner("b")


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"colour": 1}, "colour", "unknown field; expected one of count, items, name"),
        ({"colour": 1}, "colour", "(a newer file?)"),
        ({"items": []}, "items", "expected at least one item"),
        ({"items": [{"kind": "a"}] * 4}, "items", "4 entries; expected at most 3"),
        ({"items": [{"kind": "a"}, {"kind": "c"}]}, "items[1].kind", "expected one of a, b"),
        ({"items": [{"kind": "a", "size": 11}]}, "items[0].size", "from 1 to 10, got 11"),
        ({"pair": [1]}, "pair", "expected [a, b] (2 entries), got [1]"),
        ({"pair": [1, "2"]}, "pair[1]", "expected an integer, got '2'"),
        ({"time_ms": -1}, "time_ms", "expected a finite number from 0 to 1e+09, got -1"),
        ({"tags": {"z": 1}}, "tags.z", "expected one of x, y, got 'z'"),
        ({"tags": {"x": "1"}}, "tags.x", "expected an integer, got '1'"),
        ({"name": "a\x1b[31m"}, "name", "without control characters"),
        ({"part": {"size": 2}}, "part.kind", "missing; expected one of a, b"),
    ],
)
def test_each_problem_names_the_field_and_what_was_expected(
    change: dict[str, Any], field: str, message: str
) -> None:
    error = _refused({**GOOD, **change})
    assert error.field == field and message in error.message


def test_a_required_field_may_be_null_only_where_its_type_allows() -> None:
    assert _refused({k: v for k, v in GOOD.items() if k != "time_ms"}).message == (
        "missing; expected a finite number from 0 to 1e+09 (or null)"
    )
    assert _refused({**GOOD, "name": None}).field == "name"
    assert _refused([GOOD]).message.startswith("expected an object {name, items, pair, time_ms")


def test_unknown_keys_are_kept_where_a_record_has_extra() -> None:
    got = read_record(Open, {"value": 1, "newer": {"a": 1}}, file=None)
    assert got.extra == {"newer": {"a": 1}} and got.value == 1
    assert record_dict(got) == {"value": 1, "newer": {"a": 1}}


def test_record_dict_is_what_read_record_reads_back() -> None:
    outer = read_record(Outer, {**GOOD, "part": {"kind": "b"}, "tags": {"x": 1}}, file=None)
    text = json.dumps(record_dict(outer))
    assert read_record(Outer, json.loads(text), file=None) == outer
    assert read_value(list[Inner], [{"kind": "a"}], file=None, field="l") == [Inner("a")]
