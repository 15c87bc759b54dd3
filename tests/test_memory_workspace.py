"""CUDA profiles' transient memory in the cost model and the simulator, by hand.

A CUDA profile records, per layer, the workspace of its forward or backward beyond what
is held (``workspace_bytes``) and the temporaries of its optimizer step
(``optimizer_workspace_bytes``). CPU profiles have neither, and their numbers must not move.
"""

from __future__ import annotations

from families import FLUSHED
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import (
    stage_memory_bytes,
    stage_step_workspace_bytes,
    stage_workspace_bytes,
)
from planner.plan import parse_stages
from planner.profile.schema import Layer, LayerTiming, Measurement, Profile
from planner.simulate import simulate

STAGES3 = "0-1:a;2-3:b;4-5:c"


def _profile(workspace: list[int], step_workspace: list[int]) -> Profile:
    """tests/test_simulate.py's six hand-sized layers, with transient memory added."""
    params = [100, 200, 300, 400, 500, 600]
    layers = [
        Layer(f"l{i}", p // 4, p, 2 * p, optimizer_workspace_bytes=w)
        for i, (p, w) in enumerate(zip(params, step_workspace, strict=True))
    ]
    saved = [10, 20, 30, 40, 50, 60]
    timings = [
        LayerTiming(1.0, 2.0, 1.0, 1.0, 7 * (i + 1), saved[i], workspace_bytes=workspace[i])
        for i in range(6)
    ]
    return Profile("hand", layers, [Measurement(1, 5, timings)])


def test_workspace_comes_on_top_of_the_stash() -> None:
    prof = _profile([5, 9, 0, 4, 50, 3], [0] * 6)
    assert [stage_workspace_bytes(prof, f, f + 1, 1) for f in (0, 2, 4)] == [9, 4, 50]
    result = simulate(prof, None, parse_stages(STAGES3), "1f1b", 6)
    # tests/test_simulate.py's 1F1B numbers plus each stage's largest layer workspace.
    assert result.memory_bytes == {
        "a": 1200 + 3 * 30 + 9,
        "b": 2800 + 2 * 70 + 4,
        "c": 4400 + 110 + 50,
    }
    for s, (first, last) in enumerate([(0, 1), (2, 3), (4, 5)]):
        assert result.memory_bytes["abc"[s]] == stage_memory_bytes(prof, first, last, 1, 3 - s)


def test_step_temporaries_count_where_they_exceed_the_activations() -> None:
    # Stage a: step temporaries 30 + 200 = 230 > 90 activations; b: 10 < 140; c: none.
    prof = _profile([0] * 6, [30, 200, 0, 10, 0, 0])
    assert stage_step_workspace_bytes(prof, 0, 1) == 230
    result = simulate(prof, None, parse_stages(STAGES3), "1f1b", 6)
    assert result.memory_bytes == {"a": 1200 + 230, "b": 2800 + 2 * 70, "c": 4400 + 110}
    assert stage_memory_bytes(prof, 0, 1, 1, 3) == 1200 + 230
    assert stage_memory_bytes(prof, 2, 3, 1, 2) == 2800 + 140
    # The timeline shows the step's peak while STEP runs, and the level after it.
    timeline = result.memory_timeline["a"]
    assert max(level for _, level in timeline) == 1200 + 230
    assert timeline[-1][1] == 1200
    # Without a flush (2bw) the step runs beside the stash: both count.
    assert stage_memory_bytes(prof, 0, 1, 1, 3, weight_versions=2) == 1500 + 90 + 230


def test_a_replicated_stage_pays_the_step_on_every_replica() -> None:
    prof = _profile([0] * 6, [400, 0, 0, 0, 0, 0])
    result = simulate(prof, None, parse_stages("0-1:a,b;2-5:c"), "1f1b", 4)
    assert result.memory_bytes["a"] == result.memory_bytes["b"] == 1200 + 400


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(FLUSHED),
    st.lists(st.integers(0, 10**6), min_size=6, max_size=6),
    st.lists(st.integers(0, 10**6), min_size=6, max_size=6),
)
def test_simulator_and_cost_model_agree(
    schedule: str, workspace: list[int], step_workspace: list[int]
) -> None:
    """For the flush schedules the simulator's peak is the cost model's at the stage's
    largest in-flight count (read off the same schedule without transient memory)."""
    stages = parse_stages(STAGES3)
    bare = simulate(_profile([0] * 6, [0] * 6), None, stages, schedule, 6)
    prof = _profile(workspace, step_workspace)
    result = simulate(prof, None, stages, schedule, 6)
    for s, (first, last) in enumerate([(0, 1), (2, 3), (4, 5)]):
        dev = "abc"[s]
        stash = sum([10, 20, 30, 40, 50, 60][first : last + 1])
        held, rest = divmod(bare.memory_bytes[dev] - bare.static_bytes[dev], stash)
        assert rest == 0
        assert result.memory_bytes[dev] == stage_memory_bytes(prof, first, last, 1, held)


def test_profiles_without_transient_memory_are_unchanged() -> None:
    with_zeros = _profile([0] * 6, [0] * 6)
    result = simulate(with_zeros, None, parse_stages(STAGES3), "1f1b", 6)
    assert result.memory_bytes == {"a": 1200 + 3 * 30, "b": 2800 + 2 * 70, "c": 4400 + 110}
