"""PEG/PEP ensembles stored as recipes: base weights + how the members were made.

`PerturbationEnsemble` delegates here: `save` (a recipe by default, every member with
`materialize=True`), `from_recipe` (`rebuild`, which `peg.load` finds in `peg.recipe`'s
registry: each subclass joins it under its `method` name when it is defined) and
`check_recipe`. The format is `peg.recipe`'s. What these read of the class is `Recipeable`:
`_perturb` imports this module, so the class is described here rather than imported.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from torch import Tensor

from peg._params import select_parameters
from peg.ensemble import Ensemble
from peg.errors import ArchiveError
from peg.methods.perturbation._lazy import MEMBER_BOOKKEEPING, RegeneratedMembers
from peg.methods.perturbation._members import Models, StackedMembers
from peg.methods.perturbation._scale_search import SEARCH_OPTIONS, ScaleSearch
from peg.recipe import (
    RECIPE_VERSION,
    arithmetic,
    displacement_fingerprints,
    fingerprints_match,
    tolerance,
)
from peg.source import Data
from peg.source.batches import BatchFn
from peg.utils.memory import require_memory

# a recipe with on_nonfinite="drop" may record fewer members than n_members·R; at most this many
# more dropped than kept: a rebuild builds every member before the fingerprints can refuse
# them, so an edited n_members would otherwise cost that many members' work (docs/errors.md)
DROP_SLACK = 16


def _check_rebuild_memory(bases: Ensemble, names: list[str], S: int, field: str) -> None:
    """An ArchiveError naming `options.n_members` where the rebuilt eager ensemble (2·S·R·P
    entries: rows and stacked members) cannot fit in memory, before anything is built."""
    sizes = bases.skeleton.state_dict()
    P = sum(sizes[n].numel() for n in names)
    itemsize = max((sizes[n].element_size() for n in names), default=4)
    members = S * len(bases)
    need = 2 * members * P * itemsize + members * MEMBER_BOOKKEEPING
    try:
        require_memory("n_members", S, need, bases.device, f"{members:,} rebuilt members")
    except ValueError as e:
        raise ArchiveError(f"{field}options.n_members': {e}") from None


def searched_options(options: dict[str, Any]) -> dict[str, Any]:
    """The search's options of a recipe of version 1 or 2 (taken out of `options`), by
    ScaleSearch's names: PEP's `bracket` (low, high) became the grid (low, √(low·high), high)."""
    search = {new: options.pop(old) for old, new in SEARCH_OPTIONS.items() if old in options}
    if "bracket" in options:
        bracket = options.pop("bracket")
        if not (
            isinstance(bracket, list)
            and len(bracket) == 2
            and all(isinstance(v, (int, float)) and v > 0 for v in bracket)
        ):
            raise ValueError(f"grid: PEP's bracket, expected [low, high] > 0, got {bracket!r}")
        low, high = bracket
        search["grid"] = [low, math.sqrt(low * high), high]
    return search


@dataclass(frozen=True)
class Expected:
    """What a recipe being rebuilt expects of `fit` (`PerturbationEnsemble._fit`): the
    validation data's fingerprint (`data`; None: anything goes) and whether the scale was
    searched when it was made (`searched`, which fixes how the validation set is split: the
    rebuilt ensemble is given the scale, yet must split as the search did; None: as `fit`
    would)."""

    data: str | None = None
    searched: bool | None = None

    def check_data(self, fingerprint: str) -> None:
        """ArchiveError unless `fingerprint` (of the data `fit` was given) is the one expected."""
        if self.data is not None and fingerprint != self.data:
            raise ArchiveError(
                "val: not the validation data this ensemble was built from (its fingerprint "
                "differs); pass the same data, in the same order"
            )


class Recipeable(Protocol):
    """What this module reads of a PEG/PEP (`_perturb.PerturbationEnsemble`): the class's names
    and options, and, once fitted, its members, scale and what `fit` recorded."""

    method: ClassVar[str]
    scale_name: ClassVar[str]
    recorded_options: ClassVar[tuple[str, ...]]
    RENAMED_OPTIONS: ClassVar[dict[str, str]]
    members_: StackedMembers | RegeneratedMembers
    _searched: bool
    _data_fingerprint: str
    _data_points: int
    _fitted_meta: dict[str, Any]

    def __init__(self, **options: Any) -> None: ...
    def __len__(self) -> int: ...
    @property
    def directions_(self) -> list[Tensor]: ...
    @property
    def _scale(self) -> float: ...
    def _fit(
        self, model: Models, val: Data | None, bn_data: Data | None, expect: Expected
    ) -> Any: ...
    def _check_fitted(self, doing: str = ...) -> None: ...
    def _recipe_options(self) -> dict[str, Any] | None: ...
    def ensemble(self) -> Ensemble: ...


RecipeableT = TypeVar("RecipeableT", bound=Recipeable)


# the constructor options a recipe records (PEG adds its own: its `recorded_options`); the others
# say how the members are held or shown (progress, batch_fn, lazy, ...), and the scale is
# recorded apart
RECORDED_OPTIONS: tuple[str, ...] = (
    "n_members",
    "seed",
    "bn",
    "params",
    "batch_size",
    "on_nonfinite",
    "search",
)

# renamed constructor options: a recipe of version 1 (peg 0.1) is read through this map
RENAMED_OPTIONS: dict[str, str] = {"size": "n_members", "eval_batch_size": "batch_size"}


def rebuild(
    cls: type[RecipeableT],
    bases: Ensemble,
    recipe: dict[str, Any],
    val: Data,
    batch_fn: BatchFn | None = None,
) -> RecipeableT:
    """`cls.from_recipe`: the ensemble a recipe describes, refitted on `val` and checked.

    Raises ArchiveError (a ValueError) if `val` is not the data the ensemble was made from,
    or if the rebuilt members differ from the recorded fingerprints (the code changed).
    """
    rebuilt = _from_options(cls, recipe, batch_fn)
    if recipe.get("recipe_version", 1) < 4:  # K-FAC's input factors were always summed then
        rebuilt.__dict__["_kfac_rows"] = False
    # the data checked before any work; val split as the search that made it split it
    expect = Expected(data=recipe["data"], searched=bool(recipe["searched"]))
    rebuilt._fit(bases, val, None, expect)
    got = displacement_fingerprints(rebuilt.directions_, recipe["scale"])
    # recipes of peg < 0.3 record no arithmetic: they were made in float32
    tol = tolerance(recipe.get("arithmetic", "fp32"), arithmetic(bases.device))
    bad = fingerprints_match(got, recipe["fingerprints"], rebuilt.directions_[0].shape[1], tol)
    if bad:
        raise ArchiveError(
            f"recipe: rebuilt members {bad[:5]} differ from the ones saved (tolerance {tol}, "
            "see docs/determinism.md): the code or the library version changed since; save "
            "with materialize=True to keep the members themselves"
        )
    return rebuilt


def _options(cls: type[Recipeable], recipe: dict[str, Any]) -> dict[str, Any]:
    """The constructor options of a recipe, by this version's names."""
    options = dict(recipe["options"])
    version = recipe.get("recipe_version", 1)
    if version < 2:  # peg 0.1's option names
        options = {cls.RENAMED_OPTIONS.get(k, k): v for k, v in options.items()}
        options.setdefault("max_score_points", None)  # peg 0.1 scored on every point
    try:
        if version < 3:  # the search's options were the method's own before ScaleSearch
            options["search"] = searched_options(options)
        options["search"] = ScaleSearch(**options.get("search", {}))
    except (TypeError, ValueError) as e:
        raise ArchiveError(f"recipe field 'meta.recipe.options.search': {e}") from None
    return options


