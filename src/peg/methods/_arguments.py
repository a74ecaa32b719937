"""The argument protocol (scikit-learn's) of every method, and of the objects that take
arguments as methods do (`ScaleSearch`, `PerformanceEstimator`, the integrations' callbacks):
`Params` stores them as given, checks them against one table of constraints
(`peg.methods._constraints`) and the rules between them, and gives them back (`get_params`,
`set_params`, a `repr`); `store_arguments` is the one line every constructor ends with.
`peg.methods.base` re-exports both, beside the method contract they are the base of.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, ClassVar

from peg.errors import InvalidParameterError
from peg.methods import _constraints as checks


def store_arguments(owner: Params, arguments: dict[str, Any]) -> None:
    """Store a constructor's arguments (its `locals()`) under their own names, unchanged, then
    check them (`_check_params`): the one line every constructor ends with."""
    for name in type(owner)._param_names():
        setattr(owner, name, arguments[name])
    owner._check_params()


# heads the section each class's docstring gains from its table (`Params.__init_subclass__`)
ACCEPTED = "Arguments accepted (`parameter_constraints`; checked at construction and at fit):"


class Params:
    """The argument protocol (scikit-learn's): keyword arguments stored as given under their own
    names, one check per argument in `parameter_constraints` (`peg.methods._constraints`;
    a test requires every constructor argument to have one) and the checks between arguments
    in `parameter_rules`, run in that order by `_check_params` at construction, in
    `set_params` and (for a `Method`) at `fit`; `get_params` (nested objects' parameters as
    `name__param` with `deep=True`), `set_params` (`name__param` too) and a `repr` of the
    arguments that differ from their defaults. Every refusal is a `peg.InvalidParameterError`
    (a ValueError and a TypeError), whichever check or rule made it."""

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {}
    parameter_rules: ClassVar[tuple[checks.Rule, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the docstring's list of what each argument accepts, written from the table itself
        if cls.__doc__ and "parameter_constraints" in cls.__dict__:
            accepted = checks.accepted(cls.parameter_constraints)
            lines = "".join(f"\n        {line}" for line in accepted)
            cls.__doc__ = f"{cls.__doc__.rstrip()}\n\n    {ACCEPTED}{lines}\n"

    def _check_params(self) -> None:
        """`InvalidParameterError` for a bad argument; never change one (clone compares them)."""
        with checks.refusals():
            checks.check_constraints(self, self.parameter_constraints)
            for rule in self.parameter_rules:
                rule(self)

    @classmethod
    def _param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return [
            p.name
            for p in signature.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor arguments, `{name: value}`; with `deep`, an argument's own parameters
        too, as `name__param` (scikit-learn's protocol)."""
        params = {name: getattr(self, name) for name in self._param_names()}
        if deep:
            for name, value in list(params.items()):
                if isinstance(value, Params):
                    params.update({f"{name}__{k}": v for k, v in value.get_params().items()})
        return params

    def set_params(self, **params: Any) -> Params:
        """Change constructor arguments (`name__param` changes one of an argument's own), checked
        as the constructor checks them (nothing is changed when a check fails); returns self."""
        valid = self._param_names()
        nested: dict[str, dict[str, Any]] = {}
        for key in [k for k in params if "__" in k]:
            name, sub = key.split("__", 1)
            nested.setdefault(name, {})[sub] = params.pop(key)
        unknown = sorted((set(params) | set(nested)) - set(valid))
        if unknown:
            self._refuse_as_constructed({k: params[k] for k in unknown if k in params})
            raise InvalidParameterError(
                f"{type(self).__name__}.set_params: unknown argument(s) {unknown}; valid: {valid}"
            )
        old = {name: getattr(self, name) for name in params}
        for name, value in params.items():
            setattr(self, name, value)
        try:
            for name, sub in nested.items():
                owner = getattr(self, name)
                if not isinstance(owner, Params):
                    raise InvalidParameterError(
                        f"{name}__{next(iter(sub))}: {name} is {owner!r}, which has no "
                        f"parameters of its own; set {name} itself"
                    )
                owner.set_params(**sub)
            self._check_params()
        except Exception:
            for name, value in old.items():
                setattr(self, name, value)
            raise
        return self

    @classmethod
    def _refuse_as_constructed(cls, extra: dict[str, Any]) -> None:
        """The constructor's refusal of an argument it takes under `**kwargs` only to refuse it
        (PEG's `eta_holdout`: saying where it went), so `set_params` and the constructor agree;
        one not naming the argument is left to `set_params`'s error listing the valid names."""
        takes_extra = any(
            p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values()
        )
        for name, value in extra.items() if takes_extra else ():
            try:
                cls(**{name: value})
            except TypeError as e:
                if str(e).startswith(f"{name}:"):
                    raise InvalidParameterError(str(e)) from None

    def _non_defaults(self) -> set[str]:
        """The constructor arguments whose values differ from their defaults."""
        defaults = {
            p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()
        }
        changed = set()
        for name, value in self.get_params(deep=False).items():
            default = defaults.get(name, inspect.Parameter.empty)
            try:
                same = value is default or bool(value == default)
            except Exception:  # e.g. tensors: an ambiguous truth value
                same = False
            if not same:
                changed.add(name)
        return changed

    def __repr__(self) -> str:
        changed = self._non_defaults()
        shown = [f"{k}={v!r}" for k, v in self.get_params(deep=False).items() if k in changed]
        return f"{type(self).__name__}({', '.join(shown)})"
