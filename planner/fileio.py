"""Atomic output files and content hashes.

Every file pipeplan writes goes through :func:`atomic_write_text`: the bytes land in a
temporary file beside the target and are renamed over it, so a crash never leaves a
half-written profile or plan behind.

Example::

    check_output_path("profiles/gpt.json")
    atomic_write_json("profiles/gpt.json", {"schema": "pipeplan.profile/v1"})
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from planner.datafile import decode_json, read_text
from planner.errors import InputError

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "check_output_path",
    "json_text",
    "read_json",
    "sha256_file",
]


def check_output_path(path: str | os.PathLike[str], *, field: str | None = None) -> Path:
    """Fail early, before any expensive work, if ``path`` cannot be written.

    ``field`` names where the path came from (a CLI flag such as ``-o``); without it the
    error names only the path, as fits a Python API caller.

    Example::

        check_output_path("plans/plan.json", field="-o")
    """
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(
            f"output folder {str(parent)!r} does not exist; create it or choose another path",
            file=str(target),
            field=field,
        )
    if target.is_dir():
        raise InputError("is a folder; expected a file path", file=str(target), field=field)
    return target


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file and rename.

    Example::

        atomic_write_bytes("params.pt", buffer.getvalue())
    """
    target = check_output_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp creates the file 0600; give it the mode a plain open() would have.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically.

    Example::

        atomic_write_text("plan.svg", svg)
    """
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically.

    Example::

        atomic_write_json("plan.json", plan.to_dict())
    """
    return atomic_write_text(path, json_text(obj, file=str(path)))


def json_text(obj: Any, *, file: str | None = None) -> str:
    """``obj`` as pipeplan writes JSON (indented, one trailing newline) that any JSON
    reader accepts: a NaN or Infinity (which ``json.dumps`` would write as the non-JSON
    ``NaN``/``Infinity``) is one InputError naming the field instead; ``file`` names the
    file it was going to.

    Example::

        json_text({"a": 1})   # '{\\n "a": 1\\n}\\n'
    """
    try:
        return json.dumps(obj, indent=1, allow_nan=False) + "\n"
    except ValueError:
        where, value = _first_non_finite(obj, "")
        raise InputError(
            f"the result is {value!r}, which JSON cannot hold; the inputs give numbers too "
            "large to represent (see docs/limits.md)",
            file=file,
            field=where or None,
        ) from None


def _first_non_finite(obj: Any, where: str) -> tuple[str, float]:
    stack: list[tuple[Any, str]] = [(obj, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return at, value
        if isinstance(value, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(value))
    return where, math.nan


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file strictly (:mod:`planner.datafile`), turning a missing file, bad
    syntax, a duplicate key or a number out of range into an :class:`InputError`.

    Example::

        data = read_json("profiles/gpt.json")
    """
    source = Path(path)
    if not source.is_file():
        raise InputError("file does not exist", file=str(source))
    # Strict: duplicate keys, long integers, NaN/Infinity, deep nesting, huge files refused.
    return decode_json(read_text(source, what="a JSON file"), source=str(source))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes.

    Example::

        sha256_file("profiles/gpt.json") == plan.profile.sha256
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
