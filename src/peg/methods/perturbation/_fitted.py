"""The fitted PEG/PEP's verbs and recipe (a base of `_perturb.PerturbationEnsemble`).

What a fitted perturbation ensemble answers once `fit` has set `members_`, the chosen scale
(`eta_` / `sigma_`) and `_fitted_meta`: its members at that scale or another (`ensemble`,
`ensemble_at`, `directions_`; `FittedEnsemble`'s verbs through `_held`), and saving or
rebuilding it as a recipe (`peg.methods.perturbation._recipes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from peg._params import param_label
from peg.ensemble import Ensemble
from peg.methods.base import FittedEnsemble
from peg.methods.perturbation import _recipes
from peg.methods.perturbation._fitted_members import FittedMembers
from peg.methods.perturbation._members import StackedMembers
from peg.methods.perturbation._scale_search import ScaleSearch
from peg.source import Data
from peg.source.batches import BatchFn


class FittedPerturbation(FittedEnsemble):
    """PEG and PEP once fitted (not used directly): the members' verbs, the recipe."""

    scale_name = "scale"
    recorded_options: tuple[str, ...] = ()
    params: Any
    bn: str
    search: Any

    @property
    def _scale_arg(self) -> float | Sequence[float] | str:
        """The scale setting as given: PEG's `eta`, PEP's `sigma`."""
        return getattr(self, self.scale_name)

    def _search(self) -> ScaleSearch:
        """The search's options: `search`, or a ScaleSearch of that method."""
        return ScaleSearch.of(self.search)

    # ---------------------------------------------------------------- fitted
    @property
    def _scale(self) -> float:
        """The scale chosen by `fit` (`eta_` / `sigma_`)."""
        return float(getattr(self, f"{self.scale_name}_"))

    def _held(self) -> FittedMembers:
        """The members at the chosen scale: what `FittedEnsemble`'s verbs answer through."""
        self._check_fitted()
        return FittedMembers(self.members_, self._scale, self._fitted_meta)

    def ensemble(self) -> Ensemble:
        """The fitted `Ensemble`.

        A lazy ensemble holds no members: this builds every one of them (S·R × member size of
        memory), each time it is called; prefer `member_logits` / `predict_proba`, which hold
        one chunk of members at a time.
        """
        return self._held().ensemble()

    @property
    def directions_(self) -> list[Tensor]:
        """The direction rows, `[S, P]` per base (not kept by a lazy ensemble)."""
        if not isinstance(self.members_, StackedMembers):
            raise AttributeError(f"{type(self).__name__}: a lazy ensemble keeps no directions_")
        return self.members_.directions

    def ensemble_at(self, scale: float) -> Ensemble:
        """The members at another scale, from the stored directions (no gradient is recomputed).

        Members are θ_r + scale·D_r[i] for every base r and member i, base-major; scale 0 gives
        copies of the base models. Used by the scale search, and to plot a metric against it.
        A lazy ensemble regenerates its directions for this (and builds every member).
        """
        self._check_fitted("ensemble_at(...)")
        return self.members_.ensemble_at(scale)

    # ---------------------------------------------------------------- recipes
    @classmethod
    def from_recipe(
        cls, bases: Ensemble, recipe: dict[str, Any], val: Data, batch_fn: BatchFn | None = None
    ) -> FittedPerturbation:
        """Rebuild an ensemble saved as a recipe, and check it (see `peg.recipe`)."""
        return _recipes.rebuild(cls, bases, recipe, val, batch_fn)

    @classmethod
    def check_recipe(cls, bases: Ensemble, recipe: dict[str, Any]) -> None:
        """A recipe's fields for this method, before any work (`_recipes.check_recipe`)."""
        _recipes.check_recipe(cls, bases, recipe)

    def _expressible(self) -> bool:
        """Whether a recipe can rebuild this ensemble: no callable (`params`, the criterion), no
        training data (bn="refresh"); PEG adds its own conditions."""
        return (
            not callable(self.params)
            and self.bn != "refresh"
            and (self._search().recorded() is not None)
        )

    def _recipe_options(self) -> dict[str, Any] | None:
        """The constructor options that rebuild this ensemble, as JSON (`recorded_options`; None:
        not expressible as a recipe)."""
        if not self._expressible():
            return None
        options = {name: getattr(self, name) for name in self.recorded_options}
        options["params"] = param_label(options["params"])
        options["search"] = self._search().recorded()
        return options

    def save(self, path: str, materialize: bool = False) -> str:
        """Save the ensemble as a recipe (default), or every member with `materialize=True`.

        A recipe is the base weights plus how the members were made: the seed, the chosen
        scale, the hyper-parameters (S, and for PEG K, the variant, ...), the BatchNorm mode,
        and fingerprints of the validation data and of every member. It is about the size of
        the base model(s), whatever S. Load it with `peg.load(path, model, val=val)`, which
        rebuilds the members from the same validation data and checks them against the
        fingerprints, failing with a clear `ArchiveError` if the data or the code changed.

        `materialize=True` stores every member instead (S times the size), loaded with
        `peg.load(path, model)` and no data. Ensembles that a recipe cannot express (a callable
        `params`, `criterion` or `loss`, given momentum buffers, bn="refresh") are saved
        materialised, with a warning.
        """
        return _recipes.save(self, path, materialize)