def _from_options(
    cls: type[RecipeableT], recipe: dict[str, Any], batch_fn: BatchFn | None
) -> RecipeableT:
    """The unfitted method a recipe describes (its options refused as the archive's)."""
    options = _options(cls, recipe)
    scale = {recipe["scale_name"]: recipe["scale"]}
    try:
        return cls(**options, **scale, progress=False, batch_fn=batch_fn)
    except (TypeError, ValueError) as e:
        raise ArchiveError(f"recipe field 'meta.recipe.options': {e}") from None


def check_recipe(cls: type[Recipeable], bases: Ensemble, recipe: dict[str, Any]) -> None:
    """`cls.check_recipe`: a recipe's method-specific fields, before any work (`peg.recipe.check`
    has checked their types): the scale's name, option names of the constructor, counts that
    agree (members = n_members per base, fewer only where members were dropped) and `params`
    naming parameters of the model; an ArchiveError naming the field otherwise."""
    field = "recipe field 'meta.recipe."
    if recipe["scale_name"] != cls.scale_name:
        raise ArchiveError(
            f"{field}scale_name': expected {cls.scale_name!r} for {cls.method}, got "
            f"{recipe['scale_name']!r}"
        )
    options = _options(cls, recipe)
    unknown = sorted(set(options) - set(cls.recorded_options))
    if unknown:
        raise ArchiveError(f"{field}options': unknown options {unknown[:5]} for {cls.method}")
    S = options.get("n_members")
    if isinstance(S, bool) or not isinstance(S, int) or S < 1:
        raise ArchiveError(f"{field}options.n_members': expected an integer >= 1, got {S!r}")
    made, most = recipe["members"], S * len(bases)
    drops = options.get("on_nonfinite") == "drop"
    if made > most or (made < most and not drops) or most - made > made + DROP_SLACK:
        raise ArchiveError(
            f"{field}members': {made} members recorded where options.n_members = {S} and "
            f"{len(bases)} base(s) make {most}: the recipe's counts disagree"
            + (
                " (a rebuild builds every member to check the recorded ones: more dropped "
                f"than kept + {DROP_SLACK} is refused)"
                if drops and made < most
                else ""
            )
        )
    params = options.get("params", "all")
    try:
        names = select_parameters(bases.skeleton, params)
    except (TypeError, ValueError) as e:
        raise ArchiveError(f"{field}options.params': {e}") from None
    _check_rebuild_memory(bases, names, S, field)
    _from_options(cls, recipe, None)


