"""A Hugging Face causal LM built from the ``config.json`` beside this file: Llama-3-8B-shaped.

The config is the one a hub model ships (here the shape of Meta-Llama-3-8B: 32 layers of
width 4096, 32 heads with 8 key/value heads, SwiGLU 14336, vocabulary 128256; 8.03B
parameters); nothing is downloaded and no weights are read: the model is built with random
initial weights by ``AutoModelForCausalLM.from_config``, in fp32 (mixed precision keeps
fp32 master weights; ``--precision bf16`` runs the matrix products in bf16), on the meta
device only: ``pipeplan profile --analytic``. Built anywhere else it refuses in one line.

Tensor parallelism: transformers' own Llama plan without sequence parallelism; with it,
torchtitan's Llama layout (``planner.profile.hub_config.llama_tp_plan``). This is the model
of the worked example in docs/parallelism.md (two DGX H100 nodes).

Needs transformers: ``pip install -e '.[hf]'`` in a pipeplan checkout.

Example::

    $ pipeplan profile examples/llama3-8b/model.py --analytic --gpu h100-sxm --precision bf16 \\
        -b 1 --tensor-parallel 2,4,8 --sequence-parallel
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from planner.profile.hub_config import llama_tp_plan, meta_causal_lm, token_batch

__all__ = ["SEQ_LEN", "build_model", "sample_batch", "tp_plan"]

SEQ_LEN = 8192  # tokens per sample: Llama 3's training context
CONFIG = Path(__file__).with_name("config.json")


def build_model() -> nn.Module:
    """The model of ``config.json``, on the meta device only (module docstring)."""
    return meta_causal_lm(CONFIG)


def sample_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random token ids of ``SEQ_LEN`` tokens and next-token targets."""
    return token_batch(CONFIG, batch_size, seq_len=SEQ_LEN)


def tp_plan(sequence_parallel: bool = False) -> dict[str, object] | None:
    """transformers' plan (None) without sequence parallelism; torchtitan's layout with it."""
    return llama_tp_plan(sequence_parallel)
