"""Profiles: measuring a model's layers, and the file format they are stored in."""

from planner.profile.loader import UserModel, default_loss, load_model_file, model_name
from planner.profile.measure import (
    measure_layer,
    optimizer_state_bytes,
    parse_microbatch_sizes,
    profile_model,
)
from planner.profile.schema import (
    SCHEMA,
    Layer,
    LayerTiming,
    Measurement,
    Profile,
    load_profile,
    profile_from_dict,
)
from planner.profile.tied import TiedParameter, find_tied_parameters

__all__ = [
    "SCHEMA",
    "Layer",
    "LayerTiming",
    "Measurement",
    "Profile",
    "TiedParameter",
    "find_tied_parameters",
    "load_profile",
    "profile_from_dict",
    # measuring (torch is imported only when these run; split imports it, so it is lazy)
    "SplitModel",
    "Stage",
    "UserModel",
    "default_loss",
    "discover_split_points",
    "load_model_file",
    "measure_layer",
    "model_name",
    "optimizer_state_bytes",
    "parse_microbatch_sizes",
    "profile_model",
    "split_model",
]

_SPLIT_NAMES = ("SplitModel", "Stage", "discover_split_points", "split_model")


def __getattr__(name: str) -> object:
    # planner.profile.split imports torch; load it on first use so `import planner` stays fast.
    if name in _SPLIT_NAMES:
        from planner.profile import split

        return getattr(split, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
