"""A Hugging Face Llama (``LlamaForCausalLM``) built from its config: rotary embeddings.

Nothing is downloaded: the model is built from a small ``LlamaConfig`` with random weights.
transformers declares Llama's pipeline plan (``_pp_plan``: the embedding, each decoder
layer, the final norm, the head), and pipeplan cuts there by default. The rotary cos/sin
and the causal mask are computed once, before the first decoder layer, and read by every
layer: they cross each cut as carried values, counted in the bytes that cross it. The
sample batch passes keyword inputs, an attention mask among them.

Needs transformers: ``pip install -e '.[hf]'`` in a pipeplan checkout.

Example::

    $ pipeplan profile examples/hf_llama.py -b 1,2
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["build_model", "sample_batch"]

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
