"""Synthetic profiles that several test files share, built in one place so that each test
names only what it varies."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner.cost import synthetic_profile, synthetic_tensor_parallel
from planner.profile.schema import Profile

MIB = 2**20


def eight_heavy_layers(
    *,
    saved_bytes: int,
    degrees: Sequence[int] = (),
    sequence_parallel: bool = True,
) -> Profile:
    """Eight heavy transformer-like layers (20 ms per pass and backward half, 200 MiB of
    parameters and 400 MiB of optimizer state each) with big activations (128 MiB in and
    out), each layer keeping ``saved_bytes`` for its backward; with tensor-parallel entries
    (:func:`planner.cost.synthetic_tensor_parallel`) for ``degrees`` when given, and
    ``tp*-sp`` ones too unless ``sequence_parallel`` is off.

    Big stashes (3 GiB: test_memory_floor.py, test_peer_pass_over.py) overflow a tight
    device without recompute in most configurations; small ones (1 MiB:
    test_mesh_search.py) leave memory aside, and with two microbatches a pipeline idles,
    so tensor parallelism pays on NVLink but not over PCIe.

    Example::

        profile = eight_heavy_layers(saved_bytes=3072 * MIB, degrees=(2, 4))
    """
    profile = synthetic_profile(
        8,
        forward_ms=20.0,
        backward_input_ms=20.0,
        backward_weight_ms=20.0,
        param_bytes=200 * MIB,
        optimizer_state_bytes=400 * MIB,
        output_bytes=128 * MIB,
        saved_bytes=saved_bytes,
        input_bytes=128 * MIB,
    )
    if not degrees:
        return profile
    return synthetic_tensor_parallel(profile, degrees, sequence_parallel=sequence_parallel)


def pcie_mixed_profile() -> Profile:
    """Six light layers of big activations, then two heavy ones of big weights and small
    activations, with TP2 entries without SP: on PCIe the heavy stage is better as a TP2
    group, the light one replicated (the degree-descent tests of
    test_mesh_search.py and test_search_budget.py).

    Example::

        profile = pcie_mixed_profile()   # 8 layers, tp2 shards
    """
    base = synthetic_profile(
        8,
        forward_ms=2.0,
        backward_input_ms=2.0,
        backward_weight_ms=2.0,
        param_bytes=MIB,
        optimizer_state_bytes=2 * MIB,
        output_bytes=256 * MIB,
        saved_bytes=MIB,
        input_bytes=256 * MIB,
    )
    heavy = {"param_bytes": 1024 * MIB, "optimizer_state_bytes": 2048 * MIB}
    layers = [
        dataclasses.replace(ly, **heavy) if i >= 6 else ly for i, ly in enumerate(base.layers)
    ]
    slow = {"forward_ms": 20.0, "backward_ms": 40.0, "backward_input_ms": 20.0}
    slow |= {"backward_weight_ms": 20.0, "output_bytes": MIB}
    measured = [
        dataclasses.replace(
            m,
            layers=[
                dataclasses.replace(t, **slow) if i >= 6 else t for i, t in enumerate(m.layers)
            ],
        )
        for m in base.measurements
    ]
    profile = dataclasses.replace(base, layers=layers, measurements=measured)
    return synthetic_tensor_parallel(profile, (2,), sequence_parallel=False)
