"""A Hugging Face GPT-2 (``GPT2LMHeadModel``) built from its config: tied embeddings.

Nothing is downloaded: the model is built from a small ``GPT2Config`` with random weights.
``build_model`` returns the Hugging Face model as it is; its forward returns a
``ModelOutput`` whose ``.logits`` the default loss reads. torch.fx cannot trace GPT-2's
forward, so pipeplan captures it with torch.export and cuts it between the blocks of
``transformer.h``. The output head's weight *is* the token embedding (``lm_head.weight``
tied to ``transformer.wte.weight``), so a plan that puts the embedding and the head on
different stages holds that matrix on both; the runtime keeps the copies identical.

Needs transformers: ``pip install -e '.[hf]'`` in a pipeplan checkout.

Example::

    $ pipeplan profile examples/hf_gpt2.py -b 1,2
    $ pipeplan solve --profile profiles/hf_gpt2.json --topology topologies/cpu.yaml \\
        --microbatches 4 -o plan.json
    $ pipeplan run plan.json --model examples/hf_gpt2.py --steps 3
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["build_model", "sample_batch"]

VOCAB = 1024
SEQ_LEN = 64
WIDTH = 128
HEADS = 4
LAYERS = 4


def build_model() -> nn.Module:
    """GPT-2 at a small size, dropout 0 (so a pipeline can match one process exactly)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ_LEN,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def sample_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Keyword inputs (``input_ids``) and next-token targets."""
    g = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1), generator=g)
    return {"input_ids": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()
