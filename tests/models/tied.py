"""Test model with two tied parameters, as in GPT-2/BERT (``tie_word_embeddings``).

- the output head's weight *is* the input embedding's weight (layers 0 and 5);
- blocks 0 and 2 share one weight (ALBERT-style), ``blocks.2.fc.weight is blocks.0.fc.weight``
  (layers 1 and 3).

Layers as split: 0 embed, 1-4 blocks.0..3, 5 head.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 11
WIDTH = 8
SEQ_LEN = 5


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied input and output embedding
        self.blocks[2].fc.weight = self.blocks[0].fc.weight  # a weight shared by two blocks

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return TiedLM()


def sample_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1))  # the runtime seeds per step
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
