"""bench/scaling_on_paper.py's PTD-P part: Megatron's published configuration as a plan and
the paper's FLOP count (no profile, no simulation: those are the benchmark's)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import scaling_on_paper as sop  # noqa: E402

from planner.stages import validate_stages  # noqa: E402


def _row(name: str) -> sop.PtdpRow:
    return next(r for r in sop.PTDP_ROWS if r.name == name)


def test_the_rows_are_the_papers_configurations() -> None:
    """TP x PP x DP is the GPU count, the batch splits into whole microbatches per data
    replica, and interleaving divides the layers (and the microbatches, as Megatron needs)."""
    for row in sop.PTDP_ROWS:
        assert row.tp * row.pp * row.data_parallel == row.gpus, row.name
        per_replica, rest = divmod(row.batch // row.microbatch, row.data_parallel)
        assert rest == 0 and row.batch % row.microbatch == 0, row.name
        assert row.layers % (row.pp * row.virtual_stages) == 0, row.name
        if row.virtual_stages > 1:
            assert per_replica % row.pp == 0, row.name
    assert [r.virtual_stages for r in sop.PTDP_ROWS if r.schedule == "interleaved"] == [3, 2, 2, 3]


def test_megatron_shape_places_tp_inside_nodes_and_interleaves_chunks() -> None:
    row = _row("145.6B")
    topo = sop.dgx_cluster(sop.PTDP_PRESET, row.gpus)
    shape = sop.megatron_shape(row, topo)
    stages = shape.stages
    assert len(stages) == row.pp * row.virtual_stages == 16
    validate_stages(list(stages), row.layers + 2, topo, allow_shared_devices=True)
    # Five blocks per chunk; the embedding (layer 0) first, the head (layer 81) last.
    assert stages[0].layers == (0, 5) and stages[1].layers == (6, 10)
    assert stages[-1].layers == (76, 81)
    for k, st in enumerate(stages):
        assert st.recompute and st.tensor_parallel == 8 and st.replicas == row.data_parallel
        assert st.devices == stages[k % row.pp].devices  # chunk k on pipeline rank k mod pp
        for group in st.replica_groups:
            assert len({topo.device(d).host for d in group}) == 1
    assert shape.schedule == "interleaved" and shape.virtual_stages == 2
    assert shape.samples == row.batch and shape.microbatch_size == row.microbatch


def test_equation_3_counts_forward_backward_and_recompute() -> None:
    """96 B s l h^2 (...) = 4 passes (forward, backward twice, recompute) of 2 FLOPs per
    weight of 12 l h^2 per token, plus attention and logits: the 1T row's 1008B parameters
    within 1%."""
    row = _row("1008B")
    tokens = row.batch * sop.PTDP_SEQ
    params = (
        sop.ptdp_flops(row)
        / (8 * tokens)
        / (1 + sop.PTDP_SEQ / (6 * row.hidden) + sop.PTDP_VOCAB / (16 * row.layers * row.hidden))
    )
    assert abs(params / 1008e9 - 1) < 0.01
