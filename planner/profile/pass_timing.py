"""Layer times taken inside whole passes, so that a layer costs what it costs in a run.

Timing each layer on its own, with a synchronisation around it, charges every layer the
time the device needs to start again; on a GPU the layers of a run instead queue their
kernels back to back, and the per-layer sum came out 5-12% over the pass it describes.
Here each layer is timed between *marks* recorded inside uninterrupted passes over the
whole model, with one synchronisation at the end of each pass:

- **forward**: the whole model as one graph, as a one-stage plan runs it, under the
  profile's autocast; a mark after each layer (the last layer's interval includes the loss);
- **backward**: one ``torch.autograd.backward`` of that loss, as a one-stage plan's ``B``;
  a mark where each cut's gradient is complete (a hook on the tensors the layer before the
  cut made): there the layer before the cut starts its backward;
- **zero-bubble halves**: the layers as a chain of one-layer stages on detached inputs,
  as the runtime's stages are (planner/runtime/stage.py): every ``I`` from the last layer
  to the first, then every ``W``, marks between them;
- **whole pass**: the same forward and backward with marks at their ends only: what the
  layers' times must add up to (:func:`pass_ratio`).

The clock is pluggable: :class:`CudaClock` records CUDA events (the synchronisation at
the end of a pass resolves them), :class:`WallClock` reads a CPU clock and has nothing to
synchronise, so the same code runs, and is tested, on CPU. On CUDA a :class:`CudaMemory`
probe also reads the caching allocator inside one untimed pass (:meth:`ModelPasses.memory`):
what each layer's forward leaves allocated until its backward (saved tensors, outputs,
autocast casts, rounded to the allocator's blocks) and the transient peak beyond that.

Example::

    passes = ModelPasses(split.layers, inputs, loss, autocast=ctx, clock=WallClock())
    sample = passes.sample()                  # one repeat: per-layer times, whole pass
    sum(sample.forward_ms), sample.whole_forward_ms
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from planner.tensors import leaf, tensors

__all__ = [
    "CudaClock",
    "CudaMemory",
    "LayerMemory",
    "MemoryProbe",
    "ModelPasses",
    "PassClock",
    "PassSample",
    "WallClock",
    "intervals_ms",
    "medians",
    "pass_ratio",
    "resolve_marks",
    "time_calls",
]


class PassClock(Protocol):
    """Marks inside a pass; ``sync`` once at its end, then ``elapsed_ms`` between marks."""

    name: str

    def mark(self) -> Any: ...

    def sync(self) -> None: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...


@dataclass
class WallClock:
    """A CPU clock (``time.perf_counter`` or ``time.thread_time``): nothing to synchronise.

    Example::

        clock = WallClock(time.thread_time, "thread_time")
        a = clock.mark(); b = clock.mark(); clock.elapsed_ms(a, b) >= 0   # True
    """

    read: Callable[[], float] = time.perf_counter
    name: str = "perf_counter"

    def mark(self) -> float:
        return self.read()

    def sync(self) -> None:
        return None

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return (float(end) - float(start)) * 1000.0


class CudaClock:
    """CUDA events recorded on the current stream; ``sync`` waits for the device.

    Example::

        clock = CudaClock(torch.device("cuda", 0))
        a = clock.mark(); run(); b = clock.mark(); clock.sync(); clock.elapsed_ms(a, b)
    """

    name = "cuda_events"

    def __init__(self, device: Any):
        self.device = device

    def mark(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))


class MemoryProbe(Protocol):
    """What the device's allocator holds now, and its peak since the last reset."""

    def allocated(self) -> int: ...

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...


class CudaMemory:
    """The CUDA caching allocator's counters (host-side: reading them needs no sync).

    Example::

        probe = CudaMemory(torch.device("cuda", 0))
        probe.reset_peak(); run(); probe.peak() - probe.allocated()
    """

    def __init__(self, device: Any):
        self.device = device

    def allocated(self) -> int:
        import torch

        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(self.device))

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)


@dataclass
class PassSample:
    """One repeat: per-layer times (ms) and the whole forward and backward around them."""

    forward_ms: list[float]
    backward_ms: list[float]
    backward_input_ms: list[float]
    backward_weight_ms: list[float]
    whole_forward_ms: float
    whole_backward_ms: float


@dataclass
class LayerMemory:
    """One layer as the allocator saw it: ``held_bytes`` stay allocated from its forward
    until its backward; ``workspace_bytes`` is the transient peak of its forward or
    backward beyond everything held at that point."""

    held_bytes: int
    workspace_bytes: int


