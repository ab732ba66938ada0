"""One way to check decoded input against a declared shape, with one shape of error.

Records, MLPerf sidecars and run configs are all checked here, and every mistake is one line:

    {source}: '{dotted.key}' must be {words}, got {value!r}
    {source}: unknown key '{dotted.key}' (known: a, b, c)
    {source}: missing key '{dotted.key}'

`source` is the file's path, or "config" for a run config. A shape is declared as data:

- a leaf type: "str", "bool", "int", "num" (a finite number) or "dict" (any object), with a
  "?" suffix where null is allowed too;
- a dict of key -> shape for an object with those keys;
- a one-element list [shape] for a list of that shape.

`compile_shape` turns a shape into a checker once; checking then only walks the value (records
are validated in bulk: millions of curve points), and a name is formatted only when a check
fails. Ranges and rules across fields stay with their owners, who report through `invalid`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcai500_tf.errors import UserError

Source = Path | str
Checker = Callable[[Any, Any, Source], None]  # (value, where, source); raises UserError

TYPE_WORDS = {
    "str": "a string",
    "bool": "true or false",
    "int": "an integer",
    "num": "a finite number",
    "dict": "an object",
}
PLURAL_WORDS = {
    "str": "strings",
    "bool": "true or false values",
    "int": "integers",
    "num": "finite numbers",
    "dict": "objects",
}
INT32_MAX = 2**31 - 1  # the largest seed, count or size TensorFlow and numpy take
SHOWN_CHARACTERS = 80  # a value longer than this, as Python writes it, is cut in a message


def is_finite_number(value: Any) -> bool:
    """A JSON number that is finite (true and false are not numbers here)."""
    return (type(value) is float and value - value == 0) or type(value) is int  # inf - inf: nan


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return text[: SHOWN_CHARACTERS - 3] + "..."


def invalid(source: Source, name: str, words: str, value: Any) -> UserError:
    """`{source}: '{name}' must be {words}, got {value!r}`: a value of the wrong type or out
    of its range (a long value is cut)."""
    return UserError(f"{source}: '{name}' must be {words}, got {_shown(value)}")


def unknown_key(source: Source, name: str, known) -> UserError:
    return UserError(f"{source}: unknown key '{name}' (known: {', '.join(known)})")


def missing_key(source: Source, name: str) -> UserError:
    return UserError(f"{source}: missing key '{name}'")


def dotted(where: Any, key: str | None = None) -> str:
    """A key's dotted name; `where` is a name or (a list's name, an index), so that the name
    of a list's item is only formatted when it is reported."""
    if isinstance(where, tuple):
        where = f"{dotted(where[0])}[{where[1]}]"
    if key is None:
        return where
    return f"{where}.{key}" if where else key


def words_for(shape: Any) -> str:
    """What a shape expects, in words: "an integer", "a list of strings", "an object"."""
    if isinstance(shape, dict):
        return "an object"
    if isinstance(shape, list):
        item = shape[0]
        kind = "dict" if isinstance(item, dict | list) else item.rstrip("?")
        return f"a list of {PLURAL_WORDS[kind]}"
    words = TYPE_WORDS[shape.rstrip("?")]
    return f"{words} or null" if shape.endswith("?") else words


def _leaf_test(kind: str) -> Callable[[Any], bool]:
    """A fast test for one leaf type (exact JSON types: bool is not a number here)."""
    if kind == "num":
        return is_finite_number
    exact = {"str": str, "bool": bool, "int": int, "dict": dict}[kind]
    return lambda value: type(value) is exact


def compile_shape(shape: Any, *, closed: bool = False, optional: bool = False) -> Checker:
    """A checker for `shape`, built once: check(value, where, source) raises UserError naming
    the source and the dotted key. `closed`: every object refuses keys it does not declare,
    naming the ones it knows (records leave them open: newer tools add fields). `optional`:
    every key may be left out (a sidecar states only what the log does not)."""
    if isinstance(shape, dict):
        return _object_checker(shape, closed, optional)
    if isinstance(shape, list):
        return _list_checker(shape, closed, optional)
    return _leaf_checker(shape)


