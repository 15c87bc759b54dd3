"""A GPU-sized GPT-style decoder: 12 blocks of width 1024 (16 heads), sequence 512, vocab 8192.

The same architecture as ``examples/gpt.py`` (embedding, pre-norm blocks in an
``nn.ModuleList``, LM head; the causal mask computed once and carried across every cut),
at a size where a layer's kernels, not launch latency, set the time on a GPU: 168.5 M
parameters (0.67 GB in fp32; 2.7 GB with Adam's gradients and state), about 0.18 TFLOP per
sample (512 tokens) in the forward. The GPU benchmark (``python -m bench --gpu``)
profiles, plans and runs it. On one CPU thread a microbatch of one takes seconds per pass
(capturing it about 15 s on the 2-core VM), so profile it there with ``--repeat 1
--warmup 0`` at most.

Example::

    $ pipeplan profile examples/gpt_large.py -b 1,2,4,8 --device cuda --precision bf16
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["GPT", "build_model", "sample_batch"]

VOCAB = 8192
SEQ_LEN = 512
D_MODEL = 1024
N_HEAD = 16
N_LAYER = 12


class Embeddings(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab: int, seq_len: int, d_model: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class Block(nn.Module):
    """Pre-norm transformer block: masked self-attention and an MLP, each with a residual."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
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
