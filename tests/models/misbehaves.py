"""A valid model.py that misbehaves where the environment says (tests of a user's exits).

``MISBEHAVE=WHERE:WHAT[@N]``: WHERE is import, build_model, sample_batch, loss_fn or
forward; WHAT is exit3 (sys.exit(3)), oexit0 (os._exit(0)), kbi (raise KeyboardInterrupt),
segv (a real segmentation fault) or loop (an endless loop). ``@N``: sample_batch only from
batch size N on, forward only from its N-th call in this process. Unset, it trains like any
model, so one profile serves every case (the file's bytes do not change).
"""

import ctypes
import os
import sys

import torch
from torch import nn

WHERE, _, WHAT = os.environ.get("MISBEHAVE", "").partition(":")
WHAT, _, AT = WHAT.partition("@")
FROM = int(AT or 0)


def misbehave(where, count=None):
    if where != WHERE or (count is not None and count < FROM):
        return
    if WHAT == "exit3":
        sys.exit(3)
    if WHAT == "oexit0":
        os._exit(0)
    if WHAT == "kbi":
        raise KeyboardInterrupt
    if WHAT == "segv":
        ctypes.string_at(0)
    if WHAT == "loop":
        while True:
            pass


misbehave("import")


class Counted(nn.Linear):
    calls = 0

    def forward(self, x):
        Counted.calls += 1
        misbehave("forward", Counted.calls)
        return super().forward(x)


def build_model():
    misbehave("build_model")
    return nn.Sequential(Counted(6, 16), nn.Tanh(), nn.Linear(16, 3))


def sample_batch(batch_size):
    misbehave("sample_batch", batch_size)
    return torch.randn(batch_size, 6), torch.randn(batch_size, 3)


def loss_fn(outputs, targets):
    misbehave("loss_fn")
    return torch.nn.functional.mse_loss(outputs, targets)
