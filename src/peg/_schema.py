"""Reading untrusted JSON from peg's files (archive headers, recipes, Laplace files, compare's
saved rows): each field checked for its type and range before it is used, every violation an
`ArchiveError` naming the file and the field (`Fields`).

Why: a header is input like any other; a field of the wrong type reached code that assumed
it and failed with a raw `KeyError` or `TypeError` naming neither the file nor the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from peg.errors import ArchiveError

MISSING = object()


def shown(value: Any) -> str:
    """A short account of an unexpected value (its type, and the value where it is short)."""
    if value is MISSING:
        return "nothing (the field is missing)"
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 40 else type(value).__name__


def parse_json(text: Any, where: str, what: str = "header") -> Any:
    """JSON text of a file's header; an ArchiveError (not a RecursionError) for deep nesting."""
    if not isinstance(text, str):
        raise ArchiveError(f"{where}: {what}: expected JSON text, got {shown(text)}")
    try:
        return json.loads(text)
    except RecursionError:
        raise ArchiveError(f"{where}: {what}: JSON nested too deeply") from None
    except ValueError as e:
        raise ArchiveError(f"{where}: {what}: not valid JSON ({e})") from None


class Fields:
    """The fields of one JSON object of file `where`, read checked: `fields.integer("members",
    minimum=1)` returns the value or raises `ArchiveError("<where>: header field 'members':
    expected ...")`. `prefix` names the object inside the header ("meta.recipe.")."""

    def __init__(self, obj: Any, where: str, prefix: str = "", what: str = "header") -> None:
        self.where, self.prefix, self.what = where, prefix, what
        if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
            name = f"{what} field {prefix[:-1]!r}" if prefix else what
            raise ArchiveError(f"{where}: {name}: expected a JSON object, got {shown(obj)}")
        self.obj = obj

    def error(self, key: str, expected: str, value: Any = MISSING) -> ArchiveError:
        """The error for field `key`: what was expected, what is there."""
        return ArchiveError(
            f"{self.where}: {self.what} field {self.prefix + key!r}: expected {expected}, "
            f"got {shown(value)}"
        )

    def get(
        self,
        key: str,
        test: Callable[[Any], bool],
        expected: str,
        optional: bool = False,
        default: Any = None,
    ) -> Any:
        """Field `key` if `test(value)` holds (a missing optional field: `default`)."""
        value = self.obj.get(key, MISSING)
        if value is MISSING and optional:
            return default
        if value is MISSING or not test(value):
            raise self.error(key, expected, value)
        return value

    def text(self, key: str, optional: bool = False, default: Any = None) -> Any:
        return self.get(key, lambda v: isinstance(v, str), "a string", optional, default)

    def boolean(self, key: str, optional: bool = False, default: Any = None) -> Any:
        return self.get(key, lambda v: isinstance(v, bool), "true or false", optional, default)

    def integer(
        self,
        key: str,
        minimum: int | None = None,
        maximum: int | None = None,
        optional: bool = False,
        default: Any = None,
        nullable: bool = False,
    ) -> Any:
        lo = "" if minimum is None else f" >= {minimum}"
        hi = "" if maximum is None else f" <= {maximum}"
        expected = f"an integer{lo}{' and' if lo and hi else ''}{hi}" + (" or null" * nullable)
        return self.get(
            key,
            lambda v: (v is None and nullable) or in_range(v, minimum, maximum, int),
            expected,
            optional,
            default,
        )

    def number(
        self,
        key: str,
        minimum: float | None = None,
        positive: bool = False,
        optional: bool = False,
        default: Any = None,
    ) -> Any:
        bound = " > 0" if positive else ("" if minimum is None else f" >= {minimum}")
        value = self.get(
            key,
            lambda v: in_range(v, minimum, None, (int, float)) and (v > 0 or not positive),
            f"a finite number{bound}",
            optional,
            default,
        )
        return value if value is default else float(value)

    def names(self, key: str, optional: bool = False, non_empty: bool = False) -> Any:
        """A list of strings (tensor names, ...)."""
        expected = "a non-empty list of names" if non_empty else "a list of names"
        return self.get(
            key, lambda v: is_names(v) and (bool(v) or not non_empty), expected, optional
        )

    def object(self, key: str, optional: bool = False) -> Fields | None:
        """Field `key` as `Fields` of its own (None where optional and missing)."""
        value = self.obj.get(key, MISSING)
        if value is MISSING and optional:
            return None
        if not isinstance(value, Mapping):
            raise self.error(key, "a JSON object", value)
        return Fields(value, self.where, f"{self.prefix}{key}.", self.what)


def in_range(v: Any, lo: float | None, hi: float | None, kind: Any) -> bool:
    """`v` is a `kind` (never a bool), finite, within [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, kind):
        return False
    if isinstance(v, float) and not math.isfinite(v):
        return False
    return (lo is None or v >= lo) and (hi is None or v <= hi)


def is_names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) for s in v)
