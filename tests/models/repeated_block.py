import torch
from torch import nn

WIDTH = 8


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, h):
        return h + self.down(torch.tanh(self.up(h)))


class Layer(nn.Module):
    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self.shared = shared
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, h):
        return self.norm(self.shared(self.shared(h)))


class RepeatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        shared = Shared()
        self.layers = nn.ModuleList(Layer(shared) for _ in range(4))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def build_model():
    torch.manual_seed(0)
    return RepeatedNet()


def sample_batch(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 1, generator=g)
