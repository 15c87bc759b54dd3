"""The profile's tensor-parallel entries: read, written back unchanged, refused when
inconsistent (planner.profile.sharding, planner.profile.schema)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from planner.errors import InputError
from planner.profile.schema import profile_from_dict
from planner.profile.sharding import Collective, parse_shard_key, shard_key

ROOT = Path(__file__).resolve().parents[1]


def _with_tp(degrees: tuple[int, ...] = (2,), sp: bool = True) -> dict[str, Any]:
    """profiles/mlp.json with tensor-parallel entries: every shard half the layer's costs,
    one all-reduce of its output per pass (Megatron's count for a row-parallel pair)."""
    data = json.loads((ROOT / "profiles" / "mlp.json").read_text())
    data["precision"] = "fp32"  # written back explicitly
    data["tensor_parallel"] = {
        "degrees": list(degrees),
        "sequence_parallel": sp,
        "plan_source": "tp_plan",
    }
    for layer in data["layers"]:
        layer["sharded"] = {
            shard_key(t): {
                "param_count": layer["param_count"] // t,
                "param_bytes": layer["param_bytes"] // t,
                "optimizer_state_bytes": layer["optimizer_state_bytes"] // t,
            }
            for t in degrees
        }
    for m in data["measurements"]:
        for t in m["layers"]:
            out = t["output_bytes"]
            entries = {}
            for deg in degrees:
                for seq in (False, True) if sp else (False,):
                    ops = ["reduce_scatter", "all_gather"] if seq else ["all_reduce"]
                    entries[shard_key(deg, sequence_parallel=seq)] = {
                        "forward_ms": t["forward_ms"] / deg,
                        "backward_ms": t["backward_ms"] / deg,
                        "backward_input_ms": t["backward_input_ms"] / deg,
                        "backward_weight_ms": t["backward_weight_ms"] / deg,
                        "output_bytes": out // deg if seq else out,
                        "saved_bytes": t["saved_bytes"] // deg,
                        "collectives": [
                            {"op": op, "bytes": out, "phase": phase}
                            for phase in ("forward", "backward")
                            for op in ops
                        ],
                    }
            t["sharded"] = entries
    return data


def test_tensor_parallel_entries_read_and_write_back_unchanged() -> None:
    data = _with_tp((2, 4))
    profile = profile_from_dict(copy.deepcopy(data), source="tp.json")
    assert profile.tensor_parallel is not None
    assert profile.tensor_parallel.keys() == ["tp2", "tp2-sp", "tp4", "tp4-sp"]
    shard = profile.measurements[0].layers[0].sharded["tp4-sp"]
    out = data["measurements"][0]["layers"][0]["output_bytes"]
    assert shard.output_bytes == out // 4
    assert shard.collective_bytes("forward") == 2 * out  # a reduce-scatter and an all-gather
    assert profile.layers[0].sharded["tp2"].param_bytes == data["layers"][0]["param_bytes"] // 2
    assert json.loads(json.dumps(profile.to_dict())) == json.loads(json.dumps(data))


def test_a_profile_without_entries_writes_none() -> None:
    data = json.loads((ROOT / "profiles" / "mlp.json").read_text())
    out = profile_from_dict(copy.deepcopy(data), source="mlp.json").to_dict()
    assert "tensor_parallel" not in out and "sharded" not in out["layers"][0]
    assert "sharded" not in out["measurements"][0]["layers"][0]


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (lambda d: d.pop("tensor_parallel"), "tensor_parallel", "missing"),
        (
            lambda d: d["layers"][1]["sharded"].pop("tp2"),
            "layers[1].sharded",
            r"expected entries \['tp2'\]",
        ),
        (
            lambda d: d["measurements"][0]["layers"][2]["sharded"].pop("tp2-sp"),
            "measurements[0].layers[2].sharded",
            "expected entries",
        ),
        (
            lambda d: d["layers"][0]["sharded"].update({"tp2-sp": {}}),
            "layers[0].sharded.tp2-sp",
            "expected a key like 'tp2'",
        ),
        (
            lambda d: d["measurements"][0]["layers"][0]["sharded"]["tp2"]["collectives"][0].update(
                op="broadcast"
            ),
            "measurements[0].layers[0].sharded.tp2.collectives[0].op",
            "expected one of all_reduce",
        ),
        (
            lambda d: d["tensor_parallel"].update(degrees=[1]),
            "tensor_parallel.degrees",
            "from 2 to",
        ),
        (
            lambda d: d["measurements"][0]["layers"][0]["sharded"]["tp2"].update(flops=1),
            "measurements[0].layers[0].sharded.tp2.flops",
            "unknown field",
        ),
    ],
)
def test_inconsistent_entries_are_refused_naming_the_field(
    change: Any, field: str, message: str
) -> None:
    data = _with_tp()
    change(data)
    with pytest.raises(InputError, match=message) as err:
        profile_from_dict(data, source="tp.json")
    assert err.value.field == field and err.value.file == "tp.json"


def test_keys_and_ring_bytes() -> None:
    assert parse_shard_key(shard_key(8, sequence_parallel=True)) == (8, True)
    assert [parse_shard_key(k) for k in ("tp1", "tp", "tpx", "tp2-sp-sp", "2")] == [None] * 5
    # A ring over t ranks: an all-reduce moves 2 (t - 1) / t of the tensor, the others half.
    assert Collective("all_reduce", 800, "forward").ring_bytes(8) == 1400
    assert Collective("all_gather", 800, "forward").ring_bytes(8) == 700
    assert Collective("reduce_scatter", 800, "backward").ring_bytes(2) == 400
