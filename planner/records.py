"""Typed records read from decoded JSON and YAML: the one way pipeplan reads its files.

A *record* is a dataclass whose field types say how each field is read, so the type that
code uses is also the description of the file. :func:`read_record` reads a decoded object
(:mod:`planner.datafile` decodes the text strictly) into one; every problem is one
:class:`~planner.errors.InputError` naming the file, the dotted field and what was expected.

A field's type says how it is read:

* ``str`` (a string), ``bool`` (true or false), ``int`` (an integer), ``float`` (a number;
  an integer is kept as written), ``Any`` (anything), ``dict[str, Any]`` (any object);
* ``Annotated[T, kind]``: the :class:`Kind` checks and converts it (the limits of
  :mod:`planner.limits`: :class:`Integer`, :class:`Number`, :data:`NAME`, :class:`Text`,
  :class:`OneOf`, or any :class:`Kind`);
* another record: read in turn (its fields named ``outer.inner``);
* ``list[T]``, ``tuple[T, ...]`` (items named ``list[i]``) and ``tuple[A, B]`` (exactly
  two); ``dict[str, T]`` (values named ``object.key``); ``Annotated[list[T], Length(...)]``
  bounds the count and ``Annotated[dict[str, T], Keys(kind)]`` checks the keys;
* ``T | None``: null is allowed.

A field with a default may be left out, and null means the same as leaving it out (unless
its type allows None). A key the record does not name is refused, naming the fields it
does name; a record with an ``extra: dict[str, Any]`` field keeps such keys there instead
(facts a newer pipeplan wrote, written back unchanged).

Example::

    @dataclass
    class Link:
        between: tuple[str, str]
        bandwidth_bytes_per_s: Annotated[float, Number(low=1.0, high=1e18)]
        count: Annotated[int, Integer(1, 10_000)] = 1

    read_record(Link, {"between": ["a", "b"], "bandwidth_bytes_per_s": 1e9}, file="t.json")
    read_record(Link, {"between": ["a"], "bandwidth_bytes_per_s": 1e9}, file="t.json")
    # InputError: t.json: between: expected [a, b] (2 entries), got ['a']
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin, get_type_hints

from planner.errors import InputError
from planner.limits import (
    MAX_BYTES,
    MAX_NAME_CHARS,
    MAX_TIME_MS,
    check_int,
    check_name,
    check_number,
    short_repr,
)

__all__ = [
    "NAME",
    "EMPTY_IS_NONE",
    "ByteCount",
    "Default",
    "Milliseconds",
    "Name",
    "Integer",
    "Keys",
    "Kind",
    "Length",
    "Number",
    "OneOf",
    "Text",
    "read_record",
    "record_dict",
    "read_value",
]

T = TypeVar("T")

_MISSING: Any = object()


class Kind:
    """How one value is checked and converted: ``expected`` says what a good value is;
    ``check`` returns the value to keep or raises an InputError (its file and field are
    filled in by the reader). Give the check as a function, or subclass and override it.

    Example::

        OPTIMIZER = Kind("an optimizer", lambda v: check_optimizer(v, field=""))
    """

    def __init__(self, expected: str, check: Callable[[Any], Any] | None = None) -> None:
        self.expected = expected
        self._check = check

    def check(self, value: Any) -> Any:
        """The value to keep; an InputError (without file or field) when it is bad."""
        assert self._check is not None, "a Kind needs a check function or a subclass"
        return self._check(value)

    def fail(self, value: Any) -> typing.NoReturn:
        """Refuse ``value``: ``expected ..., got ...``.

        Example::

            Integer(1, 10).fail(0)   # InputError: expected an integer from 1 to 10, got 0
        """
        raise InputError(f"expected {self.expected}, got {short_repr(value)}")


class Integer(Kind):
    """An integer from ``low`` to ``high`` (:func:`planner.limits.check_int`: a float with
    an integral value counts); without ``high``, any integer >= ``low``.

    Example::

        Integer(1, MAX_MICROBATCHES).check(8)     # 8
    """

    def __init__(self, low: int = 0, high: int | None = None) -> None:
        text = f"an integer >= {low}" if high is None else f"an integer from {low:,} to {high:,}"
        super().__init__(text)
        self.low, self.high = low, high

    def check(self, value: Any) -> Any:
        if self.high is None:
            if isinstance(value, bool) or not isinstance(value, int) or value < self.low:
                self.fail(value)
            return value
        return check_int(value, field="", low=self.low, high=self.high)


class Number(Kind):
    """A finite number from ``low`` to ``high`` as a float
    (:func:`planner.limits.check_number`).

    Example::

        Number(high=MAX_TIME_MS).check(3)         # 3.0
    """

    def __init__(self, low: float = 0.0, high: float = float("inf"), unit: str = "") -> None:
        super().__init__(f"a finite number from {low:g}{unit} to {high:g}{unit}")
        self.low, self.high, self.unit = low, high, unit

    def check(self, value: Any) -> Any:
        return check_number(value, field="", low=self.low, high=self.high, unit=self.unit)


class OneOf(Kind):
    """One of the given strings.

    Example::

        OneOf(("forward", "backward")).check("forward")
    """

    def __init__(self, choices: Iterable[str]) -> None:
        self.choices = tuple(choices)
        super().__init__(f"one of {', '.join(self.choices)}")

    def check(self, value: Any) -> Any:
        if not isinstance(value, str) or value not in self.choices:
            self.fail(value)
        return value


class Text(Kind):
    """Free text (a description, a version): a string of at most ``limit`` characters,
    shown escaped and never run.

    Example::

        Text().check("2.13.0")
    """

    def __init__(self, limit: int = MAX_NAME_CHARS) -> None:
        super().__init__(f"a string of at most {limit} characters")
        self.limit = limit

    def check(self, value: Any) -> Any:
        if not isinstance(value, str) or len(value) > self.limit:
            raise InputError(f"expected {self.expected}")
        return value


NAME = Kind("a name", lambda value: check_name(value, field=None))
"""A name (:func:`planner.limits.check_name`: printable, at most ``MAX_NAME_CHARS``)."""


Name = Annotated[str, NAME]
"""A name field: ``name: Name``."""

Milliseconds = Annotated[float, Number(high=MAX_TIME_MS)]
"""A time in milliseconds within :data:`~planner.limits.MAX_TIME_MS`, read as a float."""

ByteCount = Annotated[int, Integer(0, MAX_BYTES)]
"""A size or count within :data:`~planner.limits.MAX_BYTES`."""


@dataclasses.dataclass(frozen=True)
class Default:
    """The value of a field left out of the file (or null), where the dataclass itself
    has no default (``Annotated[int, Integer(0, MAX_BYTES), Default(0)]``)."""

    value: Any


EMPTY_IS_NONE = "empty object is None"
"""Marks an optional record field whose file may write "none" as ``{}``
(``Annotated[Prediction | None, EMPTY_IS_NONE]``)."""


@dataclasses.dataclass(frozen=True)
class Length:
    """How many entries a list may hold (``Annotated[list[T], Length(1, MAX_LAYERS,
    "layer")]``); ``noun`` names one entry in messages."""

    low: int = 0
    high: int | None = None
    noun: str = "entry"


@dataclasses.dataclass(frozen=True)
class Keys:
    """How an object's keys are checked (``Annotated[dict[str, T], Keys(kind)]``)."""

    kind: Kind


