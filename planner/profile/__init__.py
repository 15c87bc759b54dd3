"""Profiles: measuring a model's layers, and the file format they are stored in."""

from planner.profile.schema import (
    SCHEMA,
    Layer,
    LayerTiming,
    Measurement,
    Profile,
    load_profile,
    profile_from_dict,
)

__all__ = [
    "SCHEMA",
    "Layer",
    "LayerTiming",
    "Measurement",
    "Profile",
    "load_profile",
    "profile_from_dict",
]
