"""The one place records are serialised: JSON objects <-> dataclasses, checked field by field.

A record type is a dataclass whose fields are the JSON object's keys, with ``to_json`` /
``from_json`` methods that call :func:`to_json` / :func:`from_json` here. Reading checks every
field against the dataclass's annotations (``str``, ``int``, ``float``, ``bool``, ``None``,
``Any``, ``Literal[...]``, ``list[X]``, ``dict[str, X]``, unions, nested record types and
enums with a ``from_json``) and refuses, with a :class:`RecordError` naming the field:

- a key the type does not have (``unknown field 'x'; allowed: [...]``);
- a key the type requires (a field without a default) that is not there;
- a value of the wrong type (``field 'run.verdict': 'MAYBE' is not a verdict; ...``).

Files written by earlier versions lack keys that were added later. Two ways to read them so
that a record read from an old file writes back the same object, key for key:

- the field defaults to :data:`ABSENT`, which :func:`to_json` leaves out (where "not there" means
  something of its own, e.g. a triage record's grading before it is graded). ``ABSENT`` is
  falsy; test ``x is ABSENT`` where None also means something;
- the field is declared with :func:`later` (its default is what an old file meant) and the
  record has an :func:`absent_keys` field: ``from_json`` notes there which ``later`` keys the
  file lacked, and ``to_json`` leaves those out again (the code sees the plain default).

A key that only some writers add (e.g. a probe site's ``kernel`` under ``cutedebug exec``) is
declared with :func:`optional`: read as its default when missing, written only when set.

A key that cannot be a field name (a Python keyword, e.g. ``class``) is declared with
:func:`named`: the field ``class_ = named("class")`` is the JSON key ``class``.

Imports no other cutedebug module (every layer may use it).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import gzip
import types
import typing
from typing import Any, Literal, TypeVar, Union

__all__ = [
    "ABSENT",
    "Absent",
    "RecordError",
    "absent_keys",
    "from_json",
    "later",
    "named",
    "optional",
    "join",
    "present",
    "to_json",
    "transient",
    "to_json_value",
]

R = TypeVar("R")


class Absent(enum.Enum):
    """A key the file did not have (written by a version before it existed)."""

    ABSENT = "absent"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = Absent.ABSENT


class RecordError(ValueError):
    """A JSON object that is not a record of the expected type; the message names the field."""


class Record:
    """The base of every record dataclass: its one ``to_json`` / ``from_json`` pair, this
    module's (a record class adds fields, never its own serialiser)."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        return from_json(cls, data, where)


def read_text(path: Any) -> str:
    """A record file's text, as written or gzipped (``*.gz``: reports keep large records so)."""
    path = str(path)
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def present(value: Any, default: Any = None) -> Any:
    """``value``, or ``default`` when the file did not have it."""
    return default if value is ABSENT else value


_LATER = "cutedebug.records.later"
_TRANSIENT = "cutedebug.records.transient"
_OPTIONAL = "cutedebug.records.optional"
_ABSENT_KEYS = "cutedebug.records.absent_keys"
_KEY = "cutedebug.records.key"


def later(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING):
    """A field added after files were written: a file without it reads as the default (and,
    with an :func:`absent_keys` field, writes back without it)."""
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={_LATER: True}
    )


def optional(default: Any = None) -> Any:
    """A key written only when its value is not ``default`` (read as ``default`` when
    missing)."""
    return dataclasses.field(default=default, metadata={_OPTIONAL: True})


def named(key: str) -> Any:
    """A required field whose JSON key is ``key`` (one that cannot be a field name)."""
    return dataclasses.field(metadata={_KEY: key})


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get(_KEY, f.name)


def transient(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING):
    """A field that is not part of the JSON object (e.g. trace-time state): never written; a
    file that has it is refused like any unknown key."""
    return dataclasses.field(
        default=default, default_factory=default_factory, repr=False, metadata={_TRANSIENT: True}
    )


def absent_keys() -> Any:
    """The field where ``from_json`` notes the :func:`later` keys a file lacked (not a key of
    the JSON object; not compared, not shown)."""
    return dataclasses.field(
        default=frozenset(), compare=False, repr=False, metadata={_ABSENT_KEYS: True}
    )


