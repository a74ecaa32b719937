"""What PEG and PEP share: members θ_r + scale · D_r[i] around one or more base models.

A subclass supplies the directions `D_r` (`[S, P]`, one row per member, over the P perturbed
parameter entries of base model r) as a `RowSource`, which computes any subset of the rows;
this class validates the inputs, splits the validation data, chooses the scale on held-out
validation points, and builds the `Ensemble`. Because the directions are computed once, trying
another scale costs forward passes only.

`fit` runs in named stages: the validation data read and checked (`_validation_source`, then
one pass in order for its fingerprint), the split into direction and scoring points (`_split`),
the rows (`_directions`: stacked, or checked and let go when lazy), the scale (`_choose_scale`),
the meta, and how the members are kept (`_hold`). A recipe being rebuilt passes what it expects
(`peg.methods.perturbation._recipes.Expected`) to `_fit` explicitly.

How the members are held after `fit` is `peg.methods.perturbation._members`' job: every row stacked,
or (`lazy=True`) none, the members regenerated a chunk at a time for each prediction; predicting
through them is `peg.methods.perturbation._fitted_members`'. The scale search's options and run are
`peg.methods.perturbation._scale_search`'s (`search=`, a `ScaleSearch`), the criteria
`peg.methods.perturbation._criteria`'s; the fitted ensemble's verbs and its recipe are
`peg.methods.perturbation._fitted`'s (`FittedPerturbation`, this class's base).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from peg import recipe
from peg._params import module_like, param_label, select_parameters
from peg.errors import NonFiniteError
from peg.methods._constraints import (
    Check,
    batch_fn,
    boolean,
    number,
    one_of,
    param_filter,
    positive_int,
)
from peg.methods.calibration.composed import base_module
from peg.methods.perturbation import _recipes
from peg.methods.perturbation._criteria import check_task, is_regression
from peg.methods.perturbation._fitted import FittedPerturbation
from peg.methods.perturbation._lazy import (
    LAZY_STORES,
    LazyRows,
    RegeneratedMembers,
    check_memory,
    choose_store,
    collect_rows,
    lazy_members,
)
from peg.methods.perturbation._members import (
    Bases,
    DirectionData,
    Models,
    RowSource,
    StackedMembers,
    base_models,
    finite_rows,
)
from peg.methods.perturbation._recipes import Expected
from peg.methods.perturbation._scale_search import SEARCH_OPTION, SearchRun
from peg.source import Data, Source
from peg.source._devices import weights_device
from peg.source._rows import InputBatches, ValSource, read_in_order, split_points
from peg.source._values import warn_one_class
from peg.source.batches import take_rows
from peg.utils.scalars import is_real

BNMode = Literal["eval", "batch", "refresh"]


class PerturbationEnsemble(FittedPerturbation):
    """Base class of PEG and PEP (not used directly): `fit` here; the members' verbs and the
    recipe are `FittedPerturbation`'s (`peg.methods.perturbation._fitted`)."""

    method = "perturbation"
    scale_name = "scale"
    recorded_options: ClassVar[tuple[str, ...]] = _recipes.RECORDED_OPTIONS
    RENAMED_OPTIONS: ClassVar[dict[str, str]] = _recipes.RENAMED_OPTIONS
    default_grid: tuple[float, ...] = ()
    uses_direction_data = True
    fitted_attribute: ClassVar[str] = "members_"  # a lazy ensemble holds no ensemble_

    # the checks PEG and PEP share, one per argument (`peg.methods._constraints`); the scale
    # (`scale_name`) is checked first, then these, then `parameter_rules` (between arguments)
    parameter_constraints: ClassVar[dict[str, Check]] = {
        "n_members": positive_int(),
        "search": SEARCH_OPTION,
        "on_nonfinite": one_of("raise", "drop"),
        "seed": positive_int(minimum=0),
        "bn": one_of("eval", "batch", "refresh"),
        "params": param_filter,
        "batch_size": positive_int(),
        "batch_fn": batch_fn,
        "progress": boolean(optional=True),
        "lazy": one_of(False, True, "auto"),
        "lazy_store": one_of(*LAZY_STORES),
        "memory_budget": number(optional=True),
    }
    parameter_rules: ClassVar[tuple[Callable[[Any], None], ...]] = ()

    @property
    def _holdout(self) -> float:
        """Fraction of the validation set held out for scoring the scale (PEG's
        `search.holdout`; PEP holds none out: `_score_cap`)."""
        return 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "method" in cls.__dict__:  # a concrete method (PEG, PEP): `peg.load` finds it by name
            recipe.REBUILDERS.add(cls.method, (cls.from_recipe, cls.check_recipe))

    # ---------------------------------------------------------------- to override
    def _row_source(
        self, model: nn.Module, r: int, names: list[str], data: DirectionData
    ) -> RowSource:
        """The directions of base model r on demand: `rows(members) -> [k, P]`, row j that of
        member `members[j]`, computed from it alone (P = total size of the `names` parameters);
        `rows(range(S))` is the whole `[S, P]`. A row of NaN marks a member to drop."""
        raise NotImplementedError

    def _min_direction_points(self) -> int:
        return 1

    def _hyperparameters(self) -> dict[str, Any]:
        return {}

    # ---------------------------------------------------------------- fitting
    @property
    def searches(self) -> bool:
        """Whether the scale is chosen from several candidates."""
        return not is_real(self._scale_arg)  # NumPy scalars are one scale too

    def _split(
        self, source: ValSource, searched: bool | None = None
    ) -> tuple[DirectionData, Tensor | None]:
        """(direction data, indices of the scoring points): `peg.source._rows.split_points`; points
        are held out for scoring only when the scale is `searched` (None: `self.searches`)."""
        searched = self.searches if searched is None else searched
        holdout = self._holdout if searched and self.uses_direction_data else 0.0
        cap = self._search().max_points
        if searched and not self.uses_direction_data and source.indexable:
            cap = self._score_cap(len(source), cap)
        direction, score = split_points(source, self.seed, holdout, cap, self.scale_name)
        return DirectionData(source, direction), score

    def _score_cap(self, n: int, cap: int | None) -> int | None:
        """The most points of n that score the scale, for a method without direction data."""
        return cap

    def fit(
        self, model: Models, val: Data | None = None, *, bn_data: Data | None = None
    ) -> PerturbationEnsemble:
        """Build the ensemble around `model` (or around each member of an ensemble).

        Args:
            model: a trained nn.Module, a list of them or a `peg.Ensemble` (one set of `n_members`
                members is built around each, `n_members * R` in all); or a temperature,
                vector or matrix scaling or Dirichlet calibration fitted on a module: the
                members are built around the calibrated module (`peg.methods.calibration.composed`).
            val: validation data: a tuple (X, y), a map-style Dataset or a DataLoader (its
                dataset read by index, collated with its `collate_fn`); PEP also takes an
                IterableDataset (PEG's mini-batches need indexing). Never gathered: see
                docs/peg.md#validation-data.
            bn_data: inputs (training data) for re-estimating BatchNorm statistics of every
                member; required when bn="refresh", ignored otherwise. Read batch by batch,
                once per member.

        Returns:
            self, with `members_` (how the members are held, `peg.methods.perturbation._members`),
            `ensemble_` (the `Ensemble`), `<scale>_` (the scale used),
            `search_` ({scale: criterion} for every scale evaluated), `search_points_`
            ({scale: scoring points it was scored on}) and `search_stopped_` (the scales scored
            on fewer than all). A raced scale's value is the incumbent's + the mean paired
            difference on the points raced (an estimate that ranks as the race decided);
            with `race=0` a stopped scale's value is a lower bound above the best.
            A lazy ensemble keeps no `ensemble_` (nor `directions_`): see `lazy`;
            `lazy_store_` says how the members are held (None: stacked).
        Checked before any work: the first batch against the model (a forward on two rows),
        then every batch as one pass in order reads it (taking the data's fingerprint).
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        return self._fit(model, val, bn_data, Expected())

    def _fit(
        self, model: Models, val: Data | None, bn_data: Data | None, expect: Expected
    ) -> PerturbationEnsemble:
        """`fit`, stage by stage; `expect` is what a recipe being rebuilt expects (the data's
        fingerprint, how its validation set was split), checked or followed on the way."""
        models = base_models(base_module(model))  # a fitted TS / Dirichlet: its module
        source, probe = self._validation_source(models, val)
        fingerprint, head = read_in_order(source, self.batch_size, self._search().max_points)
        expect.check_data(fingerprint)  # before any gradient
        searched = self.searches if expect.searched is None else expect.searched
        names = select_parameters(models[0], self.params, probe)
        data, score = self._split(source, searched)
        self._check_direction_points(data, source)
        states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
        bases = Bases(states, models[0], names, self.n_members, self._bn_batches(bn_data))
        self.param_names_ = names
        for stale in ("members_", "ensemble_", "dropped_"):
            self.__dict__.pop(stale, None)  # a refit replaces everything
        store = choose_store(self, bases)  # None: eager
        check_memory(self, bases, store)  # n_members that cannot fit: refused before any row
        rows = self._directions(models, bases, data, store)
        stacked = rows if isinstance(rows, StackedMembers) else None
        best = self._choose_scale(stacked, source, head, score)
        n_score = len(score) if score is not None else len(head[1]) if head is not None else 0
        self._data_fingerprint, self._data_points, self._searched = (
            fingerprint,
            source.count,
            searched,
        )
        self._fitted_meta = self._meta(best, len(models), source.count, len(data), n_score)
        self._fitted_meta["head"] = bases.head(probe)
        self._hold(rows, bases, models[0], data, best, store)
        return self

    # ---------------------------------------------------------------- the stages of fit
    def _validation_source(
        self, models: list[nn.Module], val: Data | None
    ) -> tuple[ValSource, Any]:
        """`val` as a `ValSource`, its first batch checked against the model (the task), and
        two of its inputs (the probe that finds the last layer and the head, `meta_["head"]`)."""
        if val is None:
            raise ValueError(
                f"val: {self.method} needs labelled validation data: fit(model, (X_val, y_val))"
            )
        if any(m.training for m in models):
            warnings.warn(
                "model: in training mode; the members are built and predicted in eval mode "
                "(BatchNorm running statistics, dropout off) and the model is left as it is",
                stacklevel=4,  # the caller of fit
            )
        source = Source(val, self.batch_fn, "val").rows(weights_device(models[0]))
        if self.uses_direction_data and not source.indexable:
            raise TypeError(
                f"val: {self.method} draws its mini-batches by index, and an IterableDataset "
                "cannot be indexed; pass a map-style Dataset (or a DataLoader over one)"
            )
        X1, y1 = source.first(self.batch_size)
        source.classes = check_task(models, X1, y1, self._search().criterion)
        source.regression = is_regression(y1, source.classes)
        if source.y is not None:  # a pair: every label at hand (one class is worth a warning)
            warn_one_class(source.y, "val")
        return source, take_rows(X1, 0, 2)

    def _check_direction_points(self, data: DirectionData, source: ValSource) -> None:
        need = self._min_direction_points()
        if len(data) < need:
            where = (
                f" after holding out {self._holdout:.0%} for choosing {self.scale_name}"
                if len(data) < source.count
                else ""
            )
            raise ValueError(
                f"val: {len(data)} points{where}; {self.method} needs at least {need} "
                f"(the mini-batch size); lower grad_batch_size or pass more validation data"
            )

    def _bn_batches(self, bn_data: Data | None) -> InputBatches | None:
        """bn="refresh": the training inputs that re-estimate every member's statistics."""
        if self.bn != "refresh":
            return None
        if bn_data is None:
            raise ValueError(
                "bn_data: bn='refresh' re-estimates BatchNorm statistics and needs "
                "training inputs: fit(model, val, bn_data=train_loader)"
            )
        return Source(bn_data, self.batch_fn, "bn_data").replay(self.batch_size)

    def _directions(
        self, models: list[nn.Module], bases: Bases, data: DirectionData, store: str | None
    ) -> StackedMembers | LazyRows:
        """Every base's rows, checked (non-finite ones raise or are dropped: `dropped_`):
        stacked, or (lazy, the scale given) computed one at a time (`collect_rows`)."""
        names = bases.names
        sources = [self._row_source(m, r, names, data) for r, m in enumerate(models)]
        if store is not None and not self.searches:  # never all S·R rows at once
            rows, bad = collect_rows(bases, sources, store, float(self._scale_arg))
        else:
            rows = StackedMembers(bases, [source(range(self.n_members)) for source in sources])
            S = self.n_members
            bad = [
                r * S + i
                for r, D in enumerate(rows.directions)
                for i, ok in enumerate(finite_rows(D))
                if not ok
            ]
        del sources
        self._check_directions(bad, len(models))
        bases.dropped = set(bad)
        return rows

    def _choose_scale(
        self,
        stacked: StackedMembers | None,
        source: ValSource,
        head: tuple[Any, Tensor] | None,
        score: Tensor | None,
    ) -> float:
        """The scale: the one given, or the best of the search on the scoring points (`score`,
        else the first points read, `head`); sets `<scale>_` and the `search_*` attributes."""
        if stacked is None or not self.searches:
            best, self.search_, self.search_stopped_ = float(self._scale_arg), {}, []
            self.search_points_, self.search_predicted_ = {}, {}
        else:
            options = self._search()
            grid = options.grid or self.default_grid
            if self._scale_arg != "search":
                grid = self._scale_arg
            Xs, ys = head if score is None else source.gather(score, self.batch_size)
            target = stacked.search_target(Xs, self.batch_size)  # a head: its features
            search = SearchRun(
                target,
                ys,
                options,
                batch_size=self.batch_size,
                label=self.method,
                name=self.scale_name,
                progress=self.progress,
            )
            best = search.run(grid, refine=self._scale_arg == "search")
            self.search_, self.search_points_ = search.scores, search.points
            self.search_stopped_, self.search_predicted_ = search.stopped, search.predicted
        setattr(self, f"{self.scale_name}_", best)
        return best

    def _hold(
        self,
        rows: StackedMembers | LazyRows,
        bases: Bases,
        model: nn.Module,
        data: DirectionData,
        scale: float,
        store: str | None,
    ) -> None:
        """Keep the members: stacked (`members_`, `ensemble_`), or lazily (`lazy_store`)."""
        self.lazy_store_ = store
        if store is None:
            assert isinstance(rows, StackedMembers)
            self.members_: StackedMembers | RegeneratedMembers = rows
            self.ensemble_ = self.ensemble()  # the stacked members, built once
            return

        def regenerate() -> list[RowSource]:
            """Row sources of the stored bases (run in place: weights not copied)."""
            with torch.enable_grad():
                return [
                    self._row_source(module_like(model, base), r, bases.names, data)
                    for r, base in enumerate(bases.states)
                ]

        self.members_ = lazy_members(rows, bases, store, scale, regenerate)

    def _meta(self, scale: float, R: int, n_val: int, n_dir: int, n_score: int) -> dict[str, Any]:
        options = self._search()
        params = param_label(self.params)
        return {
            "method": self.method,
            self.scale_name: scale,
            "n_members": self.n_members,
            "base_models": R,
            "seed": self.seed,
            "bn": self.bn,
            "params": params,
            "criterion": options.criterion_name(),
            "search": options.method if self._scale_arg == "search" else "grid",
            "holdout": self._holdout,
            "dropped": list(getattr(self, "dropped_", [])),
            "validation_points": {"total": n_val, "directions": n_dir, "scoring": n_score},
            f"{self.scale_name}_search": {
                f"{k:.6g}": v for k, v in self.search_.items() if math.isfinite(v)
            },
            "search_stopped_early": [f"{k:.6g}" for k in self.search_stopped_],
            "search_points": {f"{k:.6g}": n for k, n in self.search_points_.items()},
            **self._hyperparameters(),
        }

    def _check_directions(self, bad: list[int], R: int) -> None:
        """Members `bad` (base-major numbering) have NaN/inf steps: raise naming them, or
        (on_nonfinite="drop") keep their indices in `dropped_` and leave them out."""
        S = self.n_members
        if bad and (self.on_nonfinite == "raise" or len(bad) == S * R):
            raise NonFiniteError(
                f"members {bad[:10]} (base-major: member = base·{S} + i) have non-finite steps"
                + ("; every member diverged" if len(bad) == S * R else "")
                + "; pass on_nonfinite='drop' to leave them out"
            )
        self.dropped_ = bad
