"""Tensor, sequence and sharded data parallelism in the simulator: closed forms computed by
hand, collectives on the group's real links, members mirroring their leader, refusals,
and properties (plain paths unchanged, more bandwidth never slower)."""

from __future__ import annotations

from planner.cost import synthetic_profile, synthetic_tensor_parallel
from planner.profile.schema import profile_from_dict

N = 8 * 2**20  # a block's b * s * h bytes


def test_synthetic_entries_are_megatrons_counts_and_read_back() -> None:
    base = synthetic_profile(4, output_bytes=N, param_bytes=4 * 2**20, saved_bytes=2**20)
    prof = synthetic_tensor_parallel(base, (2, 4), replicated=[3])
    assert prof.tensor_parallel is not None and prof.tensor_parallel.keys() == [
        "tp2",
        "tp2-sp",
        "tp4",
        "tp4-sp",
    ]
    block, head = prof.measurements[0].layers[0].sharded, prof.measurements[0].layers[3].sharded
    assert [c.op for c in block["tp4"].collectives] == ["all_reduce"] * 4
    assert [c.op for c in block["tp4-sp"].collectives] == ["all_gather", "reduce_scatter"] * 4
    assert block["tp4"].forward_ms == 0.25 and block["tp4"].output_bytes == N
    assert block["tp4-sp"].output_bytes == N // 4 and block["tp4"].saved_bytes == 2**18
    assert head["tp4"].collectives == () and head["tp4"].forward_ms == 1.0
    assert head["tp4-sp"].forward_ms == 0.25  # a replicated layer on 1 / t of the sequence
    assert prof.layers[0].sharded["tp2"].param_bytes == 2 * 2**20
    assert prof.layers[3].sharded["tp2"].param_bytes == 4 * 2**20
    assert profile_from_dict(prof.to_dict(), source="tp.json").to_dict() == prof.to_dict()
