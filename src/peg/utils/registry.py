"""`Registry`: keys to what they stand for, filled where each thing is defined.

Every registry of peg is one (the calibrators' rebuilders and the file formats `peg.load`
reads, PEG/PEP's recipes, the wrappers a chained base records, the label-free estimators, the
models by name, the applications' method builders), so one idiom fills them all::

    MODELS = Registry("model")
    MODELS.add("mlp", MLP)            # a value added where it is defined

    @MODELS.register("small-cnn")     # or a class (a function) as it is defined
    class SmallCNN(nn.Module): ...

    class Base:                       # or each subclass as it is defined
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            MODELS.add(cls.key, cls)

A registry is read as a read-only mapping (`in`, `[key]`, iteration in the order of
registration, `keys()`, `items()`, `len`). A key is registered once: a second value under it is
a ValueError naming both, except the same definition again (a module reloaded, which defines
its classes anew), which replaces the first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast

V = TypeVar("V")
T = TypeVar("T")

__all__ = ["Registry", "UnknownKeyError"]


class UnknownKeyError(KeyError, ValueError):
    """A key no entry of the registry has; a KeyError (as a mapping's) and a ValueError (as an
    argument's), whose message reads as written rather than quoted."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _origin(value: Any) -> Any:
    """Where `value` was defined (module and qualified name; a bound method by its owner and
    name; a tuple by its items), so that a module reloaded is seen to add the same things."""
    if isinstance(value, tuple):
        return tuple(_origin(v) for v in value)
    if inspect.ismethod(value):
        return (_origin(value.__self__), value.__func__.__name__)
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str):
        return (module, name)
    return None


def _same(old: Any, new: Any) -> bool:
    if old is new:
        return True
    try:
        if bool(old == new):
            return True
    except Exception:  # a value whose == is not a truth value (an array): compared by origin
        pass
    origin = _origin(old)
    return origin is not None and origin == _origin(new)


def _named(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(_named(v) for v in value)
    if inspect.ismethod(value):
        return f"{_named(value.__self__)}.{value.__func__.__name__}"
    name = getattr(value, "__name__", None)
    return name if isinstance(name, str) else repr(value)


class Registry(Mapping[str, V]):
    """Keys to values, each key once, read as a mapping.

    Args:
        what: what a key names ("model", "method", ...), for the messages.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, V] = {}

    def add(self, key: str, value: V) -> V:
        """Register `value` under `key` and return it. A key already taken by another value is
        a ValueError naming both (the same definition again, as from a module reloaded,
        replaces the first)."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"key: a {self.what} is registered under a non-empty str, got {key!r}")
        if key in self._entries and not _same(self._entries[key], value):
            raise ValueError(
                f"{self.what} {key!r} is registered already ({_named(self._entries[key])})"
            )
        self._entries[key] = value
        return value

    def register(self, key: str) -> Callable[[T], T]:
        """Decorator: `@registry.register(key)` over a class or a function adds it under `key`
        and leaves it as it is."""

        def add(value: T) -> T:
            self.add(key, cast(V, value))
            return value

        return add

    def remove(self, key: str) -> None:
        """Take `key` out (what a test registered, so that other tests never see it)."""
        self[key]  # the unknown-key error for a key never registered
        del self._entries[key]

    def __getitem__(self, key: str) -> V:
        try:
            return self._entries[key]
        except (KeyError, TypeError):
            raise UnknownKeyError(
                f"{self.what}: unknown {key!r}; known: {list(self._entries)}"
            ) from None

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._entries
        except TypeError:  # an unhashable key is no key
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {list(self._entries)})"
