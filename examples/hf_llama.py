"""A Hugging Face Llama (``LlamaForCausalLM``) built from its config: rotary embeddings.

Nothing is downloaded: the model is built from a small ``LlamaConfig`` with random weights.
transformers declares Llama's pipeline plan (``_pp_plan``: the embedding, each decoder
layer, the final norm, the head), and pipeplan cuts there by default. The rotary cos/sin
and the causal mask are computed once, before the first decoder layer, and read by every
layer: they cross each cut as carried values, counted in the bytes that cross it. The
sample batch passes keyword inputs, an attention mask among them.

Tensor parallelism: transformers declares Llama's plan (``base_model_tp_plan``: the
attention's query, key and value projections and the MLP's gate and up projections split
by columns, the output and down projections by rows; the embedding by vocabulary, the head
by columns with its logits gathered), and pipeplan uses it as it is. transformers has no
sequence-parallel form of it, so ``tp_plan(sequence_parallel=True)`` below gives one (the
layout torchtitan uses for its Llama: norms on a part of the sequence, the attention and
MLP inputs gathered once each, the row-split outputs reduce-scattered); without sequence
parallelism it returns None, which leaves the model's own plan in force.

Needs transformers: ``pip install -e '.[hf]'`` in a pipeplan checkout.

Example::

    $ pipeplan profile examples/hf_llama.py -b 1,2
    $ pipeplan profile examples/hf_llama.py -b 1,2 --tensor-parallel 2 --sequence-parallel
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["build_model", "sample_batch", "tp_plan"]

VOCAB = 1024
SEQ_LEN = 64
WIDTH = 128
LAYERS = 4


def build_model() -> nn.Module:
    """Llama at a small size (grouped-query attention: 4 heads, 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ_LEN,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        use_cache=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def sample_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Keyword inputs (``input_ids``, ``attention_mask``) and next-token targets."""
    g = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1), generator=g)
    mask = torch.ones(batch_size, SEQ_LEN, dtype=torch.long)
    return {"input_ids": tokens[:, :-1].contiguous(), "attention_mask": mask}, tokens[
        :, 1:
    ].contiguous()


def tp_plan(sequence_parallel: bool = False) -> dict[str, object] | None:
    """None (transformers' own plan) without sequence parallelism; with it, that plan's
    sequence-parallel form in torch's styles (see the module docstring), the one
    ``planner.profile.hub_config`` gives every Llama."""
    from planner.profile.hub_config import llama_tp_plan

    return llama_tp_plan(sequence_parallel)
