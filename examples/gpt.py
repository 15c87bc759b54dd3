"""A small GPT-style decoder: embedding, transformer blocks in an ``nn.ModuleList``, LM head.

Sized so that each block takes a few milliseconds per sample on one CPU thread while
``pipeplan profile examples/gpt.py -b 1,2,4`` stays well under a minute. The causal mask is
computed once in ``forward`` and handed to every block, so it crosses every cut between
layers; the profiler carries it through and counts it in ``output_bytes``.

``tp_plan()`` says how the blocks split across a tensor-parallel group, Megatron-LM's way:
the attention's fused query/key/value projection and the MLP's first linear by columns, the
attention's output projection and the MLP's second linear by rows (one all-reduce per half
block and pass), the head by columns, its logits gathered. The fused projection holds each
head's query, key and value rows next to each other (``[q_h k_h v_h]`` for head ``h``), so
a column split hands every rank whole heads; a block reads its head count from the shapes it
gets (``-1``), so the same code runs whole and split. With sequence parallelism the norms
run on ``1/t`` of the sequence and the all-reduces become reduce-scatters and all-gathers.

Example::

    $ pipeplan profile examples/gpt.py -b 1,2,4
    $ pipeplan profile examples/gpt.py -b 1,2 --tensor-parallel 2,4 --sequence-parallel
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["GPT", "build_model", "sample_batch", "tp_plan"]

VOCAB = 2048
SEQ_LEN = 128
D_MODEL = 256
N_HEAD = 4
N_LAYER = 4


class Embeddings(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab: int, seq_len: int, d_model: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(0.0)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.tok(idx) + self.pos(positions))


class Block(nn.Module):
    """Pre-norm transformer block: masked self-attention and an MLP, each with a residual.

    ``qkv``'s output features are head-major: head ``h`` owns rows ``[3 h d, 3 (h + 1) d)``
    of its weight (query, key, value, each ``d = d_model / n_head`` rows), and the local
    head count is read from the shape, so a column split by whole heads runs unchanged.
    """

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(self.ln1(x))  # (b, t, 3 * heads * d): every head, or this rank's
        b, t, _ = qkv.shape  # the whole sequence, also where x holds a part of it
        heads = qkv.view(b, t, -1, 3 * self.head_dim).split(self.head_dim, dim=3)
        q, k, v = (z.transpose(1, 2) for z in heads)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.ln2(x))


class LMHead(nn.Module):
    """Final layer norm and the projection to vocabulary logits."""

    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(idx)`` returns logits of shape (B, T, VOCAB)."""

    def __init__(
        self,
        vocab: int = VOCAB,
        seq_len: int = SEQ_LEN,
        d_model: int = D_MODEL,
        n_head: int = N_HEAD,
        n_layer: int = N_LAYER,
    ):
        super().__init__()
        self.embed = Embeddings(vocab, seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.head = LMHead(d_model, vocab)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = self.causal[:t, :t]
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


def build_model() -> nn.Module:
    """The model to profile, with fixed initial weights."""
    torch.manual_seed(0)
    return GPT()


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets (integer targets: cross-entropy loss)."""
    g = torch.Generator().manual_seed(batch_size)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def tp_plan(sequence_parallel: bool = False) -> dict[str, object]:
    """Which weights split across a tensor-parallel group (torch's parallelize_module plan;
    see the module docstring). With ``sequence_parallel`` the activations between the
    split linears are split along the sequence too (Megatron-LM's sequence parallelism)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        return {
            "blocks.*.qkv": ColwiseParallel(),
            "blocks.*.proj": RowwiseParallel(),
            "blocks.*.mlp.0": ColwiseParallel(),
            "blocks.*.mlp.2": RowwiseParallel(),
            "head.out": ColwiseParallel(output_layouts=Replicate()),
        }
    sequence = Shard(1)
    return {
        "embed": PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=sequence, use_local_output=True
        ),
        "blocks.*.ln1": SequenceParallel(use_local_output=True),
        "blocks.*.qkv": ColwiseParallel(input_layouts=sequence),
        "blocks.*.proj": RowwiseParallel(output_layouts=sequence),
        "blocks.*.ln2": SequenceParallel(use_local_output=True),
        "blocks.*.mlp.0": ColwiseParallel(input_layouts=sequence),
        "blocks.*.mlp.2": RowwiseParallel(output_layouts=sequence),
        "head.ln": SequenceParallel(use_local_output=True),
        "head.out": ColwiseParallel(input_layouts=sequence, output_layouts=Replicate()),
    }
