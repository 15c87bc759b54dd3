"""Files in and out: paths checked up front, atomic output files, JSON and content hashes.

Every file pipeplan writes lands in a temporary file beside the target first and is renamed
over it, so a crash never leaves a half-written profile or plan behind; a command with
several outputs writes them all or none through :class:`planner.outputs.Outputs`, which
checks each path here with :func:`check_output_path` before any work starts. Input paths
are checked by :func:`check_input_file`: a folder, a missing or an unreadable file is one
line naming the path (and the flag, where one gave it).

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
    "check_input_file",
    "check_output_folder",
    "check_output_path",
    "current_umask",
    "json_text",
    "read_json",
    "sha256_file",
    "temp_prefix",
    "write_temp",
]

_NAME_MAX_BYTES = 255  # where the file system does not say (os.pathconf)
_PATH_MAX_BYTES = 4096
_TEMP_STEM_BYTES = 64  # of the target's name kept in its temporary's name


def check_input_file(path: str | os.PathLike[str], *, field: str | None = None) -> Path:
    """Refuse an input path that is missing, a folder or unreadable, with one line naming
    it (and ``field``, the flag or plan field that gave it, where there is one).

    Example::

        check_input_file("profiles/gpt.json", field="--profile")
    """
    source = Path(path)
    where = str(path)
    if source.is_dir():
        raise InputError("is a folder, expected a file", file=where, field=field)
    if not source.exists():
        raise InputError("file does not exist", file=where, field=field)
    if not source.is_file():
        raise InputError(
            "is not a regular file (a device, pipe or socket), expected a file",
            file=where,
            field=field,
        )
    if not os.access(source, os.R_OK, effective_ids=os.access in os.supports_effective_ids):
        raise InputError("cannot be read (permission denied)", file=where, field=field)
    return source


def check_output_path(
    path: str | os.PathLike[str], *, field: str | None = None, make_folder: bool = False
) -> Path:
    """Fail early, before any expensive work, if a file cannot be written at ``path``: its
    folder is missing or not writable, a name in it is longer than the file system allows,
    or the path is a folder (or a device, pipe or socket).

    ``field`` names where the path came from (a CLI flag such as ``-o``); without it the
    error names only the path, as fits a Python API caller. ``make_folder``: a missing
    folder is fine if it can be created (the nearest existing one is checked).

    Example::

        check_output_path("plans/plan.json", field="-o")
    """
    target = Path(path)
    _check_names(target, field)
    parent = _folder_of(target)
    if not parent.is_dir() and not make_folder:
        if parent.exists():
            raise InputError(
                f"{str(parent)!r} is not a folder; expected a file path in a folder",
                file=str(target),
                field=field,
            )
        raise InputError(
            f"output folder {str(parent)!r} does not exist; create it or choose another path",
            file=str(target),
            field=field,
        )
    if target.is_dir():
        raise InputError("is a folder; expected a file path", file=str(target), field=field)
    if target.exists() and not target.is_file():
        raise InputError(
            "is not a regular file (a device, pipe or socket); expected a file path",
            file=str(target),
            field=field,
        )
    _check_writable(_existing_folder(parent, target, field), target, field)
    return target


def check_output_folder(
    path: str | os.PathLike[str], *, field: str | None = None, make_folder: bool = False
) -> Path:
    """Fail early if a folder of outputs cannot be written at ``path``: it exists and is
    not a folder, or it (or, when missing, the folder it would be made in) is not writable.
    ``make_folder``: missing folders above it are fine if they can be created.

    Example::

        check_output_folder("plan-torch", field="-o")
    """
    target = Path(path)
    _check_names(target, field)
    if target.exists() and not target.is_dir():
        raise InputError("exists and is not a folder", file=str(target), field=field)
    if target.is_dir():
        _check_writable(target, target, field)
        return target
    parent = _folder_of(target)
    if not parent.is_dir() and not make_folder:
        raise InputError(
            f"the folder {str(parent)!r} does not exist; create it or choose another path",
            file=str(target),
            field=field,
        )
    _check_writable(_existing_folder(parent, target, field), target, field)
    return target


def _folder_of(target: Path) -> Path:
    return target.parent if str(target.parent) else Path(".")


def _existing_folder(folder: Path, target: Path, field: str | None) -> Path:
    """``folder`` or its nearest existing ancestor, which must be a folder."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(
            f"{str(probe)!r} is not a folder; expected a file path in a folder",
            file=str(target),
            field=field,
        )
    return probe


def _check_names(target: Path, field: str | None) -> None:
    """Each name in the path at most NAME_MAX bytes, the whole at most PATH_MAX."""
    where = _existing_folder_quiet(target)
    name_max = _pathconf(where, "PC_NAME_MAX", _NAME_MAX_BYTES)
    for part in target.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise InputError(
                f"a name in this path is {size} bytes long; the file system allows at most "
                f"{name_max}",
                file=_shorten(str(target)),
                field=field,
            )
    path_max = _pathconf(where, "PC_PATH_MAX", _PATH_MAX_BYTES)
    size = len(os.fsencode(os.path.abspath(target)))
    if size >= path_max:
        raise InputError(
            f"the path is {size} bytes long; the file system allows less than {path_max}",
            file=_shorten(str(target)),
            field=field,
        )


def _existing_folder_quiet(target: Path) -> Path:
    probe = target.parent
    while not probe.is_dir() and probe != probe.parent:
        probe = probe.parent
    return probe if probe.is_dir() else Path(".")


def _pathconf(folder: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):
        return default
    return value if value > 0 else default


def _shorten(text: str, limit: int = 120) -> str:
    """A path fit for one line: its first and last characters around an ellipsis."""
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return f"{text[:half]}...{text[-half:]}"


def _check_writable(folder: Path, target: Path, field: str | None) -> None:
    """Create and remove a temporary file in ``folder``: the one sure test (permissions,
    read-only mounts, immutable folders, whatever the user id)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".pipeplan-check-", suffix=".tmp", dir=folder)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(
            f"cannot write in the folder {str(folder)!r} ({reason})",
            file=_shorten(str(target)),
            field=field,
        ) from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)


def temp_prefix(target: Path) -> str:
    """The prefix of ``target``'s temporary files: hidden, beside it, and short enough that
    a target name at the file system's limit still leaves room for the random part.

    Example::

        temp_prefix(Path("out/plan.json"))   # '.plan.json.'
    """
    stem = os.fsencode(target.name)[:_TEMP_STEM_BYTES].decode("utf-8", "ignore")
    return f".{stem}."


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file and rename.

    Example::

        atomic_write_bytes("params.pt", buffer.getvalue())
    """
    target = check_output_path(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        write_temp(fd, data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_temp(fd: int, data: bytes) -> None:
    """Fill a temporary file made by :func:`tempfile.mkstemp` (and close it): the mode a
    plain ``open()`` would give, the bytes flushed to disk.

    Example::

        fd, tmp = tempfile.mkstemp(dir="out")
        write_temp(fd, b"{}")
    """
    # mkstemp creates the file 0600; give it the mode a plain open() would have.
    os.fchmod(fd, 0o666 & ~current_umask())
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def current_umask() -> int:
    """The process's umask (read without changing it for good).

    Example::

        mode = 0o777 & ~current_umask()
    """
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
    source = check_input_file(path)
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
