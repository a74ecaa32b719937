"""What PEG and PEP share: members θ_r + scale · D_r[i] around one or more base models.

A subclass supplies the directions `D_r` (`[S, P]`, one row per member, over the P perturbed
parameter entries of base model r) as a `RowSource`, which computes any subset of the rows;
this class validates the inputs, splits the validation data, chooses the scale on held-out
validation points, and builds the `Ensemble`. Because the directions are computed once, trying
another scale costs forward passes only.

How the members are held after `fit` is `peg.methods._members`' job: every row stacked, or
(`lazy=True`) none, the members regenerated a chunk at a time for each prediction. The scale
search is `peg.methods._search`'s, the criteria `peg.methods._criteria`'s.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from peg._inputs import Data, weights_device
from peg._params import module_like, param_label, select_parameters
from peg._rows import InputBatches, ValSource, read_in_order, split_points
from peg.ensemble import Ensemble, Strategy
from peg.errors import ArchiveError, NonFiniteError, NotFittedError
from peg.methods._constraints import (
    Check,
    batch_fn,
    boolean,
    check_constraints,
    choice_or_callable,
    member_of,
    number,
    one_of,
    param_filter,
    positive_int,
    scale,
)
from peg.methods._criteria import CRITERIA, check_task, is_regression
from peg.methods._members import (
    Bases,
    DirectionData,
    RegeneratedMembers,
    RowSource,
    StackedMembers,
    finite_rows,
)
from peg.methods._recipes import Recipes
from peg.methods._scale_search import SEARCHES, ScaleSearch
from peg.methods.base import FittedEnsemble

BNMode = Literal["eval", "batch", "refresh"]
# Default cap on the points a scale is scored on: a larger validation set costs no more to search
MAX_SCORE_POINTS = 10_000
Models = nn.Module | Sequence[nn.Module] | Ensemble


def base_models(model: Models) -> list[nn.Module]:
    """One model, a list of models (an ensemble, PEG's Algorithm 2), or an `Ensemble`."""
    if isinstance(model, FittedEnsemble):  # a fitted SWAG, DeepEnsemble, PEG, ...
        model = model.ensemble()
    if isinstance(model, Ensemble):
        return [model.member_model(i) for i in range(len(model))]
    if isinstance(model, nn.Module):
        return [model]
    if (
        isinstance(model, Sequence)
        and len(model) > 0
        and all(isinstance(m, nn.Module) for m in model)
    ):
        return list(model)
    raise TypeError(
        "model: expected an nn.Module, a non-empty list of nn.Modules or a peg.Ensemble, "
        f"got {type(model).__name__}"
    )


class PerturbationEnsemble(Recipes, FittedEnsemble):
    """Base class of PEG and PEP (not used directly)."""

    default_grid: tuple[float, ...] = ()
    uses_direction_data = True

    # the checks PEG and PEP share, one per argument (`peg.methods._constraints`); the scale
    # (`scale_name`) is checked first, then these, then `parameter_rules` (between arguments)
    parameter_constraints: ClassVar[dict[str, Check]] = {
        "n_members": positive_int(),
        "race": number(allow_zero=True),
        "lazy": boolean,
        "search_tol": number(allow_zero=True),
        "search": member_of(SEARCHES),
        "early_stop": boolean,
        "on_nonfinite": one_of("raise", "drop"),
        "seed": positive_int(minimum=0),
        "bn": one_of("eval", "batch", "refresh"),
        "params": param_filter,
        "criterion": choice_or_callable(CRITERIA, "a callable"),
        "batch_size": positive_int(),
        "max_score_points": positive_int(optional=True),
        "batch_fn": batch_fn,
    }
    parameter_rules: ClassVar[tuple[Callable[[Any], None], ...]] = ()

    def _check_params(self) -> None:
        """Every constraint of the table, then the rules; the arguments are stored as given."""
        check_constraints(self, {self.scale_name: scale, **self.parameter_constraints})
        for rule in self.parameter_rules:
            rule(self)

    @property
    def _scale_arg(self) -> float | Sequence[float] | str:
        """The scale setting as given: PEG's `eta`, PEP's `sigma`."""
        return getattr(self, self.scale_name)

    @property
    def _holdout(self) -> float:
        """Fraction of the validation set held out for scoring the scale (PEG's `eta_holdout`)."""
        return 0.0

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
        return not isinstance(self._scale_arg, (int, float))

    def _split(self, source: ValSource) -> tuple[DirectionData, Tensor | None]:
        """(direction data, indices of the scoring points): `peg._rows.split_points`."""
        searched = self.searches if self._split_as_searched is None else self._split_as_searched
        holdout = self._holdout if searched and self.uses_direction_data else 0.0
        direction, score = split_points(
            source, self.seed, holdout, self.max_score_points, self.scale_name
        )
        return DirectionData(source, direction), score

    def fit(
        self, model: Models, val: Data | None = None, *, bn_data: Data | None = None
    ) -> PerturbationEnsemble:
        """Build the ensemble around `model` (or around each member of an ensemble).

        Args:
            model: a trained nn.Module, a list of them or a `peg.Ensemble` (one set of `n_members`
                members is built around each, `n_members * R` in all).
            val: validation data: a tuple (X, y), a map-style Dataset or a DataLoader (its
                dataset read by index, collated with its `collate_fn`); PEP also takes an
                IterableDataset (PEG's mini-batches need indexing). Never gathered: see
                docs/peg.md#validation-data.
            bn_data: inputs (training data) for re-estimating BatchNorm statistics of every
                member; required when bn="refresh", ignored otherwise. Read batch by batch,
                once per member.

        Returns:
            self, with `members_` (how the members are held, `peg.methods._members`),
            `ensemble_` (the `Ensemble`), `<scale>_` (the scale used),
            `search_` ({scale: criterion} for every scale evaluated), `search_points_`
            ({scale: scoring points it was scored on}) and `search_stopped_` (the scales scored
            on fewer than all). A raced scale's value is the incumbent's + the mean paired
            difference on the points raced (an estimate that ranks as the race decided);
            with `race=0` a stopped scale's value is a lower bound above the best.
            A lazy ensemble keeps no `ensemble_` (nor `directions_`): see `lazy`.
        Checked before any work: the first batch against the model (a forward on two rows),
        then every batch as one pass in order reads it (taking the data's fingerprint).
        """
        models = base_models(model)
        if val is None:
            raise ValueError(
                f"val: {self.method} needs labelled validation data: fit(model, (X_val, y_val))"
            )
        if any(m.training for m in models):
            warnings.warn(
                "model: in training mode; the members are built and predicted in eval mode "
                "(BatchNorm running statistics, dropout off) and the model is left as it is",
                stacklevel=2,
            )
        source = ValSource(val, "val", self.batch_fn, weights_device(models[0]))
        if self.uses_direction_data and not source.indexable:
            raise TypeError(
                f"val: {self.method} draws its mini-batches by index, and an IterableDataset "
                "cannot be indexed; pass a map-style Dataset (or a DataLoader over one)"
            )
        X1, y1 = source.first(self.batch_size)
        source.classes = check_task(models, X1, y1, self.criterion)
        source.regression = is_regression(y1)
        del X1, y1
        fingerprint, head = read_in_order(source, self.batch_size, self.max_score_points)
        expected = self.__dict__.pop("_expected_fingerprint", None)
        if expected is not None and fingerprint != expected:
            raise ArchiveError(
                "val: not the validation data this ensemble was built from (its fingerprint "
                "differs); pass the same data, in the same order"
            )
        names = select_parameters(models[0], self.params)
        data, score = self._split(source)
        n_score = len(score) if score is not None else len(head[1]) if head is not None else 0
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
        bn_batches = None
        if self.bn == "refresh":
            if bn_data is None:
                raise ValueError(
                    "bn_data: bn='refresh' re-estimates BatchNorm statistics and needs "
                    "training inputs: fit(model, val, bn_data=train_loader)"
                )
            bn_batches = InputBatches(bn_data, self.batch_size, self.batch_fn, "bn_data")

        states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
        bases = Bases(states, models[0], names, self.n_members, bn_batches)
        self.param_names_ = names
        for stale in ("members_", "ensemble_", "dropped_"):
            self.__dict__.pop(stale, None)  # a refit replaces everything
        sources = [self._row_source(m, r, names, data) for r, m in enumerate(models)]
        if self.lazy and not self.searches:  # chunk by chunk: never all S·R rows at once
            directions = None
            bad = []  # one row at a time, only checked: the fingerprints are taken by save()
            for r, members, D in bases.chunks(sources, 1):
                bad += [
                    r * self.n_members + i
                    for i, ok in zip(members, finite_rows(D), strict=True)
                    if not ok
                ]
                del D
        else:
            directions = [source(range(self.n_members)) for source in sources]
            bad = [
                r * self.n_members + i
                for r, D in enumerate(directions)
                for i, ok in enumerate(finite_rows(D))
                if not ok
            ]
        del sources
        self._check_directions(bad, len(models))
        bases.dropped = set(bad)
        stacked = StackedMembers(bases, directions) if directions is not None else None

        if stacked is not None and self.searches:
            grid = self.default_grid if self._scale_arg == "search" else self._scale_arg
            Xs, ys = head if score is None else source.gather(score, self.batch_size)
            target = stacked.search_target(Xs, self.batch_size)  # a head: its features
            search = ScaleSearch(
                target,
                ys,
                self.criterion,
                method=self.search,
                batch_size=self.batch_size,
                race=self.race,
                early_stop=self.early_stop,
                tol=self.search_tol,
                label=self.method,
                name=self.scale_name,
                progress=self.progress,
            )
            best = search.run(grid, refine=self._scale_arg == "search")
            self.search_, self.search_points_ = search.scores, search.points
            self.search_stopped_, self.search_predicted_ = search.stopped, search.predicted
        else:
            best, self.search_, self.search_stopped_ = float(self._scale_arg), {}, []
            self.search_points_, self.search_predicted_ = {}, {}
        setattr(self, f"{self.scale_name}_", best)
        self._data_fingerprint = fingerprint
        self._data_points = source.count
        self._searched = (
            self.searches if self._split_as_searched is None else self._split_as_searched
        )
        self._fitted_meta = self._meta(best, len(models), source.count, len(data), n_score)
        if self.lazy:

            def regenerate() -> list[RowSource]:
                """Row sources of the stored bases (run in place: weights not copied)."""
                with torch.enable_grad():
                    return [
                        self._row_source(module_like(models[0], base), r, names, data)
                        for r, base in enumerate(bases.states)
                    ]

            known = stacked.fingerprints(best) if stacked is not None else None  # rows at hand
            self.members_: StackedMembers | RegeneratedMembers = RegeneratedMembers(
                bases, regenerate, known
            )
            return self
        assert stacked is not None
        self.members_ = stacked
        self.ensemble_ = self.ensemble()
        return self

    def _meta(self, scale: float, R: int, n_val: int, n_dir: int, n_score: int) -> dict[str, Any]:
        crit = (
            self.criterion
            if isinstance(self.criterion, str)
            else getattr(self.criterion, "__name__", "callable")
        )
        params = param_label(self.params)
        return {
            "method": self.method,
            self.scale_name: scale,
            "n_members": self.n_members,
            "base_models": R,
            "seed": self.seed,
            "bn": self.bn,
            "params": params,
            "criterion": crit,
            "search": self.search if self._scale_arg == "search" else "grid",
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

    # ---------------------------------------------------------------- the fitted members
    @property
    def _scale(self) -> float:
        """The scale chosen by `fit` (`eta_` / `sigma_`)."""
        return float(getattr(self, f"{self.scale_name}_"))

    @property
    def directions_(self) -> list[Tensor]:
        """The direction rows, `[S, P]` per base (not kept by a lazy ensemble)."""
        members = self.members_
        if not isinstance(members, StackedMembers):
            raise AttributeError(f"{type(self).__name__}: a lazy ensemble keeps no directions_")
        return members.directions

    @property
    def meta_(self) -> dict[str, Any]:
        """What was fitted: method, scale, hyper-parameters, search, ... (saved with it)."""
        self.members_  # noqa: B018  (NotFittedError before fit)
        return self._fitted_meta

    def __len__(self) -> int:
        return len(self.members_)

    def ensemble(self) -> Ensemble:
        """The fitted `Ensemble`.

        A lazy ensemble holds no members: this builds every one of them (S·R × member size of
        memory), each time it is called; prefer `member_logits` / `predict_proba`, which hold
        one chunk of members at a time.
        """
        if "members_" not in self.__dict__:
            raise NotFittedError(f"{type(self).__name__}: call fit(...) before predicting")
        ensemble = self.members_.ensemble(self._scale)
        ensemble.meta = dict(self._fitted_meta)
        return ensemble

    def member_logits(
        self,
        X: Data,
        batch_size: int = 512,
        strategy: Strategy = "auto",
        progress: bool | None = None,
        chunk_size: int | None = None,
        autocast: str | torch.dtype | None = None,
    ) -> Tensor:
        """Logits of every member, `[M, N, C]` (M = S·R less `dropped_`, base-major).

        Arguments as `Ensemble.member_logits`. A lazy ensemble loops over chunks of
        `chunk_size` members (default `LAZY_CHUNK_SIZE`) outside and batches inside (see
        `peg.methods._members.RegeneratedMembers`).
        """
        if "members_" not in self.__dict__:
            raise NotFittedError(f"{type(self).__name__}: call fit(...) before predicting")
        options = dict(strategy=strategy, progress=progress, chunk_size=chunk_size)
        return self.members_.member_logits(X, self._scale, batch_size, autocast=autocast, **options)

    def iter_member_logits(self, X: Data, batch_size: int = 512, **kwargs: Any) -> Iterator[Tensor]:
        """`member_logits` batch by batch, `[M, B_j, C]`: stacked members only (a lazy ensemble
        has chunks of members outside its batches: `NotStreamable`; `peg.evaluate` falls back)."""
        return self.members_.iter_member_logits(X, self._scale, batch_size, **kwargs)

    def ensemble_at(self, scale: float) -> Ensemble:
        """The members at another scale, from the stored directions (no gradient is recomputed).

        Members are θ_r + scale·D_r[i] for every base r and member i, base-major; scale 0 gives
        copies of the base models. Used by the scale search, and to plot a metric against it.
        A lazy ensemble regenerates its directions for this (and builds every member).
        """
        if "members_" not in self.__dict__:
            raise NotFittedError(f"{type(self).__name__}: call fit(...) before ensemble_at(...)")
        return self.members_.ensemble_at(scale)