def intervals_ms(clock: PassClock, marks: Sequence[Any]) -> list[float]:
    """Times between consecutive marks (after the pass's ``sync``).

    Example::

        intervals_ms(WallClock(), [0.0, 0.001, 0.003])   # [1.0, 2.0]
    """
    return [clock.elapsed_ms(a, b) for a, b in zip(marks, marks[1:], strict=False)]


def resolve_marks(points: Sequence[Any | None]) -> list[Any]:
    """Marks in time order with the missing ones (None) replaced by the next one present,
    so that the intervals still add up to the whole: a layer whose end was not marked
    takes the time up to the next mark and the layer after it none. The last point must
    be present.

    Example::

        resolve_marks([0.0, None, 2.0, 3.0])   # [0.0, 2.0, 2.0, 3.0]
    """
    if not points or points[-1] is None:
        raise ValueError("the last mark of a pass must be present")
    out = list(points)
    for i in range(len(out) - 2, -1, -1):
        if out[i] is None:
            out[i] = out[i + 1]
    return out


def medians(samples: Sequence[Sequence[float]]) -> list[float]:
    """Per position, the median over samples (each a list with one value per layer).

    Example::

        medians([[1.0, 5.0], [3.0, 4.0], [2.0, 6.0]])   # [2.0, 5.0]
    """
    if not samples:
        raise ValueError("no samples")
    return [statistics.median(column) for column in zip(*samples, strict=True)]


def pass_ratio(layer_ms: Sequence[float], whole_ms: float) -> float | None:
    """The layers' summed time over the whole pass (1.0: they add up exactly); None
    where no whole pass was timed.

    Example::

        pass_ratio([1.0, 2.0, 1.1], 4.0)   # 1.025
    """
    if whole_ms <= 0:
        return None
    return sum(layer_ms) / whole_ms


def time_calls(calls: Sequence[Callable[[], Any]], clock: PassClock) -> list[float]:
    """Run ``calls`` back to back with a mark between each two; one sync at the end.

    Example::

        time_calls([job.step for job in jobs], CudaClock(device))   # ms per call
    """
    marks = [clock.mark()]
    for call in calls:
        call()
        marks.append(clock.mark())
    clock.sync()
    return intervals_ms(clock, marks)


@dataclass
class _Link:
    """One layer as a one-layer stage of the chain (what StageRuntime keeps per microbatch)."""

    leaves: list[Any]
    roots: list[Any]
    root_index: list[int]
    params: list[Any]
    wants: list[Any]
    groups: list[dict[str, Any]] | None = None


