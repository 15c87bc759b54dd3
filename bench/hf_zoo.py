"""Small Hugging Face models of 16 architectures, built from config (no download, dropout 0).

What docs/models.md measures: each architecture at a small size, so that profiling it and
running 2- and 3-stage pipelines on CPU processes takes seconds. :func:`write_model_file`
writes a model.py for one of them (the runtime's workers import model files by path).

Example::

    path = write_model_file("llama", tmp_dir)       # tmp_dir/llama.py, a valid model.py
    model = build_model_for("t5"); inputs, targets = sample_batch_for("t5", 4)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["ARCHITECTURES", "build_model_for", "sample_batch_for", "write_model_file"]

VOCAB = 256
SEQ = 16
WIDTH = 32
LAYERS = 3
IMAGE = 32


def _decoder(model: str, config: str, **extra: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        common: dict[str, Any] = dict(
            vocab_size=VOCAB,
            hidden_size=WIDTH,
            intermediate_size=2 * WIDTH,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            max_position_embeddings=4 * SEQ,
            use_cache=False,
        )
        common.update(extra)
        cfg = getattr(transformers, config)(**common)
        return getattr(transformers, model)(cfg)

    return build


def _gpt2(tied: bool) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=VOCAB,
            n_positions=4 * SEQ,
            n_embd=WIDTH,
            n_layer=LAYERS,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=tied,
            bos_token_id=0,
            eos_token_id=0,
            use_cache=False,
        )
        return GPT2LMHeadModel(cfg)

    return build


def _opt() -> nn.Module:
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        ffn_dim=2 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        max_position_embeddings=4 * SEQ,
        word_embed_proj_dim=WIDTH,
        dropout=0.0,
        attention_dropout=0.0,
        layerdrop=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return OPTForCausalLM(cfg)


def _bloom() -> nn.Module:
    from transformers import BloomConfig, BloomForCausalLM

    cfg = BloomConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, n_layer=LAYERS, n_head=4, use_cache=False
    )
    return BloomForCausalLM(cfg)


def _falcon() -> nn.Module:
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        use_cache=False,
    )
    return FalconForCausalLM(cfg)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        max_position_embeddings=4 * SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(cfg)


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        image_size=IMAGE,
        patch_size=8,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ViTForImageClassification(cfg)


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=WIDTH,
        d_ff=2 * WIDTH,
        d_kv=8,
        num_layers=LAYERS,
        num_heads=4,
        dropout_rate=0.0,
        use_cache=False,
    )
    return T5ForConditionalGeneration(cfg)


ARCHITECTURES: dict[str, tuple[str, Callable[[], nn.Module]]] = {
    "gpt2": ("causal", _gpt2(tied=False)),
    "gpt2-tied": ("causal", _gpt2(tied=True)),
    "llama": ("causal", _decoder("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=2)),
    "mistral": ("causal", _decoder("MistralForCausalLM", "MistralConfig", num_key_value_heads=2)),
    "qwen2": ("causal", _decoder("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2)),
    "qwen3": (
        "causal",
        _decoder("Qwen3ForCausalLM", "Qwen3Config", num_key_value_heads=2, head_dim=8),
    ),
    "gemma": (
        "causal",
        _decoder("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=2, head_dim=8),
    ),
    "phi3": (
        "causal",
        _decoder("Phi3ForCausalLM", "Phi3Config", num_key_value_heads=2, pad_token_id=0),
    ),
    "opt": ("causal", _opt),
    "gpt-neox": ("causal", _decoder("GPTNeoXForCausalLM", "GPTNeoXConfig")),
    "bloom": ("causal", _bloom),
    "falcon": ("causal", _falcon),
    "mixtral": (
        "causal",
        _decoder(
            "MixtralForCausalLM",
            "MixtralConfig",
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    "bert-mlm": ("masked", _bert),
    "vit": ("image", _vit),
    "t5": ("seq2seq", _t5),
}
"""name -> (task, builder). ``gpt2-tied``, ``gemma``, ``bloom``, ``falcon``, ``opt``,
``bert-mlm`` and ``t5`` tie the output head to the input embedding."""


def build_model_for(name: str) -> nn.Module:
    """The model of architecture ``name``, with the seed fixed.

    Example::

        build_model_for("mixtral")
    """
    torch.manual_seed(0)
    return ARCHITECTURES[name][1]()


def sample_batch_for(name: str, batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Keyword inputs and targets for the architecture's task.

    Example::

        inputs, targets = sample_batch_for("vit", 2)   # pixel_values, class labels
    """
    task = ARCHITECTURES[name][0]
    g = torch.Generator().manual_seed(batch_size)
    if task == "image":
        pixels = torch.randn(batch_size, 3, IMAGE, IMAGE, generator=g)
        return {"pixel_values": pixels}, torch.randint(0, 10, (batch_size,), generator=g)
    tokens = torch.randint(2, VOCAB, (batch_size, SEQ + 1), generator=g)
    if task == "causal":
        return {"input_ids": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()
    if task == "masked":
        mask = torch.ones(batch_size, SEQ, dtype=torch.long)
        inputs = {"input_ids": tokens[:, :-1].contiguous(), "attention_mask": mask}
        return inputs, tokens[:, 1:].contiguous()
    decoder = torch.randint(2, VOCAB, (batch_size, SEQ), generator=g)
    inputs = {"input_ids": tokens[:, :-1].contiguous(), "decoder_input_ids": decoder}
    return inputs, torch.roll(decoder, -1, dims=1)


_TEMPLATE = '''"""pipeplan model file for the {name} architecture of bench/hf_zoo.py."""

import sys

sys.path.insert(0, {folder!r})
from hf_zoo import build_model_for, sample_batch_for  # noqa: E402


def build_model():
    return build_model_for({name!r})


def sample_batch(batch_size):
    return sample_batch_for({name!r}, batch_size)
'''


def write_model_file(name: str, folder: Path) -> Path:
    """Write ``folder/NAME.py``, a model.py for architecture ``name``; returns its path.

    Example::

        write_model_file("bert-mlm", Path("/tmp/zoo"))   # /tmp/zoo/bert-mlm.py
    """
    if name not in ARCHITECTURES:
        raise KeyError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    text = _TEMPLATE.format(name=name, folder=str(Path(__file__).resolve().parent))
    path.write_text(text)
    return path
