"""What one aten operation costs on a GPU of the catalog: FLOPs, bytes moved, roofline time.

:class:`OpCounter` is a ``TorchDispatchMode``: while it is active, every aten operation
(forward, and the backward autograd runs) is counted as it executes on fake or meta tensors,
so nothing is computed and no memory is allocated:

- **FLOPs** by torch's own formulas (``torch.utils.flop_counter``: matrix products,
  convolutions, fused attention), plus CPU flash attention and grouped matrix products
  (mixture-of-experts layers), which it does not count. Every other operation (element-wise,
  norms, reductions) counts 0 FLOPs: it is limited by memory traffic. The FLOPs recorded
  are the model's, as Megatron-LM counts them; a fused attention backward's time is charged
  for what its kernel executes, the score matrix computed again included (:class:`OpCost`).
- **bytes**: every tensor the operation reads and writes (a broadcast input counted once,
  views and allocations free, a lookup reading only the rows it gathers).
- **time** = max(FLOPs / (peak at the inputs' precision x efficiency of the op's class),
  bytes / (memory bandwidth x memory efficiency)): matrix products use the ``matmul``
  efficiency, fused attention ``attention``, memory traffic ``memory``
  (:class:`planner.gpus.Efficiency`).

Kernel launch gaps, overlap between kernels and fusion beyond what the operations
themselves do are not modelled (docs/profile.md#analytic-profiles).

Example::

    counter = OpCounter(Roofline(gpu_spec("h100-sxm"), Efficiency()))
    with counter:
        y = layer(x)
    counter.cost.flops, counter.cost.bytes_moved, counter.cost.ms
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from planner.errors import InputError
from planner.gpus import Efficiency, GpuSpec

__all__ = ["OpCost", "OpCounter", "PassCost", "Roofline", "op_bytes", "op_cost", "op_flops"]

aten = torch.ops.aten


@dataclass
class PassCost:
    """FLOPs, bytes moved and roofline milliseconds summed over the operations of a pass.

    Example::

        PassCost(10, 20, 0.5) - PassCost(4, 5, 0.2)   # PassCost(6, 15, 0.3, 0)
    """

    flops: int = 0
    bytes_moved: int = 0
    ms: float = 0.0
    ops: int = 0

    def __sub__(self, other: PassCost) -> PassCost:
        """What this pass does beyond ``other`` (never below zero)."""
        return PassCost(
            max(0, self.flops - other.flops),
            max(0, self.bytes_moved - other.bytes_moved),
            max(0.0, self.ms - other.ms),
            max(0, self.ops - other.ops),
        )


@dataclass(frozen=True)
class OpCost:
    """One operation: its FLOPs, bytes and class (``matmul``, ``attention``, ``memory``).

    ``flops`` are the model's FLOPs, as Megatron-LM and MFU figures count them;
    ``kernel_flops`` (default: the same) what the kernel executes, which the time charges:
    a fused attention backward computes the score matrix again, 2.5x its forward's FLOPs
    where the model's backward is 2x.
    """

    flops: int
    bytes_moved: int
    op_class: str
    precision: str
    kernel_flops: int | None = None

    @property
    def executed_flops(self) -> int:
        return self.flops if self.kernel_flops is None else self.kernel_flops


class Roofline:
    """Time of one operation on ``gpu`` at ``efficiency``.

    Example::

        Roofline(gpu_spec("h100-sxm"), Efficiency()).ms(OpCost(2 * 8192**3, 0, "matmul", "bf16"))
    """

    def __init__(self, gpu: GpuSpec, efficiency: Efficiency):
        self.gpu = gpu
        self.efficiency = efficiency

    def ms(self, cost: OpCost) -> float:
        compute = 0.0
        if cost.executed_flops:
            fraction = getattr(self.efficiency, cost.op_class)
            compute = cost.executed_flops / (self._peak(cost.precision) * fraction)
        traffic = cost.bytes_moved / (self.gpu.memory_bytes_per_s * self.efficiency.memory)
        return max(compute, traffic) * 1e3

    def _peak(self, precision: str) -> float:
        peak = self.gpu.peak_flops_per_s.get(precision)
        if peak is None:
            raise InputError(
                f"the model multiplies {precision} matrices, and GPU {self.gpu.name!r} has no "
                f"{precision} peak in its entry (tflops.{precision})",
                field="--gpu",
            )
        return peak


# ---------------------------------------------------------------- FLOPs


def _sdpa_cpu(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    return int(flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape))


def _sdpa_cpu_backward(grad: Any, query: Any, key: Any, value: Any, *args: Any, **kw: Any) -> int:
    return int(
        flop_counter.sdpa_backward_flop_count(grad.shape, query.shape, key.shape, value.shape)
    )


def _grouped_mm(a: Any, b: Any, *args: Any, **kwargs: Any) -> int:
    """``torch._grouped_mm``: every row of ``a`` meets one group of ``b`` (2d x 3d), or each
    group of the contraction meets its own slice (2d x 2d), or a batch (3d x 3d)."""
    if a.dim() == 2 and b.dim() == 3:  # (S, K) x (G, K, N) -> (S, N)
        return 2 * a.shape[0] * a.shape[1] * b.shape[2]
    if a.dim() == 2 and b.dim() == 2:  # (M, K_all) x (K_all, N) -> (G, M, N)
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    if a.dim() == 3 and b.dim() == 2:  # (G, M, K) x (K, N_all) -> (M, N_all)
        return 2 * a.shape[1] * a.shape[2] * b.shape[1]
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]  # (G, M, K) x (G, K, N)


def _grouped_mm_fallback_backward(inp: Any, weight: Any, *args: Any, **kwargs: Any) -> int:
    return 2 * _grouped_mm(inp, weight)  # the input's and the weights' gradients


_EXTRA_FLOPS: dict[str, Callable[..., int]] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_cpu_backward,
    "aten::_grouped_mm": _grouped_mm,
    # transformers' grouped matrix product where torch's has no kernel (its MoE experts)
    "transformers::grouped_mm_fallback": _grouped_mm,
    "transformers::grouped_mm_fallback_backward": _grouped_mm_fallback_backward,
}

_ATTENTION = {
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_flash_attention_forward",
    "aten::_flash_attention_backward",
    "aten::_efficient_attention_forward",
    "aten::_efficient_attention_backward",
}


# The scaled-dot-product backward kernels at the level torch's formulas see them: their
# arguments start (grad_out, query, key, value) with query (B, H, S, D).
_SDPA_BACKWARD = {
    "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
}


def op_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """FLOPs of one aten operation (0 for operations without a formula).

    Example::

        op_flops(aten.mm.default, (a, b), {}, a @ b)    # 2 * m * k * n
    """
    packet = func._overloadpacket
    formula = flop_counter.flop_registry.get(packet)
    if formula is not None:
        return int(formula(*args, **kwargs, out_val=out))
    extra = _EXTRA_FLOPS.get(func._schema.name)
    return int(extra(*args, **kwargs)) if extra is not None else 0


# ---------------------------------------------------------------- bytes

# Allocations, metadata and scalars move nothing; views are found by their schema.
_FREE = {
    "aten::empty",
    "aten::empty_like",
    "aten::empty_strided",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::_unsafe_view",
    "aten::lift_fresh",
    "aten::_local_scalar_dense",
}
# Operations that only write their output (they read no tensor's values).
_WRITE_ONLY = {
    "aten::zeros",
    "aten::ones",
    "aten::full",
    "aten::zeros_like",
    "aten::ones_like",
    "aten::full_like",
    "aten::new_zeros",
    "aten::new_ones",
    "aten::new_full",
    "aten::fill_",
    "aten::zero_",
    "aten::scalar_tensor",
    "aten::arange",
    "aten::rand_like",
    "aten::randn_like",
}
# Lookups read the rows they gather (and the indices), not their whole table.
_GATHER = {"aten::embedding", "aten::index_select", "aten::gather", "aten::index"}


def _distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor covers (a broadcast dimension counts once)."""
    count = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            count *= int(size)
    return count * t.element_size()


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def op_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """Bytes one aten operation reads and writes.

    Example::

        op_bytes(aten.add.Tensor, (a, b), {}, a + b)   # a, b and the sum
    """
    name = func._schema.name
    outputs = _tensors(out)
    if func.is_view or name in _FREE or not outputs:
        return 0
    written = sum(_distinct_bytes(t) for t in outputs)
    if name in _WRITE_ONLY:
        return written
    inputs = _tensors((args, kwargs))
    if name in _GATHER:
        index = [t for t in inputs if not (t.is_floating_point() or t.is_complex())]
        return 2 * written + sum(_distinct_bytes(t) for t in index)
    if name == "aten::copy_":  # reads the source, writes the destination
        return written + (_distinct_bytes(inputs[1]) if len(inputs) > 1 else 0)
    return written + sum(_distinct_bytes(t) for t in inputs)