class ModelPasses:
    """Whole passes over ``layers`` (a split model's, in order) on one microbatch.

    ``inputs`` are the first layer's positional inputs, ``loss`` turns the last layer's
    output into the loss, ``autocast`` returns the forward's autocast context (a fresh one
    per pass, as every stage's forward opens its own). Parameters get a ``.grad`` buffer
    that backwards add into (as after the runtime's ``zero_grad(set_to_none=False)``),
    zeroed by :meth:`sample` before each repeat.
    """

    def __init__(
        self,
        layers: Sequence[Any],
        inputs: Sequence[Any],
        loss: Callable[[Any], Any],
        *,
        clock: PassClock,
        autocast: Callable[[], AbstractContextManager[Any]] | None = None,
    ):
        self.layers = list(layers)
        self.inputs = tuple(inputs)
        self.loss = loss
        self.clock = clock
        self.autocast = autocast or contextlib.nullcontext
        self.params = [[p for p in layer.parameters() if p.requires_grad] for layer in layers]
        unique = {id(p): p for ps in self.params for p in ps}
        self.all_params = list(unique.values())
        # Per layer: whether torch's split backward handles it (found in the first chain
        # backward); where it does not, I runs the whole backward and W has nothing to do.
        self.split_ok = [True] * len(self.layers)
        self._checked_split = False

    # -- one repeat ---------------------------------------------------------------------

    def sample(self) -> PassSample:
        """One repeat: the graph pass with marks, the chain's halves, the whole pass."""
        self.zero_grads()
        forward, backward = self.graph_pass()
        half_in, half_w = self.chain_halves()
        whole_f, whole_b = self.whole_pass()
        return PassSample(forward, backward, half_in, half_w, whole_f, whole_b)

    def zero_grads(self) -> None:
        """Zeroed ``.grad`` buffers (made where missing) for the backwards to add into."""
        import torch

        with torch.no_grad():
            for p in self.all_params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                else:
                    p.grad.zero_()

    # -- forward and backward as one graph ------------------------------------------------

    def _graph_forward(
        self,
        on_layer: Callable[[int], None] | None = None,
        cuts: _CutHooks | None = None,
    ) -> Any:
        """The loss of one forward of the whole graph; ``on_layer(k)`` after each layer,
        and ``cuts`` hooked onto the tensors each layer but the last made. Nothing else
        keeps a reference to a layer's outputs: what the graph does not save is freed."""
        import torch

        values: Any = self.inputs
        last = len(self.layers) - 1
        loss = None
        with self.autocast():
            for k, layer in enumerate(self.layers):
                out = layer(*values)
                if k == last:
                    loss = self.loss(out)
                    del out
                    values = ()  # the last layer's inputs: kept only where it saved them
                else:
                    if cuts is not None:
                        seen = {id(v) for v in values if isinstance(v, torch.Tensor)}
                        cuts.hook(k, [t for t in tensors(out) if id(t) not in seen])
                    values = out
                if on_layer is not None:
                    on_layer(k)
        return loss

    def graph_pass(self) -> tuple[list[float], list[float]]:
        """Per-layer forward and backward times, marked inside one forward and one
        backward of the whole model (one sync after each)."""
        clock = self.clock
        marks = [clock.mark()]
        cuts = _CutHooks(len(self.layers) - 1, lambda: clock.mark())
        loss = self._graph_forward(lambda k: marks.append(clock.mark()), cuts)
        clock.sync()
        forward = intervals_ms(clock, marks)
        start = clock.mark()
        with cuts:
            _backward([loss], None)
        end = clock.mark()
        clock.sync()
        # Time order: the last layer's backward starts first; cut k ends layer k + 1's.
        points = resolve_marks([start, *cuts.in_order()[::-1], end])
        backward = intervals_ms(clock, points)[::-1]
        return forward, backward

    def whole_pass(self) -> tuple[float, float]:
        """The forward and the backward of the whole model with marks at their ends."""
        clock = self.clock
        start = clock.mark()
        loss = self._graph_forward()
        middle = clock.mark()
        _backward([loss], None)
        end = clock.mark()
        clock.sync()
        return clock.elapsed_ms(start, middle), clock.elapsed_ms(middle, end)

    # -- the zero-bubble halves, layer by layer as the stages run them ------------------

    def _chain_forward(self) -> list[_Link]:
        import torch

        links: list[_Link] = []
        values: Any = self.inputs
        last = len(self.layers) - 1
        with self.autocast():
            for k, layer in enumerate(self.layers):
                leaves = [leaf(v) for v in values] if k > 0 else list(values)
                out = layer(*leaves)
                wants = [v for v in leaves if isinstance(v, torch.Tensor) and v.requires_grad]
                if k == last:
                    links.append(_Link(leaves, [self.loss(out)], [-1], self.params[k], wants))
                    break
                outs = tuple(out)
                index = [
                    i for i, v in enumerate(outs) if isinstance(v, torch.Tensor) and v.requires_grad
                ]
                links.append(_Link(leaves, [outs[i] for i in index], index, self.params[k], wants))
                values = tuple(v.detach() if isinstance(v, torch.Tensor) else v for v in outs)
        return links

    def chain_halves(self) -> tuple[list[float], list[float]]:
        """Per-layer ``I`` then ``W`` times: every ``I`` from the last layer to the first,
        then every ``W`` from the last to the first, marks between them (one sync)."""
        links = self._chain_forward()
        self.clock.sync()  # the forward is not timed here
        if not self._checked_split:
            self._check_split(links)
            links = self._chain_forward()
            self.clock.sync()
        n = len(links)
        order = range(n - 1, -1, -1)
        calls: list[Callable[[], Any]] = [
            functools.partial(self._input_half, links, k) for k in order
        ]
        calls += [functools.partial(self._weight_half, links[k]) for k in order]
        times = time_calls(calls, self.clock)
        return times[:n][::-1], times[n:][::-1]

    def _root_grads(self, links: list[_Link], k: int) -> list[Any] | None:
        """Layer ``k``'s output gradients: those of layer ``k + 1``'s inputs (zeros where
        none flowed), as the runtime hands them from stage to stage."""
        import torch

        if k == len(links) - 1:
            return None
        nxt = links[k + 1].leaves
        return [
            nxt[i].grad if nxt[i].grad is not None else torch.zeros_like(nxt[i])
            for i in links[k].root_index
        ]

    def _input_half(self, links: list[_Link], k: int) -> None:
        link = links[k]
        if not link.roots:
            return
        grads = self._root_grads(links, k)
        if not link.wants or not link.params or not self.split_ok[k]:
            _backward(link.roots, grads)
            return
        from torch.distributed.pipelining._backward import stage_backward_input

        _, link.groups = stage_backward_input(link.roots, grads, link.wants, iter(link.params))

    def _weight_half(self, link: _Link) -> None:
        if link.groups is None:
            return
        from torch.distributed.pipelining._backward import stage_backward_weight

        stage_backward_weight(iter(link.params), link.groups)
        link.groups = None

    def _check_split(self, links: list[_Link]) -> None:
        """Find the layers torch's split backward cannot handle (a parameter its forward
        never reaches, say): those run their whole backward as ``I``."""
        for k in range(len(links) - 1, -1, -1):
            try:
                self._input_half(links, k)
                self._weight_half(links[k])
            except (KeyError, RuntimeError):
                self.split_ok[k] = False
        self._checked_split = True
        self.zero_grads()

    # -- memory, as the allocator holds it ------------------------------------------------

    def memory(self, probe: MemoryProbe) -> list[LayerMemory]:
        """One untimed forward and backward of the whole graph, reading ``probe`` between
        layers: per layer the bytes its forward leaves allocated (``held_bytes``; a
        layer's own outputs count there, and are given back by the next layer where it
        does not keep them) and the transient peak of its forward or backward beyond all
        that is held at that point (``workspace_bytes``)."""
        self.zero_grads()
        self.clock.sync()
        start = probe.allocated()
        levels: list[int] = []
        peaks: list[int] = []

        def after_layer(k: int) -> None:
            levels.append(probe.allocated())
            peaks.append(probe.peak())
            probe.reset_peak()

        cuts = _CutHooks(len(self.layers) - 1, lambda: _take_peak(probe))
        probe.reset_peak()
        loss = self._graph_forward(after_layer, cuts)
        probe.reset_peak()
        with cuts:
            _backward([loss], None)
        last_peak = probe.peak()
        self.clock.sync()
        self.zero_grads()
        held = [max(0, b - a) for a, b in zip([start, *levels], levels, strict=False)]
        # Layer k's backward ends where cut k - 1's gradient is complete (layer 0's at the
        # end of the call); each hook took the peak since the one before.
        back_peaks = [None if e is None else int(e[1]) for e in cuts.ends]
        out = []
        for k in range(len(self.layers)):
            forward_ws = peaks[k] - levels[k]
            peak_b = last_peak if k == 0 else back_peaks[k - 1]
            backward_ws = 0 if peak_b is None else peak_b - start - sum(held[: k + 1])
            out.append(LayerMemory(held[k], max(0, forward_ws, backward_ws)))
        return out