def save(fitted: Recipeable, path: str, materialize: bool) -> str:
    """`fitted.save(path, materialize)`: a recipe, or every member (see its docstring)."""
    if not isinstance(materialize, bool):
        raise TypeError(f"materialize: expected True or False, got {materialize!r}")
    fitted._check_fitted("saving")
    options = None if materialize else fitted._recipe_options()
    if options is None:
        ensemble = fitted.ensemble()  # a lazy ensemble builds its members here
        if not materialize:
            warnings.warn(
                f"{type(fitted).__name__}.save: this ensemble cannot be stored as a recipe "
                "(callable params/criterion/loss, momentum buffers or bn='refresh'); saving "
                "every member (pass materialize=True to say so and silence this warning)",
                stacklevel=3,
            )
        return ensemble.save(path)
    held = fitted.members_
    scale = fitted._scale
    recipe = {
        "kind": "recipe",
        "recipe_version": RECIPE_VERSION,
        "method": fitted.method,
        "options": options,
        "scale_name": fitted.scale_name,
        "scale": scale,
        "searched": fitted._searched,
        "data": fitted._data_fingerprint,
        "data_points": fitted._data_points,
        "members": len(fitted),
        "fingerprints": held.fingerprints(scale),
        "arithmetic": arithmetic(held.bases.states[0][held.bases.names[0]].device),
    }
    bases = Ensemble.from_state_dicts(held.bases.skeleton, held.bases.states)
    bases.meta = {**fitted._fitted_meta, "recipe": recipe}
    return bases.save(path)
