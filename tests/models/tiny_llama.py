"""examples/hf_llama.py at a tiny size (2 decoder layers, width 32, 4 heads, 2 key/value
heads, 8 tokens), for the runtime's tensor-parallel tests: transformers' own plan, and the
example's sequence-parallel form from tp_plan()."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from hf_llama import tp_plan  # noqa: E402

__all__ = ["build_model", "sample_batch", "tp_plan"]

VOCAB, SEQ = 64, 8


def build_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        use_cache=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def sample_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ + 1))  # the runtime seeds each step
    mask = torch.ones(batch_size, SEQ, dtype=torch.long)
    inputs = {"input_ids": tokens[:, :-1].contiguous(), "attention_mask": mask}
    return inputs, tokens[:, 1:].contiguous()