def _object_checker(shape: dict, closed: bool, optional: bool) -> Checker:
    leaves, nested = [], []
    for key, sub in shape.items():
        if isinstance(sub, str):
            kind = sub.rstrip("?")
            leaves.append((key, sub, sub.endswith("?"), _leaf_test(kind)))
        else:
            nested.append((key, compile_shape(sub, closed=closed, optional=optional)))
    known = frozenset(shape)

    def check_object(value, where, source):
        if type(value) is not dict:
            raise invalid(source, dotted(where), "an object", value)
        if closed and not known.issuperset(value):
            extra = next(key for key in value if key not in known)
            raise unknown_key(source, dotted(where, str(extra)), shape)
        for key, leaf, nullable, test in leaves:
            if key not in value:
                if optional:
                    continue
                raise missing_key(source, dotted(where, key))
            item = value[key]
            if not (test(item) or (nullable and item is None)):
                raise invalid(source, dotted(where, key), words_for(leaf), item)
        for key, checker in nested:
            if key not in value:
                if optional:
                    continue
                raise missing_key(source, dotted(where, key))
            checker(value[key], dotted(where, key), source)

    return check_object


def _list_checker(shape: list, closed: bool, optional: bool) -> Checker:
    item_check = compile_shape(shape[0], closed=closed, optional=optional)
    words = words_for(shape)

    def check_list(value, where, source):
        if type(value) is not list:
            raise invalid(source, dotted(where), words, value)
        for index, item in enumerate(value):
            item_check(item, (where, index), source)  # named only if it fails

    return check_list


def _leaf_checker(leaf: str) -> Checker:
    test, nullable, words = _leaf_test(leaf.rstrip("?")), leaf.endswith("?"), words_for(leaf)

    def check_leaf(value, where, source):
        if not (test(value) or (nullable and value is None)):
            raise invalid(source, dotted(where), words, value)

    return check_leaf


# ------------------------------------------------------------------------ dataclass tables

# A dataclass field's type (as written: the config modules use `from __future__ import
# annotations`) and the shape of its value in a TOML table.
FIELD_SHAPES = {
    "int": "int",
    "float": "num",
    "str": "str",
    "bool": "bool",
    "list[int]": ["int"],
    "list[float]": ["num"],
    "list[str]": ["str"],
}


@functools.cache
def _dataclass_checker(cls) -> Checker:
    shape = {}
    for field in cls.__dataclass_fields__.values():
        if field.type not in FIELD_SHAPES:
            raise TypeError(f"{cls.__name__}.{field.name}: a config field cannot be {field.type}")
        shape[field.name] = FIELD_SHAPES[field.type]
    return compile_shape(shape, closed=True)


def dataclass_values(cls, table: Any, where: str, source: Source) -> dict:
    """The keyword arguments of dataclass `cls` from a table with exactly its fields, of its
    types; float fields (and lists of them) as floats, though the table may write 3 for 3.0.
    A field with a default may be left out: a key added later, so that configs saved before
    it (run directories, records) still load."""
    if isinstance(table, dict):
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        table = {k: v for k, v in defaults.items() if v is not dataclasses.MISSING} | table
    _dataclass_checker(cls)(table, where, source)
    values = {}
    for field in cls.__dataclass_fields__.values():
        value = table[field.name]
        if field.type == "float":
            value = float(value)
        elif field.type == "list[float]":
            value = [float(item) for item in value]
        values[field.name] = value
    return values


def rule_broken(source: Source, where: str, problem: str, names) -> UserError:
    """A section's own check (a range, a choice, a rule across fields) in the one shape: a
    problem that starts "NAME must be ..." for a field NAME names the key; another names the
    section."""
    name, _, rest = problem.partition(" must be ")
    if rest and name in names:
        return UserError(f"{source}: '{dotted(where, name)}' must be {rest}")
    return UserError(f"{source}: {where}: {problem}")


# ------------------------------------------------------------------------ config sections


def out_of_range(settings, **ranges: tuple[float, float]) -> str | None:
    """What is wrong with the first named field of `settings` (a number, or a list of numbers)
    outside its closed range [low, high], or None."""
    for name, (low, high) in ranges.items():
        value = getattr(settings, name)
        for item in value if isinstance(value, list) else [value]:
            if not low <= item <= high:
                return f"{name} must be in [{low:,}, {high:,}], got {item}"
    return None


def choice_problem(name: str, value: str, choices) -> str | None:
    """The one line for a value outside its choices, naming them; None when it is one."""
    if value in choices:
        return None
    return f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"


def section(cls, table: Any, where: str):
    """Build dataclass `cls` from a config table: unknown keys, wrong types and ranges refused,
    each in the one shape of `validation` ("config: 'training.epochs' must be an integer, ...").

    `cls` may define `check(self) -> str | None` returning what is wrong.
    """
    built = cls(**dataclass_values(cls, table, where, "config"))
    problem = built.check() if hasattr(built, "check") else None
    if problem:
        raise rule_broken("config", where, problem, cls.__dataclass_fields__)
    return built
