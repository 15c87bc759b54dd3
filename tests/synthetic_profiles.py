"""Synthetic profiles that several test files share, built in one place so that each test
names only what it varies."""

from __future__ import annotations

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
