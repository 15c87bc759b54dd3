"""InputError's one line and naming_file: a check that runs where the file is not known."""

from __future__ import annotations

import pytest

from planner.errors import InputError, naming_file


def test_naming_file_names_the_source_of_a_stage_error_that_names_none() -> None:
    with pytest.raises(InputError) as info, naming_file("plan.json"):
        raise InputError("a degree of 4 does not divide 2 heads", field="stages[0].tensor_parallel")
    assert info.value.one_line() == (
        "plan.json: stages[0].tensor_parallel: a degree of 4 does not divide 2 heads"
    )


def test_naming_file_leaves_other_errors_as_they_are() -> None:
    with pytest.raises(InputError) as info, naming_file("plan.json"):
        raise InputError("expected a name", file="model.py", field="stages[0]")
    assert info.value.one_line() == "model.py: stages[0]: expected a name"
    with pytest.raises(InputError) as info, naming_file("plan.json"):
        raise InputError("expected a positive integer", field="--steps")
    assert info.value.one_line() == "--steps: expected a positive integer"
