"""examples/gpt.py at a tiny size with 4 heads (2 blocks, width 16, 8 tokens), for the
runtime's tests of tensor-parallel degree 4 (tiny_gpt.py's 2 heads do not split 4 ways)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from gpt import GPT, tp_plan  # noqa: E402

__all__ = ["build_model", "sample_batch", "tp_plan"]

VOCAB, SEQ = 64, 8


def build_model() -> torch.nn.Module:
    return GPT(vocab=VOCAB, seq_len=SEQ, d_model=16, n_head=4, n_layer=2)


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1))  # the runtime seeds each step
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