def read_record(
    cls: type[T], data: Any, *, file: str | None, field: str = "", ignore: Iterable[str] = ()
) -> T:
    """``data`` (a decoded JSON or YAML object) read into the record ``cls``; the first
    problem is one InputError naming ``file`` and the dotted field (under ``field``).
    ``ignore``: keys checked elsewhere (a file's ``schema``).

    Example::

        read_record(FileRef, {"path": "p.json", "sha256": None}, file="plan.json",
                    field="profile")
    """
    record: _Record = _record(cls)  # type: ignore[arg-type]
    return record.read(data, field, file, frozenset(ignore))


def read_value(tp: Any, data: Any, *, file: str | None, field: str) -> Any:
    """``data`` read as the type ``tp`` (any field type a record may have).

    Example::

        read_value(list[Baseline], raw, file="plan.json", field="baselines")
    """
    return _reader(tp).read(data, field, file)


def record_dict(record: Any) -> dict[str, Any]:
    """A record as the JSON object :func:`read_record` reads back: every field by name
    (nested records as objects, tuples as lists, a part with a ``to_dict`` by it), the keys
    of ``extra`` merged in.

    Example::

        record_dict(Placement(["a"], {"a": 0}, 1, "cpu"))["rank_of"]    # {'a': 0}
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name == "extra":
            out.update(value)
        elif f.init:
            out[f.name] = _plain_value(value)
    return out


def _plain_value(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_dict(value)
    if isinstance(value, list | tuple):
        return [_plain_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_value(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------- readers


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _at(exc: InputError, file: str | None, field: str) -> InputError:
    """``exc`` (raised by a kind) named at ``file`` and ``field`` where it names neither (a
    kind that reads a whole part names the field inside it itself)."""
    if exc.field and exc.file:
        return exc
    return InputError(exc.message, file=exc.file or file, field=exc.field or field or None)


class _Reader:
    """Reads one value of a type: ``read(value, field, file)``; ``leaf`` is the kind's
    check when the value holds nothing to name inside (no nested fields)."""

    expected: str = "a value"
    leaf: Callable[[Any], Any] | None = None

    def read(self, value: Any, field: str, file: str | None) -> Any:
        assert self.leaf is not None
        try:
            return self.leaf(value)
        except InputError as exc:
            raise _at(exc, file, field) from None


class _Leaf(_Reader):
    def __init__(self, kind: Kind) -> None:
        self.expected = kind.expected
        self.leaf = kind.check


def _plain(expected: str, ok: Callable[[Any], bool]) -> _Leaf:
    def check(value: Any) -> Any:
        if not ok(value):
            raise InputError(f"expected {expected}, got {short_repr(value)}")
        return value

    return _Leaf(Kind(expected, check))


_PLAIN: dict[Any, _Reader] = {
    str: _plain("a string", lambda v: isinstance(v, str)),
    bool: _plain("true or false", lambda v: isinstance(v, bool)),
    int: _plain("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: _plain("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    Any: _Leaf(Kind("a value", lambda v: v)),
}


class _Optional(_Reader):
    def __init__(self, inner: _Reader, *, empty_is_none: bool = False) -> None:
        self.inner, self.empty_is_none = inner, empty_is_none
        self.expected = f"{inner.expected} (or null)"

    def read(self, value: Any, field: str, file: str | None) -> Any:
        if value is None or (self.empty_is_none and value == {}):
            return None
        return self.inner.read(value, field, file)


class _List(_Reader):
    def __init__(self, item: _Reader, length: Length, *, as_tuple: bool) -> None:
        self.item, self.length, self.as_tuple = item, length, as_tuple
        if isinstance(item, _Record):
            self.expected = f"a list of objects {item.expected.removeprefix('an object ')}"
        else:
            self.expected = f"a list of {item.expected}"

    def read(self, value: Any, field: str, file: str | None) -> Any:
        if not isinstance(value, list):
            raise InputError(f"expected a list, got {short_repr(value)}", file=file, field=field)
        low, high = self.length.low, self.length.high
        if len(value) < low:
            noun = self.length.noun
            plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
            what = f"one {noun}" if low == 1 else f"{low:,} {plural}"
            raise InputError(f"expected at least {what}", file=file, field=field)
        if high is not None and len(value) > high:
            raise InputError(
                f"{len(value):,} entries; expected at most {high:,}", file=file, field=field
            )
        item = self.item
        if item.leaf is not None:
            try:
                out = [item.leaf(v) for v in value]
            except InputError as exc:  # name the entry at fault
                for i, v in enumerate(value):
                    item.read(v, f"{field}[{i}]", file)
                raise exc from None
        else:
            out = [item.read(v, f"{field}[{i}]", file) for i, v in enumerate(value)]
        return tuple(out) if self.as_tuple else out


class _Pair(_Reader):
    def __init__(self, items: tuple[_Reader, ...]) -> None:
        self.items = items
        self.expected = f"[{', '.join('ab'[: len(items)])}] ({len(items)} entries)"

    def read(self, value: Any, field: str, file: str | None) -> Any:
        if not isinstance(value, list | tuple) or len(value) != len(self.items):
            raise InputError(
                f"expected {self.expected}, got {short_repr(value)}", file=file, field=field
            )
        return tuple(
            r.read(v, f"{field}[{i}]", file)
            for i, (r, v) in enumerate(zip(self.items, value, strict=True))
        )


class _Dict(_Reader):
    def __init__(self, value: _Reader, keys: Keys | None) -> None:
        self.value, self.keys = value, keys
        self.expected = "an object" if keys is None else f"an object keyed by {keys.kind.expected}"

    def read(self, value: Any, field: str, file: str | None) -> Any:
        if not isinstance(value, dict):
            raise InputError(
                f"expected {self.expected}, got {short_repr(value)}", file=file, field=field
            )
        if self.keys is not None:
            for key in value:
                try:
                    self.keys.kind.check(key)
                except InputError as exc:
                    raise _at(exc, file, _join(field, str(key))) from None
        if self.value is _PLAIN[Any]:
            return dict(value)
        return {k: self.value.read(v, _join(field, str(k)), file) for k, v in value.items()}


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    reader: _Reader
    required: bool  # no default: the key must be there
    nullable: bool  # null is a value (the type allows None)
    default: Any = _MISSING  # a Default(...) mark's value, given when the key is left out


class _Record(_Reader):
    def __init__(self, cls: type) -> None:
        self.cls = cls
        hints = get_type_hints(cls, include_extras=True)
        self.fields: list[_Field] = []
        self.keep_extra = False
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.name == "extra":
                self.keep_extra = True
                continue
            tp = hints[f.name]
            marks = get_args(tp)[1:] if get_origin(tp) is Annotated else ()
            default = next((m.value for m in marks if isinstance(m, Default)), _MISSING)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            required = required and default is _MISSING
            self.fields.append(_Field(f.name, _reader(tp), required, _allows_none(tp), default))
        self.keys = frozenset(f.name for f in self.fields)
        names = [f.name for f in self.fields]
        more = ", ..." if len(names) > 4 else ""
        self.expected = f"an object {{{', '.join(names[:4])}{more}}}"

    def read(
        self, data: Any, field: str, file: str | None, ignore: frozenset[str] = frozenset()
    ) -> Any:
        if not isinstance(data, dict):
            raise InputError(
                f"expected {self.expected}, got {short_repr(data)}", file=file, field=field or None
            )
        extra = self._unknown(data, field, file, ignore)
        values: dict[str, Any] = {}
        for f in self.fields:
            value = data.get(f.name, _MISSING)
            if value is None and f.nullable:
                values[f.name] = None
                continue
            if value is _MISSING or (value is None and not f.required):
                if f.required:
                    raise InputError(
                        f"missing; expected {f.reader.expected}",
                        file=file,
                        field=_join(field, f.name),
                    )
                if f.default is not _MISSING:
                    values[f.name] = f.default
                continue  # else the dataclass's default
            leaf = f.reader.leaf
            if leaf is None:
                values[f.name] = f.reader.read(value, _join(field, f.name), file)
                continue
            try:
                values[f.name] = leaf(value)
            except InputError as exc:
                raise _at(exc, file, _join(field, f.name)) from None
        if extra is not None:
            values["extra"] = extra
        return self.cls(**values)

    def _unknown(
        self, data: dict[str, Any], field: str, file: str | None, ignore: frozenset[str]
    ) -> dict[str, Any] | None:
        """The keys this record does not name: kept (``extra``) or the first refused."""
        if self.keys.issuperset(data):
            return {} if self.keep_extra else None
        rest = {k: v for k, v in data.items() if k not in self.keys and k not in ignore}
        if self.keep_extra or not rest:
            return rest if self.keep_extra else None
        key = next(iter(rest))
        hint = getattr(self.cls, "UNKNOWN_HINT", "")
        raise InputError(
            f"unknown field; expected one of {', '.join(sorted(self.keys | ignore))}"
            + (f" ({hint})" if hint else ""),
            file=file,
            field=_join(field, str(key)),
        )


def _allows_none(tp: Any) -> bool:
    if get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


@functools.cache
def _record(cls: type) -> _Record:
    return _Record(cls)


@functools.cache
def _reader(tp: Any) -> _Reader:
    """The reader of a field type (built once per type)."""
    if tp in _PLAIN:
        return _PLAIN[tp]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _record(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        inner, *marks = args
        kinds = [m for m in marks if isinstance(m, Kind)]
        if kinds:
            return _Leaf(kinds[0])
        length = next((m for m in marks if isinstance(m, Length)), None)
        keys = next((m for m in marks if isinstance(m, Keys)), None)
        if EMPTY_IS_NONE in marks:
            reader = _reader(inner)
            assert isinstance(reader, _Optional), f"{EMPTY_IS_NONE} marks an optional field"
            return _Optional(reader.inner, empty_is_none=True)
        if length is None and keys is None:
            return _reader(inner)
        return _container(inner, length or Length(), keys)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"a record field may be one type or None, not {tp}")
        return _Optional(_reader(rest[0]))
    return _container(tp, Length(), None)


def _container(tp: Any, length: Length, keys: Keys | None) -> _Reader:
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return _List(_reader(args[0]), length, as_tuple=False)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _List(_reader(args[0]), length, as_tuple=True)
    if origin is tuple:
        return _Pair(tuple(_reader(a) for a in args))
    if origin is dict:
        return _Dict(_reader(args[1]), keys)
    raise TypeError(f"no reader for {tp!r}")
