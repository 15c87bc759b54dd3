"""A model file against the profile its plan was made from: the one check of ``run`` and
``export``, with one set of messages.

Two checks: :func:`check_source`, that the model.py is the one profiled (its bytes' sha256
against the profile's ``source_sha256``; it runs no user code), and :func:`check_split`,
that the model, captured and split as the profile did (:class:`ProfiledSplit`: its capture
method and ``--split-at``), has the profile's layers, in order, and as many as the plan's
stages cover. ``run``'s launcher makes the first and every rank the second (the launcher
never runs the user's code); ``export`` makes both in its child process.

Example::

    expected = ProfiledSplit.of(profile)
    check_source("model.py", sha256_file("model.py"), profile)
    split = capture_model(model, inputs, expected.split_at, capture=expected.capture)
    check_split(split, expected, model="model.py", covered=6)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.errors import InputError

if TYPE_CHECKING:
    from planner.profile.schema import Profile
    from planner.profile.split import SplitModel

__all__ = ["ProfiledSplit", "check_source", "check_split"]


@dataclass(frozen=True)
class ProfiledSplit:
    """How to capture and split a model as its profile did, and the layers that must come
    out (``layer_names``: the profile's; None when the plan's profile was not found, and
    then ``capture`` is ``auto``: only the plan's layer count is checked).

    Example::

        ProfiledSplit.of(load_profile("profiles/gpt.json")).capture     # 'fx'
    """

    capture: str = "auto"
    split_at: str | None = None
    layer_names: tuple[str, ...] | None = None

    @classmethod
    def of(cls, profile: Profile) -> ProfiledSplit:
        """The split ``profile`` was measured with.

        Example::

            ProfiledSplit.of(profile).layer_names[:2]
        """
        return cls(
            profile.settings.capture_method,
            profile.settings.split_at,
            tuple(layer.name for layer in profile.layers),
        )


def check_source(model: str, source_sha256: str, profile: Profile) -> None:
    """Refuse a model.py whose bytes (``source_sha256``) are not those the profile was
    measured on (a profile that records none, an imported one, is not checked).

    Example::

        check_source("model.py", sha256_file("model.py"), profile)
    """
    if profile.source_sha256 and profile.source_sha256 != source_sha256:
        raise InputError(
            f"this model.py is not the one profiled for the plan (its sha256 "
            f"{source_sha256[:12]} differs from the profile's {profile.source_sha256[:12]}); "
            "profile and solve again, or pass the right --model",
            file=model,
            field="source_sha256",
        )


def check_split(split: SplitModel, expected: ProfiledSplit, *, model: str, covered: int) -> None:
    """Refuse a model that splits into other layers than its profile has, or into another
    number than the plan's stages cover (``covered``: the last stage's last layer + 1).

    Example::

        check_split(split, ProfiledSplit.of(profile), model="model.py", covered=6)
    """
    names = expected.layer_names
    if names is not None and tuple(split.names) != names:
        raise InputError(
            f"the model splits into {split.num_layers} layers {split.names[:4]}... but the "
            f"profile has {len(names)} {list(names[:4])}...; profile again",
            file=model,
            field="layers",
        )
    if covered != split.num_layers:
        raise InputError(
            f"the plan's stages cover {covered} layers but the model splits "
            f"into {split.num_layers}",
            file=model,
            field="stages",
        )