# ---- writing -------------------------------------------------------------------------------
def to_json(record: Any) -> dict[str, Any]:
    """The record as a JSON object: its fields in declaration order, ABSENT ones left out."""
    out: dict[str, Any] = {}
    fields = dataclasses.fields(record)
    lacked = next((getattr(record, f.name) for f in fields if f.metadata.get(_ABSENT_KEYS)), ())
    for f in fields:
        if f.metadata.get(_ABSENT_KEYS) or f.metadata.get(_TRANSIENT):
            continue
        value = getattr(record, f.name)
        if value is ABSENT or (f.name in lacked and value == _default(f)):
            continue  # the file did not have it, and it was not set since
        if f.metadata.get(_OPTIONAL) and value == f.default:
            continue
        out[_key(f)] = to_json_value(value)
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def to_json_value(value: Any) -> Any:
    """A value as JSON: records and enums in it through their ``to_json``, tuples as lists."""
    if hasattr(value, "to_json") and not isinstance(value, type):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    return value


# ---- reading -------------------------------------------------------------------------------
@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_json(cls: type[R], data: Any, where: str = "") -> R:
    """A ``cls`` from its JSON object; RecordError naming the first field that does not fit.
    ``where`` is the dotted path of this object inside an enclosing record ("" at the top)."""
    name = cls.__name__
    if not isinstance(data, dict):
        raise RecordError(
            f"{_label(where) if where else name}: expected a JSON object ({name}), "
            f"got {type(data).__name__}"
        )
    all_fields = dataclasses.fields(cls)
    fields = {
        _key(f): f
        for f in all_fields
        if f.init and not f.metadata.get(_ABSENT_KEYS) and not f.metadata.get(_TRANSIENT)
    }
    tracker = next((f.name for f in all_fields if f.metadata.get(_ABSENT_KEYS)), None)
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise RecordError(
            f"{_label(join(where, unknown[0]))} unknown ({name}); allowed: {sorted(fields)}"
        )
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    lacked = []
    for key, f in fields.items():
        if key not in data:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required:
                raise RecordError(f"{_label(join(where, key))} missing ({name})")
            if f.metadata.get(_LATER):
                lacked.append(f.name)
            continue
        kwargs[f.name] = _load(data[key], hints[f.name], join(where, key))
    if tracker and lacked:
        kwargs[tracker] = frozenset(lacked)
    return cls(**kwargs)


def join(where: str, key: str) -> str:
    """The dotted path of ``key`` inside the object at ``where``."""
    return f"{where}.{key}" if where else key


def _label(path: str) -> str:
    return f"field {path!r}"


def _load(value: Any, tp: Any, path: str) -> Any:
    where = _label(path)
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _load_union(value, typing.get_args(tp), path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if not any(value == a and type(value) is type(a) for a in allowed):
            raise RecordError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if tp is type(None):
        if value is not None:
            raise RecordError(f"{where}: expected null, got {type(value).__name__}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_load(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_load(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise RecordError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_load(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        _, item = typing.get_args(tp) or (str, Any)
        return {k: _load(v, item, join(path, k)) for k, v in value.items()}
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp) and hasattr(tp, "from_json"):
            return tp.from_json(value, path)
        if issubclass(tp, enum.Enum) and hasattr(tp, "from_json"):
            try:
                return tp.from_json(value, where)
            except ValueError as e:
                raise RecordError(str(e)) from None
        return _load_plain(value, tp, where)
    raise TypeError(f"{where}: records.py cannot read a field of type {tp!r}")


def _load_union(value: Any, arms: tuple[Any, ...], path: str) -> Any:
    real = [a for a in arms if a is not Absent]
    if value is None and type(None) in real:
        return None
    others = [a for a in real if a is not type(None)]
    if len(others) == 1:  # X | None: X's own error says the most
        return _load(value, others[0], path)
    errors = []
    for arm in others:
        try:
            return _load(value, arm, path)
        except RecordError as e:
            errors.append(str(e))
    raise RecordError(
        f"{_label(path)}: {value!r} fits none of {_names(real)} ({'; '.join(errors)})"
    )


def _names(arms: list[Any]) -> list[str]:
    return ["null" if a is type(None) else getattr(a, "__name__", str(a)) for a in arms]


def _load_plain(value: Any, tp: type, where: str) -> Any:
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp in (dict, list, str, bool):
        ok = isinstance(value, tp)
    else:
        raise TypeError(f"{where}: records.py cannot read a field of type {tp!r}")
    if not ok:
        raise RecordError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    return value
