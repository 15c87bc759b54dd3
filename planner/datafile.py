"""Reading JSON and YAML data files strictly: one InputError for whatever a file holds wrong.

Profiles, plans, topologies, stages and schedule files are read whole and decoded here, so
that every reader refuses the same things with one line naming the file (and, where it has
one, the field): a file over :data:`~planner.limits.MAX_FILE_BYTES`, text that is not
UTF-8, syntax errors, a key given twice in one object (``object_pairs_hook``; YAML too,
which would otherwise keep the last), an integer of more than
:data:`~planner.limits.MAX_INT_DIGITS` digits (Python refuses 4,300 with a traceback),
``NaN``/``Infinity`` or a float that overflows (``1e400``), and nesting deeper than
:data:`~planner.limits.MAX_NESTING` (or so deep that the parser itself gives up). Messages
never quote the file's content: a file that is not the expected format may hold anything.

Example::

    data = read_data("topologies/nvlink.yaml", what="a topology YAML")
    decode_json('{"a": 1, "a": 2}', source="p.json")   # InputError: a: duplicate key
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.limits import MAX_FILE_BYTES, MAX_INT_DIGITS, MAX_NESTING

__all__ = ["decode_json", "decode_yaml", "read_data", "read_text"]


class _LongInt:
    """An integer literal too long to convert; reported with its field after decoding."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


class _Pairs(dict[str, Any]):
    """A decoded object that named ``duplicate`` twice (reported with its field)."""

    duplicate: str | None = None


def read_text(path: str | os.PathLike[str], *, what: str) -> str:
    """The UTF-8 text of a data file no larger than :data:`MAX_FILE_BYTES`.

    Example::

        read_text("plan.json", what="a plan JSON")
    """
    source = Path(path)
    if not source.is_file():
        raise InputError("file does not exist", file=str(path))
    with open(source, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InputError(
            f"file is larger than {MAX_FILE_BYTES // 2**20} MiB; expected {what}", file=str(path)
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"not UTF-8 text; expected {what}", file=str(path)) from None


def read_data(path: str | os.PathLike[str], *, what: str) -> Any:
    """A JSON (``.json``) or YAML (any other name) data file, decoded and checked.

    Example::

        read_data("stages.yaml", what="a stages file")
    """
    text = read_text(path, what=what)
    if str(path).lower().endswith(".json"):
        return decode_json(text, source=str(path))
    return decode_yaml(text, source=str(path))


def decode_json(text: str, *, source: str) -> Any:
    """JSON text decoded, refusing duplicate keys, long integers, non-finite numbers and
    deep nesting with one InputError naming ``source`` and the field.

    Example::

        decode_json('{"layers": [1, 2]}', source="p.json")
    """

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = _Pairs()
        for key, value in items:
            if key in out and out.duplicate is None:
                out.duplicate = key
            out[key] = value
        return out

    def integer(digits: str) -> int | _LongInt:
        count = len(digits.lstrip("-"))
        return _LongInt(count) if count > MAX_INT_DIGITS else int(digits)

    try:
        data = json.loads(
            text,
            object_pairs_hook=pairs,
            parse_int=integer,
            parse_constant=float,  # NaN, Infinity: found by the walk below, with the field
        )
    except json.JSONDecodeError as exc:
        # The position only: the message never quotes the file's content.
        raise InputError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", file=source
        ) from None
    except RecursionError:
        raise InputError(f"nested deeper than {MAX_NESTING} levels", file=source) from None
    _check_tree(data, source)
    return data


def decode_yaml(text: str, *, source: str) -> Any:
    """YAML text decoded with ``yaml``'s safe loader (no code runs), with the checks of
    :func:`decode_json` (a merge key ``<<`` may repeat what it merges).

    Example::

        decode_yaml("devices: []\\nlinks: []", source="t.yaml")
    """
    import yaml

    try:
        data = yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        if "nesting depth" in str(problem):
            raise InputError(f"nested deeper than {MAX_NESTING} levels", file=source) from None
        raise InputError(f"not valid YAML{at}: {problem}", file=source) from None
    except RecursionError:
        raise InputError(f"nested deeper than {MAX_NESTING} levels", file=source) from None
    _check_tree(data, source)
    return data


_LOADER: Any = None


def _strict_loader() -> Any:
    """yaml's safe loader (the C one where built) that marks duplicate keys and long
    integers for :func:`_check_tree` instead of keeping the last key or raising ValueError."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc,valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            duplicate = None
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen and duplicate is None:
                        duplicate = key
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeConstructor says so
                    pass
            out = _Pairs(super().construct_mapping(node, deep=deep))
            out.duplicate = None if duplicate is None else str(duplicate)
            return out

        def construct_yaml_map(self, node: Any) -> Any:
            data = _Pairs()
            yield data
            value = self.construct_mapping(node)
            data.update(value)
            data.duplicate = value.duplicate

        def construct_yaml_int(self, node: Any) -> Any:
            digits = sum(ch.isalnum() for ch in str(node.value))
            if digits > MAX_INT_DIGITS:
                return _LongInt(digits)
            return super().construct_yaml_int(node)

    StrictLoader.add_constructor("tag:yaml.org,2002:map", StrictLoader.construct_yaml_map)
    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    _LOADER = StrictLoader
    return _LOADER


def _check_tree(data: Any, source: str) -> None:
    """Walk the decoded value once (without recursion; YAML aliases are visited once):
    the first duplicate key, long integer, non-finite number or nesting beyond
    :data:`MAX_NESTING` is one InputError naming its field."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    seen: set[int] = set()
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, _LongInt):
            raise InputError(
                f"an integer of {value.digits} digits; expected at most {MAX_INT_DIGITS}",
                file=source,
                field=where or None,
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(
                f"expected a finite number, got {value!r}", file=source, field=where or None
            )
        if not isinstance(value, dict | list) or id(value) in seen:
            continue
        seen.add(id(value))
        if depth >= MAX_NESTING:  # named by its top-level key: the full path is as deep
            top = re.split(r"[.\[]", where, maxsplit=1)[0]
            raise InputError(
                f"nested deeper than {MAX_NESTING} levels", file=source, field=top or None
            )
        if isinstance(value, _Pairs) and value.duplicate is not None:
            raise InputError(
                f"key {value.duplicate!r} is given twice; expected each key once",
                file=source,
                field=where or None,
            )
        if isinstance(value, dict):
            items = [(f"{where}.{k}" if where else str(k), v) for k, v in value.items()]
        else:
            items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        stack.extend((v, path, depth + 1) for path, v in reversed(items))
