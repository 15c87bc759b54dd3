"""The profile format: round trip, validation, and the bytes that cross a cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.profile import Layer, LayerTiming, Measurement, Profile, load_profile


def _profile(edges: list[tuple[int, int]] | None = None) -> Profile:
    layers = [Layer(f"l{i}", 10 * i, 40 * i, 80 * i) for i in range(4)]
    timings = [LayerTiming(1.0 + i, 2.0, 1.0, 1.0, 100 * (i + 1), 50) for i in range(4)]
    return Profile("toy", layers, [Measurement(2, 64, timings)], edges=edges)


def test_round_trip(tmp_path: Path) -> None:
    original = _profile(edges=[(0, 1), (0, 2), (1, 3), (2, 3)])
    path = tmp_path / "p.json"
    original.save(path)
    loaded = load_profile(path)
    assert loaded.to_dict() == original.to_dict()
    assert not list(tmp_path.glob("*.tmp"))


def test_cut_bytes_chain_and_dag() -> None:
    chain = _profile()
    assert [chain.cut_bytes(2, i) for i in range(3)] == [100, 200, 300]
    dag = _profile(edges=[(0, 1), (0, 2), (1, 3), (2, 3)])
    # After layer 1 both layer 0's output (to 2) and layer 1's output (to 3) cross.
    assert dag.cut_bytes(2, 1) == 100 + 200
    assert dag.cut_bytes(2, 0) == 100


def test_unprofiled_microbatch_size_is_named() -> None:
    with pytest.raises(InputError, match=r"profiled sizes are \[2\]"):
        _profile().measurement(3)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(schema="nope"), "schema"),
        (lambda d: d["layers"][1].pop("param_bytes"), "layers[1].param_bytes"),
        (lambda d: d["measurements"][0]["layers"][2].update(forward_ms=-1), "forward_ms"),
        (lambda d: d["measurements"][0]["layers"].pop(), "measurements[0].layers"),
        (lambda d: d.update(edges=[[2, 1]]), "edges[0]"),
        (lambda d: d["measurements"][0]["layers"][1].update(mean={"fwd": 1.0}), "mean.fwd"),
        (lambda d: d["measurements"][0]["layers"][1].update(mean={"forward_ms": -1}), "mean"),
        (
            lambda d: d["measurements"][0]["layers"][1].update(spread={"forward_ms": [0.5]}),
            "spread",
        ),
        (lambda d: d["measurements"][0]["layers"][1].update(spread={"forward_ms": []}), "spread"),
        (
            lambda d: d["measurements"][0]["layers"][1].update(spread={"forward_ms": [0.9, 0.1]}),
            "layers[1].spread.forward_ms",
        ),
    ],
)
def test_bad_profiles_name_the_field(tmp_path: Path, mutate, field: str) -> None:  # type: ignore[no-untyped-def]
    data = _profile().to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert field in info.value.one_line()
    assert str(path) in info.value.one_line()


def _measured(tmp_path: Path, edit: dict[str, float]) -> LayerTiming:
    """Layer 0 of a file holding forward median 1.0 (quartiles 0.9-1.3) and mean 1.2,
    its fields changed by ``edit``, as read back."""
    data = _profile().to_dict()
    entry = data["measurements"][0]["layers"][0]
    entry.update(forward_ms=1.0, spread={"forward_ms": [0.9, 1.3]}, mean={"forward_ms": 1.2})
    entry.update(edit)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return load_profile(path).measurements[0].layers[0]


def test_the_planner_reads_the_mean_and_the_file_keeps_the_median(tmp_path: Path) -> None:
    t = _measured(tmp_path, {})
    assert t.forward_ms == 1.2 and t.median == {"forward_ms": 1.0}
    assert t.backward_ms == 2.0  # no mean: the field as written
    written = t.to_dict()
    assert written["forward_ms"] == 1.0 and written["mean"] == {"forward_ms": 1.2}


def test_a_median_edited_outside_its_spread_is_used_as_written(tmp_path: Path) -> None:
    """A measured median lies between its quartiles; one outside them was edited by hand."""
    t = _measured(tmp_path, {"forward_ms": 5.0})
    assert t.forward_ms == 5.0 and t.median == {}
    assert "mean" not in t.to_dict() and "forward_ms" not in t.spread  # not measured around 5
    assert _measured(tmp_path, {"forward_ms": 1.3}).forward_ms == 1.2  # at the quartile: measured
