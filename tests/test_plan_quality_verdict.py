"""bench/plan_quality.py's verdict: a peer faster within the solve's tie tolerance is a tie,
beyond it pipeplan is behind (closed-form cases)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from plan_quality import summarise, verdict  # noqa: E402


@pytest.mark.parametrize(
    ("peer_ms", "pipeplan_ms", "tolerance", "expected"),
    [
        (100.0, 90.0, 0.05, "ahead"),
        (100.0, 100.0, 0.0, "equal"),
        (96.0, 100.0, 0.05, "tie"),  # 100 <= 96 * 1.05 = 100.8
        (94.0, 100.0, 0.05, "behind"),  # 100 > 94 * 1.05 = 98.7
        (99.0, 100.0, 0.0, "behind"),  # a profile without spreads: no ties
    ],
)
def test_verdict(peer_ms: float, pipeplan_ms: float, tolerance: float, expected: str) -> None:
    assert verdict(peer_ms, pipeplan_ms, tolerance) == expected


def test_summary_counts_ties_and_losses_apart() -> None:
    rows = [
        {"profile": "mlp", "topology": "cpu", "vs_best_peer": 0.97, "verdict": "tie"},
        {"profile": "mlp", "topology": "hetero", "vs_best_peer": 0.9, "verdict": "behind"},
        {"profile": "gpt", "topology": "cpu", "vs_best_peer": 1.2, "verdict": "ahead"},
    ]
    out = summarise(rows)
    assert out["ties_below_peer"] == 1 and out["behind_peer"] == 1
    assert out["all_vs_best_peer_worst"] == 0.9
