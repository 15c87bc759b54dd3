"""Which process runs which plan device, and on which local torch device.

A plan names devices (``gpu0``, ``cpu1``...); ``run`` maps them to process ranks:

* ``--device cpu``: one process per plan device (gloo), in the order the stages name them;
* ``--device cuda`` with at least as many local GPUs as plan devices: one process per plan
  device, rank ``r`` on ``cuda:r`` (NCCL);
* ``--device cuda`` with fewer GPUs: *shared mode*. NCCL refuses two ranks on one GPU, so
  one process per GPU drives several plan devices, each on its own CUDA stream, and
  hands tensors between them in memory. Devices are grouped in stage order into contiguous
  blocks so that pipeline neighbours share a process;
* ``device_map`` (``--device-map gpu0=0,gpu1=0,gpu2=1``) names the rank of every plan
  device explicitly (this also runs shared mode on CPU).

Under ``torchrun`` the world size comes from the environment and each rank uses
``cuda:LOCAL_RANK`` (or the CPU).

Example::

    placement = place(plan.stages, "cuda", gpus=1)   # every plan device on cuda:0
    placement.rank_of["gpu3"], placement.shared      # (0, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import InputError

if TYPE_CHECKING:
    from planner.plan import StageSpec

__all__ = ["Placement", "parse_device_map", "place", "plan_devices"]


@dataclass
class Placement:
    """Ranks of the plan's devices: ``rank_of[device]``; ``world_size`` processes."""

    devices: list[str]
    rank_of: dict[str, int]
    world_size: int
    device_type: str  # "cpu" or "cuda"

    @property
    def backend(self) -> str:
        """The torch.distributed backend: gloo for CPU tensors, NCCL for CUDA tensors."""
        return "nccl" if self.device_type == "cuda" else "gloo"

    @property
    def shared(self) -> bool:
        """True when some process drives more than one plan device."""
        return self.world_size < len(self.devices)

    def devices_of(self, rank: int) -> list[str]:
        """The plan devices that process ``rank`` drives, in plan order."""
        return [d for d in self.devices if self.rank_of[d] == rank]

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": list(self.devices),
            "rank_of": dict(self.rank_of),
            "world_size": self.world_size,
            "device_type": self.device_type,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placement:
        return cls(
            list(data["devices"]),
            {str(k): int(v) for k, v in data["rank_of"].items()},
            int(data["world_size"]),
            str(data["device_type"]),
        )


def plan_devices(stages: Sequence[StageSpec]) -> list[str]:
    """The plan's devices in order of first appearance (stage order, then replica order).

    Example::

        plan_devices(parse_stages("0-1:a,b;2-3:c"))   # ['a', 'b', 'c']
    """
    out: list[str] = []
    for stage in stages:
        for dev in stage.devices:
            if dev not in out:
                out.append(dev)
    return out


def parse_device_map(text: str, devices: Sequence[str]) -> dict[str, int]:
    """``"gpu0=0,gpu1=0,gpu2=1"`` -> ranks; every plan device must be named, ranks 0..n-1.

    Example::

        parse_device_map("a=0,b=0,c=1", ["a", "b", "c"])   # {'a': 0, 'b': 0, 'c': 1}
    """
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, rank = part.partition("=")
        if not sep or not rank.strip().isdigit():
            raise InputError(f"expected DEVICE=RANK, got {part!r}", field="--device-map")
        out[name.strip()] = int(rank)
    unknown = sorted(set(out) - set(devices))
    missing = [d for d in devices if d not in out]
    if unknown:
        raise InputError(
            f"{', '.join(unknown)} not in the plan (its devices: {', '.join(devices)})",
            field="--device-map",
        )
    if missing:
        raise InputError(f"no rank given for {', '.join(missing)}", field="--device-map")
    ranks = sorted(set(out.values()))
    if ranks != list(range(len(ranks))):
        raise InputError(
            f"expected ranks 0..n-1 with none skipped, got {ranks}", field="--device-map"
        )
    return out


def place(
    stages: Sequence[StageSpec],
    device: str,
    *,
    gpus: int | None = None,
    world_size: int | None = None,
    device_map: str | None = None,
) -> Placement:
    """Map the plan's devices to ranks (see the module docstring).

    ``gpus`` is the number of local GPUs (asked from torch when None and ``device`` is
    cuda); ``world_size`` fixes the number of processes (torchrun).

    Example::

        place(stages, "cpu").world_size              # one process per plan device
        place(stages, "cuda", gpus=2).rank_of        # blocks of devices on 2 GPUs
    """
    if device not in ("cpu", "cuda"):
        raise InputError(f"expected cpu or cuda, got {device!r}", field="--device")
    devices = plan_devices(stages)
    if device_map:
        rank_of = parse_device_map(device_map, devices)
        n = max(rank_of.values()) + 1
        if world_size is not None and n != world_size:
            raise InputError(
                f"names {n} ranks but the job has WORLD_SIZE={world_size}", field="--device-map"
            )
        if device == "cuda" and world_size is None and n > (gpus := _local_gpus(gpus)):
            raise InputError(
                f"names {n} ranks, one GPU each (rank r on cuda:r), but this machine has "
                f"{gpus}; put several plan devices on one rank",
                field="--device-map",
            )
        return Placement(devices, rank_of, n, device)
    if world_size is None:
        if device == "cuda":
            gpus = _local_gpus(gpus)
            if gpus < 1:
                raise InputError("no CUDA device is available; use --device cpu", field="--device")
            world_size = min(gpus, len(devices))
        else:
            world_size = len(devices)
    if world_size > len(devices):
        raise InputError(
            f"the plan has {len(devices)} devices but the job has {world_size} ranks",
            field="WORLD_SIZE",
        )
    # Contiguous blocks in stage order keep pipeline neighbours in one process.
    p = len(devices)
    rank_of = {d: i * world_size // p for i, d in enumerate(devices)}
    return Placement(devices, rank_of, world_size, device)


def _local_gpus(gpus: int | None) -> int:
    """``gpus``, or the number of CUDA devices torch sees here when None."""
    if gpus is not None:
        return gpus
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
