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

Needs transformers: ``pip install -e '.[hf]'`` in a pipeplan checkout.

Example::

    $ pipeplan profile examples/mixtral-8x7b/model.py --analytic --gpu h100-sxm --precision bf16
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

__all__ = ["SEQ_LEN", "build_model", "sample_batch"]

SEQ_LEN = 4096  # tokens per sample: the training sequence length to plan for
CONFIG = Path(__file__).with_name("config.json")


def build_model() -> nn.Module:
    """The model of ``config.json``, on the meta device only (module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if torch.get_default_device().type != "meta":
        raise RuntimeError(
            f"{CONFIG.parent.name} is built on the meta device only (its fp32 weights would "
            "not fit this machine); profile it with pipeplan profile --analytic"
        )
    settings = json.loads(CONFIG.read_text())
    settings.pop("torch_dtype", None)  # fp32 master weights, as mixed precision trains
    config = AutoConfig.for_model(**settings)
    config.use_cache = False
    return AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, experts_implementation="grouped_mm"
    )


def sample_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random token ids of ``SEQ_LEN`` tokens and next-token targets."""
    vocab = json.loads(CONFIG.read_text())["vocab_size"]
    g = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, vocab, (batch_size, SEQ_LEN + 1), generator=g)
    return {"input_ids": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()
