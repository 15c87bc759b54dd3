"""A Hugging Face causal LM built from the ``config.json`` beside this file: Mixtral-shaped.

The config is the one a hub model ships (here the shape of Mixtral-8x7B: 32 layers of width
4096, 32 heads with 8 key/value heads, 8 SwiGLU experts of 14336 with 2 active per token,
vocabulary 32000; 46.7B parameters); nothing is downloaded and no weights are read: the
model is built with random initial weights by ``AutoModelForCausalLM.from_config``, in fp32
(mixed precision keeps fp32 master weights; ``--precision bf16`` runs the matrix products
in bf16). Copy this file next to any hub model's ``config.json`` to plan for that model.

A 47B model is 187 GB of fp32 weights: it is only ever built on the meta device, by
``pipeplan profile --analytic`` (no memory at all). Built anywhere else it refuses, so a
measured ``pipeplan profile`` or ``pipeplan run`` of it stops with one line instead of
exhausting the machine's memory.

The experts run as one grouped matrix product per projection
(``experts_implementation="grouped_mm"``, transformers' training path), so every token's
two experts are counted exactly whatever the router picks. transformers' grouped product
is not an autocast operation: with fp32 master weights it runs in fp32 (the profile shows
the experts' cost accordingly), and its backward computes the input's and the weights'
gradients in one operation, so a zero-bubble split finds both in the input half.

The building and the batch are :mod:`planner.profile.hub_config`'s, shared by the
bundled hub configs. Needs transformers: ``pip install -e '.[hf]'`` in a pipeplan checkout.

Example::

    $ pipeplan profile examples/mixtral-8x7b/model.py --analytic --gpu h100-sxm --precision bf16
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from planner.profile.hub_config import meta_causal_lm, token_batch

__all__ = ["SEQ_LEN", "build_model", "sample_batch"]

SEQ_LEN = 4096  # tokens per sample: the training sequence length to plan for
CONFIG = Path(__file__).with_name("config.json")


def build_model() -> nn.Module:
    """The model of ``config.json``, on the meta device only (module docstring)."""
    return meta_causal_lm(CONFIG, experts_implementation="grouped_mm")


def sample_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random token ids of ``SEQ_LEN`` tokens and next-token targets."""
    return token_batch(CONFIG, batch_size, seq_len=SEQ_LEN)
