"""One process standing for rank 0 of a tensor-parallel group: torch's fake process group.

torch ships a process group that communicates with nobody (backend ``"fake"``, registered
by ``torch.testing._internal.distributed.fake_pg``; torchtitan estimates memory with it):
every collective returns at once, the all-gather's other slots filled with copies of this
rank's part, the reduce-scatter's with this rank's slice, so values keep their magnitude
but mean nothing. With it one process builds rank 0's shard of a ``degree``-way group with
torch's own ``parallelize_module`` and runs it: the shard's compute is real, its
collectives cost nothing, which is exactly what the profile's shard timings hold (the
collectives are recorded, and timed on the links by the simulator).

Example::

    with fake_group(4, "cpu") as mesh:
        parallelize_module(model, mesh, {"blocks.0.qkv": ColwiseParallel()})
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from planner.errors import InputError

__all__ = ["fake_group"]


@contextlib.contextmanager
def fake_group(degree: int, device_type: str = "cpu") -> Iterator[Any]:
    """A fake default process group of ``degree`` ranks, this process rank 0, and its
    one-dimensional ``DeviceMesh`` (torch's warnings about the fake group silenced);
    destroyed on exit.

    Example::

        with fake_group(2) as mesh:
            mesh.size()   # 2
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_available():  # pragma: no cover - every pip wheel has it
        raise InputError("this torch is built without torch.distributed", field="--tensor-parallel")
    if dist.is_initialized():
        raise InputError(
            "a torch.distributed process group is already running in this process; profile "
            "tensor-parallel shards in a process of their own (as pipeplan profile does)",
            field="--tensor-parallel",
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"torch\.distributed.*")
        warnings.filterwarnings("ignore", message=".*fake.*", category=UserWarning)
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=degree)
        try:
            yield init_device_mesh(device_type, (degree,))
        finally:
            dist.destroy_process_group()
