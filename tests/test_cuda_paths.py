"""The runtime's CUDA-only steps, checked on the CPU where their construction allows:
what a rank runs before training is on the rank's device, tensors handed between the CUDA
streams of one process are kept from the allocator until their consumer's stream is done,
and a placement that names more GPUs than the machine has is refused before any process
starts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from planner.plan import parse_stages
from planner.runtime.placement import place
from planner.runtime.shards import sharded_cut_specs


class _Stage(torch.nn.Module):
    """A stage that remembers where it was moved and refuses to run before."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 3)
        self.moved_to: list[Any] = []

    def to(self, *args: Any, **kwargs: Any) -> Any:
        self.moved_to.append(args[0] if args else kwargs.get("device"))
        return super().to(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        assert self.moved_to, "the stage ran before it was put on the rank's device"
        return (self.lin(x),)


class _Split:
    def __init__(self) -> None:
        self.stages = {0: _Stage()}

    def stage(self, first: int, last: int) -> _Stage:
        return self.stages[first]


def test_the_sharded_cut_pass_runs_each_stage_on_the_ranks_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CUDA mesh ``parallelize_module`` moves only the sharded parameters to the GPU;
    the pass that learns what crosses each cut feeds the stage tensors on the rank's
    device, so the stage must be there first (on CUDA: mixed devices otherwise)."""
    monkeypatch.setattr(dist, "broadcast_object_list", lambda box, src, group: None)
    stages = parse_stages("0:a;1:b")
    split = _Split()
    device = torch.device("cpu")
    specs = sharded_cut_specs(
        split, stages, [torch.ones(4, 2)], {}, place(stages, "cpu"), 0, group=None,
        device=device,
    )  # fmt: skip
    assert split.stages[0].moved_to == [device]
    assert [(v.shape, v.dtype) for v in specs[0]] == [((4, 3), torch.float32)] and specs[1] == []


def test_tensors_handed_between_streams_are_recorded_on_the_consumers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shared mode on CUDA: a message taken from the mailbox (another local device's
    outputs, or receive buffers allocated on the default stream) is used on the taker's
    stream; each tensor is recorded there so the allocator does not reuse its memory
    before that stream is done with it. One device per process (no side streams): none."""
    from types import SimpleNamespace

    from planner.runtime.executor import ProcessExecutor

    consumer = object()
    recorded: list[tuple[Any, Any]] = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: consumer)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: recorded.append((t, s)))
    x, g = torch.ones(2), torch.zeros(3)
    key = ("F", 1, 0)
    shared = SimpleNamespace(mailbox={key: ((x, 7, None, g), None)}, streams={"a": 1, "b": 2})
    assert ProcessExecutor._take(shared, "b", key) == (x, 7, None, g)  # type: ignore[arg-type]
    assert [(t is x or t is g, s) for t, s in recorded] == [(True, consumer)] * 2
    recorded.clear()
    alone = SimpleNamespace(mailbox={key: ((x,), None)}, streams={})
    ProcessExecutor._take(alone, "a", key)  # type: ignore[arg-type]
    assert recorded == []


def test_a_rank_without_a_gpu_of_its_own_is_one_line_before_any_process_starts() -> None:
    """--device-map naming more ranks than this machine's GPUs (rank r on cuda:r) is
    refused by the placement; under torchrun a LOCAL_RANK past the host's GPUs is one line
    in that rank, not CUDA's invalid device ordinal."""
    from planner.errors import InputError
    from planner.runtime.worker import _cuda_device

    stages = parse_stages("0:a;1:b;2:c")
    assert place(stages, "cuda", gpus=2, device_map="a=0,b=1,c=1").world_size == 2
    assert place(stages, "cuda", gpus=1, device_map="a=0,b=0,c=0").shared
    with pytest.raises(InputError, match="names 3 ranks.*has 2") as info:
        place(stages, "cuda", gpus=2, device_map="a=0,b=1,c=2")
    assert info.value.field == "--device-map"
    assert place(stages, "cpu", gpus=0, device_map="a=0,b=1,c=2").world_size == 3
    assert _cuda_device(5, 1, 2) == torch.device("cuda", 1)
    assert _cuda_device(1, None, 2) == torch.device("cuda", 1)
    with pytest.raises(InputError, match="cuda:2, but this host has 2") as info:
        _cuda_device(10, 2, 2)
    assert info.value.field == "LOCAL_RANK"


def test_a_step_in_shared_mode_ends_on_the_stream_that_ran_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shared mode on CUDA: STEP runs on its device's stream; the event that ends its
    measured time must be recorded there (on the default stream it would complete at once,
    the optimizer's kernels still queued on the device's stream)."""
    import contextlib
    from collections.abc import Iterator

    from planner.runtime.executor import ProcessExecutor

    current = ["default"]

    @contextlib.contextmanager
    def stream(s: str) -> Iterator[None]:
        current.append(s)
        try:
            yield
        finally:
            current.pop()

    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    ran: list[str] = []
    marks: list[tuple[str, str]] = []
    ex = object.__new__(ProcessExecutor)
    ex.arrived, ex.done, ex.local_replicas = {}, {}, {0: 1}
    ex.streams, ex.device, ex.heartbeat = {"a": "side-a"}, torch.device("cpu"), None
    ex.steppers = {0: type("Step", (), {"step": lambda self, it: ran.append(current[-1])})()}
    ex.clock = type(
        "Clock", (), {"now": lambda self: current[-1], "add": lambda self, *a: marks.append(a[4:6])}
    )()
    list(ex._step("a", 0))
    assert ran == ["side-a"] and marks == [("default", "side-a")]