def _precision(inputs: list[torch.Tensor]) -> str:
    for t in inputs:
        if t.is_floating_point():
            return _PRECISION_OF.get(t.dtype, str(t.dtype).replace("torch.", ""))
    return "fp32"


_PRECISION_OF = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
}


def op_cost(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> OpCost:
    """FLOPs, bytes, class and precision of one aten operation.

    Example::

        op_cost(aten.mm.default, (a, b), {}, a @ b).op_class   # 'matmul'
    """
    flops = op_flops(func, args, kwargs, out)
    moved = op_bytes(func, args, kwargs, out)
    if not flops:
        return OpCost(0, moved, "memory", "")
    name = func._schema.name
    precision = _precision(_tensors((args, kwargs)))
    if name not in _ATTENTION:
        return OpCost(flops, moved, "matmul", precision)
    if name not in _SDPA_BACKWARD:
        return OpCost(flops, moved, "attention", precision)
    # (grad_out, query, key, value, ...), query (B, H, Sq, D), key (B, Hk, Sk, D)
    query, key = args[1], args[2]
    b, h, s_q, d = (int(x) for x in query.shape)
    recompute = 2 * b * h * s_q * int(key.shape[-2]) * d
    return OpCost(flops - recompute, moved, "attention", precision, kernel_flops=flops)


class OpCounter(TorchDispatchMode):
    """Counts every aten operation run while active into :attr:`cost` (see module docs).

    Example::

        counter = OpCounter(roofline)
        with counter:
            loss.backward()
        counter.cost.ms
    """

    def __init__(self, roofline: Roofline):
        super().__init__()
        self.roofline = roofline
        self.cost = PassCost()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        cost = op_cost(func, args, kwargs, out)
        ms = self.roofline.ms(cost)
        self.cost.flops += cost.flops
        self.cost.bytes_moved += cost.bytes_moved
        self.cost.ms += ms if math.isfinite(ms) else 0.0
        self.cost.ops += 1
        return out
