"""A Hugging Face causal LM from a hub model's ``config.json``, for analytic profiles.

What ``examples/llama3-70b/model.py`` and ``examples/mixtral-8x7b/model.py`` share: the
model a ``config.json`` describes, built with random initial weights by transformers'
``AutoModelForCausalLM.from_config`` in fp32 (mixed precision keeps fp32 master weights),
only ever on the meta device (``pipeplan profile --analytic``): built anywhere else it
refuses with one line, so a measured profile or a run of a model whose weights would not
fit stops instead of exhausting the machine's memory; and a batch of random token ids.
Nothing is downloaded and no weights are read. ``llama_tp_plan`` gives a Llama's
sequence-parallel tensor-parallel plan, which transformers does not declare.

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

__all__ = ["llama_tp_plan", "meta_causal_lm", "token_batch"]


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


def llama_tp_plan(sequence_parallel: bool = False) -> dict[str, object] | None:
    """A ``tp_plan()`` for a Hugging Face Llama (``LlamaForCausalLM``): None without sequence
    parallelism (transformers' own ``base_model_tp_plan`` stays in force); with it, that
    plan's sequence-parallel form in torch's styles, the layout torchtitan uses for its
    Llama (norms on a part of the sequence, the attention's and the MLP's input gathered
    once each, the row-split outputs reduce-scattered; the head gathers its logits).

    Example::

        def tp_plan(sequence_parallel=False):  # in model.py
            return llama_tp_plan(sequence_parallel)
    """
    if not sequence_parallel:
        return None
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    sequence, layer = Shard(1), "model.layers.*"
    return {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=sequence),
        f"{layer}.input_layernorm": SequenceParallel(use_local_output=True),
        f"{layer}.self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": sequence},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        ),
        f"{layer}.self_attn.q_proj": ColwiseParallel(),
        f"{layer}.self_attn.k_proj": ColwiseParallel(),
        f"{layer}.self_attn.v_proj": ColwiseParallel(),
        f"{layer}.self_attn.o_proj": RowwiseParallel(output_layouts=sequence),
        f"{layer}.post_attention_layernorm": SequenceParallel(use_local_output=True),
        f"{layer}.mlp": PrepareModuleInput(
            input_layouts=(sequence,), desired_input_layouts=(Replicate(),)
        ),
        f"{layer}.mlp.gate_proj": ColwiseParallel(),
        f"{layer}.mlp.up_proj": ColwiseParallel(),
        f"{layer}.mlp.down_proj": RowwiseParallel(output_layouts=sequence),
        "model.norm": SequenceParallel(use_local_output=True),
        "lm_head": ColwiseParallel(input_layouts=sequence, output_layouts=Replicate()),
    }