def _take_peak(probe: MemoryProbe) -> int:
    peak = probe.peak()
    probe.reset_peak()
    return peak


class _CutHooks:
    """Hooks on the tensors made before each of ``cuts`` cuts: the first time a gradient
    of cut ``k`` is complete (the layer before it can start its backward) they record
    ``on_cut()`` and the order in which the cuts fired. Removed when the ``with`` ends."""

    def __init__(self, cuts: int, on_cut: Callable[[], Any]):
        self.ends: list[tuple[int, Any] | None] = [None] * cuts
        self.on_cut = on_cut
        self.handles: list[Any] = []
        self.fired = 0

    def hook(self, k: int, tensors: Sequence[Any]) -> None:
        def record(grad: Any) -> None:
            if self.ends[k] is None:
                self.ends[k] = (self.fired, self.on_cut())
                self.fired += 1

        for t in tensors:
            if t.requires_grad and t.grad_fn is not None:
                self.handles.append(t.register_hook(record))

    def __enter__(self) -> _CutHooks:
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def in_order(self) -> list[Any | None]:
        """Per cut its mark where the cuts fired from the last to the first; a mark that
        fired out of that order (a value used again several layers on) is dropped."""
        out: list[Any | None] = [None] * len(self.ends)
        last_fired = -1
        for k in range(len(self.ends) - 1, -1, -1):
            entry = self.ends[k]
            if entry is not None and entry[0] > last_fired:
                out[k] = entry[1]
                last_fired = entry[0]
        return out


def _backward(roots: list[Any], grads: list[Any] | None) -> None:
    import torch

    torch.autograd.backward(roots, grads)
