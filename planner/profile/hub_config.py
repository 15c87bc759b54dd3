"""A Hugging Face causal LM from a hub model's ``config.json``, for analytic profiles.

What ``examples/llama3-70b/model.py`` and ``examples/mixtral-8x7b/model.py`` share: the
model a ``config.json`` describes, built with random initial weights by transformers'
``AutoModelForCausalLM.from_config`` in fp32 (mixed precision keeps fp32 master weights),
only ever on the meta device (``pipeplan profile --analytic``): built anywhere else it
refuses with one line, so a measured profile or a run of a model whose weights would not
fit stops instead of exhausting the machine's memory; and a batch of random token ids.
Nothing is downloaded and no weights are read.

Example::

    CONFIG = Path(__file__).with_name("config.json")

    def build_model():
        return meta_causal_lm(CONFIG)

    def sample_batch(batch_size):
        return token_batch(CONFIG, batch_size, seq_len=4096)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["meta_causal_lm", "token_batch"]


def meta_causal_lm(config_path: str | Path, **from_config: Any) -> nn.Module:
    """The causal LM of ``config_path``, in fp32, on the meta device only (a
    RuntimeError anywhere else); ``from_config`` goes to ``from_config`` (e.g.
    ``experts_implementation="grouped_mm"``).

    Example::

        with torch.device("meta"):
            model = meta_causal_lm("examples/llama3-70b/config.json")
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(config_path)
    if torch.get_default_device().type != "meta":
        raise RuntimeError(
            f"{path.parent.name} is built on the meta device only (its fp32 weights would "
            "not fit this machine); profile it with pipeplan profile --analytic"
        )
    settings = json.loads(path.read_text())
    settings.pop("torch_dtype", None)  # fp32 master weights, as mixed precision trains
    config = AutoConfig.for_model(**settings)
    config.use_cache = False
    model: nn.Module = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **from_config)
    return model


def token_batch(
    config_path: str | Path, batch_size: int, *, seq_len: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random token ids of ``seq_len`` tokens from the config's vocabulary, and the
    next-token targets (seeded by the batch size).

    Example::

        inputs, targets = token_batch("examples/llama3-70b/config.json", 2, seq_len=4096)
    """
    import torch

    vocab = json.loads(Path(config_path).read_text())["vocab_size"]
    g = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)
    return {"input_ids": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()
