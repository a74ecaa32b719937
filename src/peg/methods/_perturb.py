"""What PEG and PEP share: members θ_r + scale · D_r[i] around one or more base models.

A subclass supplies the directions `D_r` (`[S, P]`, one row per member, over the P perturbed
parameter entries of base model r) as a `RowSource`, which computes any subset of the rows;
this class validates the inputs, splits the validation data, chooses the scale on held-out
validation points, and builds the `Ensemble`. Because the directions are computed once, trying
another scale costs forward passes only.

Lazy mode (`lazy=True`): once the scale is chosen, the fitted object keeps only the base
weights, the scale, the validation data the directions come from (a reference) and the members'
fingerprints; every prediction regenerates the members `chunk_size` at a time (a `[k, P]` block
of rows, the members stacked as views of it), predicts every batch with them and frees them, so
memory holds the base plus one chunk of members instead of all S·R of them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor, nn

from peg import recipe, streams
from peg._inputs import (
    Data,
    as_xy,
    check_number,
    check_positive_int,
    diagnose,
    eval_mode,
    iter_inputs,
    model_device,
    to_device,
    weights_device,
)
from peg._params import entry_views, module_like, refresh_bn, select_parameters
from peg._progress import counter
from peg.ensemble import STRATEGIES, Ensemble, Strategy, autocast_dtype, model_output
from peg.errors import ArchiveError, NonFiniteError, NotFittedError
from peg.methods._criteria import CRITERIA, REGRESSION_CRITERIA, is_regression
from peg.methods._search import ScaleSearch
from peg.methods.base import FittedEnsemble
from peg.recipe import (
    RECIPE_VERSION,
    TOLERANCE,
    data_fingerprint,
    displacement_fingerprints,
    fingerprint_probe,
    fingerprint_rows,
    fingerprints_match,
)

BNMode = Literal["eval", "batch", "refresh"]
Models = nn.Module | Sequence[nn.Module] | Ensemble

# Members regenerated at a time by a lazy ensemble when `chunk_size` is not given.
LAZY_CHUNK_SIZE = 5

# member indices i (k of them) -> their direction rows D[i], `[k, P]`
RowSource = Callable[[Sequence[int]], Tensor]


@dataclass(frozen=True)
class DirectionData:
    """The validation points that feed the directions, without copying them: rows `index` of
    (X `[N, ...]`, y `[N]`), or all N rows when `index` is None."""

    X: Tensor
    y: Tensor
    index: Tensor | None = None

    def __len__(self) -> int:
        return len(self.X) if self.index is None else len(self.index)

    def rows(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Points `idx` (positions in [0, len(self))): inputs `[B, ...]` and labels `[B]`."""
        i = idx if self.index is None else self.index[idx]
        return self.X[i], self.y[i]


def finite_rows(D: Tensor) -> list[bool]:
    """Whether each row of D `[k, P]` is free of NaN and inf."""
    return [bool(torch.isfinite(row).all()) for row in D]


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


class PerturbationEnsemble(FittedEnsemble):
    """Base class of PEG and PEP (not used directly)."""

    method = "perturbation"
    scale_name = "scale"
    default_grid: tuple[float, ...] = ()
    uses_direction_data = True
    _split_as_searched: bool | None = None  # a rebuilt recipe splits val as its search did

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        recipe.register(cls.method, cls.from_recipe)  # `peg.load` finds it by name

    # renamed constructor options: a recipe of version 1 (peg 0.1) is read through this map
    RENAMED_OPTIONS: ClassVar[dict[str, str]] = {
        "size": "n_members",
        "eval_batch_size": "batch_size",
    }

    def _check_params(self) -> None:
        """The checks PEG and PEP share; the arguments are stored as given (see `Method`)."""
        check_positive_int(self.n_members, "n_members")
        check_number(self.race, "race", allow_zero=True)
        if not isinstance(self.lazy, bool):
            raise TypeError(f"lazy: expected True or False, got {self.lazy!r}")
        check_number(self.search_tol, "search_tol", allow_zero=True)
        if not isinstance(self.early_stop, bool):
            raise TypeError(f"early_stop: expected True or False, got {self.early_stop!r}")
        if self.on_nonfinite not in ("raise", "drop"):
            raise ValueError(f"on_nonfinite: expected 'raise' or 'drop', got {self.on_nonfinite!r}")
        check_positive_int(self.seed, "seed", minimum=0)
        scale = self._scale_arg
        if isinstance(scale, str):
            if scale != "search":
                raise ValueError(
                    f"{self.scale_name}: expected a number > 0, a list or 'search', got {scale!r}"
                )
        else:
            values = [scale] if isinstance(scale, (int, float)) else list(scale)
            if not values or not all(
                isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values
            ):
                raise ValueError(
                    f"{self.scale_name}: expected a number > 0, a non-empty list of numbers > 0 "
                    f"or 'search', got {scale!r}"
                )
        if self.bn not in ("eval", "batch", "refresh"):
            raise ValueError(f"bn: expected 'eval', 'batch' or 'refresh', got {self.bn!r}")
        if not (self.params in ("all", "weights") or callable(self.params)):
            raise ValueError(
                f"params: expected 'all', 'weights' or a callable, got {self.params!r}"
            )
        if not (self.criterion in CRITERIA or callable(self.criterion)):
            raise ValueError(
                f"criterion: expected one of {sorted(CRITERIA)} or a callable, "
                f"got {self.criterion!r}"
            )
        check_positive_int(self.batch_size, "batch_size")
        if self.max_score_points is not None:
            check_positive_int(self.max_score_points, "max_score_points")

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

    def _check_data(self, models: list[nn.Module], X: Tensor, y: Tensor) -> int:
        """Probe one forward pass before any long work; return the output width C.

        Integer labels `[N]` in [0, C) mean classification; floating-point targets `[N]` mean
        regression, for which the models must be Gaussian heads with outputs `[B, 2]` (mean,
        log-variance) and the criterion the mixture NLL.
        """
        C = None
        for r, model in enumerate(models):
            name = f"model {r}" if len(models) > 1 else "model"
            x = to_device(X[:2], model_device(model, name, ("val", X)), "val")
            with eval_mode(model), torch.no_grad():
                out = model_output(diagnose(model, x, "val"), name)
            if C is not None and out.shape[1] != C:
                raise ValueError(
                    f"model: base models disagree on the number of classes ({C} vs {out.shape[1]})"
                )
            C = out.shape[1]
        assert C is not None
        if y.ndim != 1:
            raise ValueError(f"val: labels must be a vector [N], got shape {tuple(y.shape)}")
        if is_regression(y):
            if C != 2:
                raise ValueError(
                    f"model: regression (floating-point targets) needs a Gaussian head with "
                    f"outputs [B, 2] (mean, log-variance), got [B, {C}]; for classification "
                    "pass integer labels, e.g. y.long()"
                )
            if bool(((y == 0) | (y == 1)).all()):
                warnings.warn(
                    "val: floating-point targets that are all 0 or 1 mean regression with a "
                    "Gaussian head [B, 2]; for a two-class classifier pass y.long()",
                    stacklevel=3,
                )
            if not (self.criterion in REGRESSION_CRITERIA or callable(self.criterion)):
                raise ValueError(
                    f"criterion: {self.criterion!r} is for classification; regression takes "
                    f"{sorted(REGRESSION_CRITERIA)} or a callable"
                )
            if not torch.isfinite(y).all():
                raise ValueError("val: regression targets contain NaN or inf")
            return C
        if y.min() < 0 or y.max() >= C:
            raise ValueError(
                f"val: labels must lie in [0, {C}) for a model with {C} outputs, "
                f"got min {int(y.min())}, max {int(y.max())}"
            )
        return C

    def _split(self, X: Tensor, y: Tensor) -> tuple[DirectionData, tuple[Tensor, Tensor]]:
        """(direction data, scoring data): disjoint when a scale is searched and holdout > 0.

        The direction data refers to X and y (rows picked by index, not copied). The scoring
        part is a seeded random subset of at most `max_score_points` points.
        """
        perm = torch.randperm(len(X), generator=streams.generator(self.seed, streams.SPLIT))
        searched = self.searches if self._split_as_searched is None else self._split_as_searched
        if searched and self.uses_direction_data and self._holdout > 0:
            n_score = round(self._holdout * len(X))
            score, direction = perm[:n_score], perm[n_score:]
            if n_score == 0 or len(direction) == 0:
                raise ValueError(
                    f"val: {len(X)} points are too few to hold out {self._holdout:.0%} for "
                    f"choosing {self.scale_name}"
                )
            data = DirectionData(X, y, direction)
        else:
            score, data = perm, DirectionData(X, y)
        score = score[: self.max_score_points]
        return data, (X[score], y[score])

    def fit(
        self, model: Models, val: Data | None = None, *, bn_data: Data | None = None
    ) -> PerturbationEnsemble:
        """Build the ensemble around `model` (or around each member of an ensemble).

        Args:
            model: a trained nn.Module, a list of them or a `peg.Ensemble` (one set of `size`
                members is built around each, `size * R` members in all).
            val: validation data: a tuple (X, y), a Dataset or a DataLoader of (x, y).
            bn_data: inputs (training data) for re-estimating BatchNorm statistics of every
                member; required when bn="refresh", ignored otherwise.

        Returns:
            self, with `ensemble_` (the `Ensemble`), `<scale>_` (the scale used),
            `search_` ({scale: criterion} for every scale evaluated), `search_points_`
            ({scale: scoring points it was scored on}) and `search_stopped_` (the scales scored
            on fewer than all). A raced scale's value is the incumbent's + the mean paired
            difference on the points raced (an estimate that ranks as the race decided);
            with `race=0` a stopped scale's value is a lower bound above the best.
            A lazy ensemble keeps no `ensemble_` (nor `directions_`): see `lazy`.
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
        X, y = as_xy(val, "val", device=weights_device(models[0]))
        assert y is not None
        self._check_data(models, X, y)
        names = select_parameters(models[0], self.params)
        data, (Xs, ys) = self._split(X, y)
        need = self._min_direction_points()
        if len(data) < need:
            where = (
                f" after holding out {self._holdout:.0%} for choosing {self.scale_name}"
                if len(data) < len(X)
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
            Xb, _ = as_xy(bn_data, "bn_data", need_labels=False)
            bn_batches = list(Xb.split(self.batch_size))

        self._bases = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
        self._skeleton = models[0]
        self._bn_batches = bn_batches
        self.param_names_ = names
        for stale in ("directions_", "ensemble_", "_direction_data", "_fingerprints", "dropped_"):
            self.__dict__.pop(stale, None)  # a refit replaces everything
        sources = [self._row_source(m, r, names, data) for r, m in enumerate(models)]
        if self.lazy and not self.searches:  # chunk by chunk: never all S·R rows at once
            bad = []  # one row at a time, only checked: the fingerprints are taken by save()
            for r, members, D in self._chunks(sources, 1):
                bad += [
                    r * self.n_members + i
                    for i, ok in zip(members, finite_rows(D), strict=True)
                    if not ok
                ]
                del D
        else:
            self.directions_ = [source(range(self.n_members)) for source in sources]
            bad = [
                r * self.n_members + i
                for r, D in enumerate(self.directions_)
                for i, ok in enumerate(finite_rows(D))
                if not ok
            ]
        del sources
        self._check_directions(bad, len(models))

        if self.searches:
            grid = self.default_grid if self._scale_arg == "search" else self._scale_arg
            search = ScaleSearch(
                self.ensemble_at,
                (Xs, ys),
                self.criterion,
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
            self.search_stopped_ = search.stopped
        else:
            best, self.search_, self.search_stopped_ = float(self._scale_arg), {}, []
            self.search_points_ = {}
        setattr(self, f"{self.scale_name}_", best)
        self._data_fingerprint = data_fingerprint(X, y)
        self._data_points = len(X)
        self._searched = (
            self.searches if self._split_as_searched is None else self._split_as_searched
        )
        meta = self._meta(best, len(models), len(X), len(data), len(Xs))
        if self.lazy:
            if hasattr(self, "directions_"):  # searched: the rows at hand give the fingerprints
                self._fingerprints = displacement_fingerprints(self.directions_, best)
                del self.directions_
            self._direction_data = data
            self._lazy_meta = meta
            self._meta_skeleton = module_like(
                models[0],
                {k: torch.empty_like(v, device="meta") for k, v in self._bases[0].items()},
            )
            return self
        self.ensemble_ = self.ensemble_at(best)
        self.ensemble_.meta = meta
        return self

    def _meta(self, scale: float, R: int, n_val: int, n_dir: int, n_score: int) -> dict[str, Any]:
        crit = (
            self.criterion
            if isinstance(self.criterion, str)
            else getattr(self.criterion, "__name__", "callable")
        )
        params = (
            self.params
            if isinstance(self.params, str)
            else getattr(self.params, "__name__", "callable")
        )
        return {
            "method": self.method,
            self.scale_name: scale,
            "n_members": self.n_members,
            "base_models": R,
            "seed": self.seed,
            "bn": self.bn,
            "params": params,
            "criterion": crit,
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

    # ---------------------------------------------------------------- lazy members
    def _chunks(
        self, sources: Sequence[RowSource], k: int
    ) -> Iterator[tuple[int, list[int], Tensor]]:
        """(base r, member indices, their rows `[len(members), P]`), base-major, at most k
        members at a time, leaving out `dropped_` ones (once known). Only one block is held
        here; the caller must drop its reference before asking for the next."""
        dropped = set(getattr(self, "dropped_", ()))
        for r, source in enumerate(sources):
            kept = [i for i in range(self.n_members) if r * self.n_members + i not in dropped]
            for start in range(0, len(kept), k):
                members = kept[start : start + k]
                with torch.enable_grad():  # PEG's rows are gradients, even under no_grad()
                    D = source(members)
                yield r, members, D
                del D

    def _lazy_sources(self) -> list[RowSource]:
        """Row sources of the stored bases (run in place: their weights are not copied)."""
        if not self.lazy or not hasattr(self, "_direction_data"):
            raise NotFittedError(f"{type(self).__name__}: call fit(...) before predicting")
        with torch.enable_grad():
            return [
                self._row_source(
                    module_like(self._skeleton, base), r, self.param_names_, self._direction_data
                )
                for r, base in enumerate(self._bases)
            ]

    def _lazy_fingerprints(self, scale: float) -> list[list[float]]:
        """Every member's fingerprint (`displacement_fingerprints`; NaN for dropped ones), from
        regenerated rows, a chunk at a time; kept (they are small)."""
        if not hasattr(self, "_fingerprints"):
            dropped = set(self.dropped_)
            found: dict[int, list[float]] = {i: [math.nan, math.nan] for i in dropped}
            probe: Tensor | None = None
            for r, members, D in self._chunks(self._lazy_sources(), LAZY_CHUNK_SIZE):
                probe = fingerprint_probe(D.shape[1]) if probe is None else probe
                for i, fp in zip(members, fingerprint_rows(D, scale, probe), strict=True):
                    found[r * self.n_members + i] = fp
                del D
            self._fingerprints = [found[i] for i in range(len(found))]
        return self._fingerprints

    def _chunk_ensemble(self, r: int, D: Tensor, scale: float) -> Ensemble:
        """Members θ_r + scale·D[j] of base r as an `Ensemble` of len(D) members.

        D `[k, P]` is consumed: scaled and shifted in place, the stacked weights are views of
        it (nothing of size k·P is allocated), the skeleton lives on the meta device.
        """
        base, names = self._bases[r], self.param_names_
        if self._bn_batches is not None or any(base[n].dtype != D.dtype for n in names):
            return self._states_ensemble([(base, D)], scale, set())
        D.mul_(scale)
        views = entry_views(D, [base[n].shape for n in names])  # [k, *shape] each
        stacked = {n: part.add_(base[n]) for n, part in zip(names, views, strict=True)}
        shared = {k: v for k, v in base.items() if k not in stacked}
        return Ensemble(self._meta_skeleton, stacked, shared)

    def __len__(self) -> int:
        if self.lazy:
            if not hasattr(self, "_direction_data"):
                raise NotFittedError(f"{type(self).__name__}: call fit(...) before predicting")
            return self.n_members * len(self._bases) - len(self.dropped_)
        return super().__len__()

    def ensemble(self) -> Ensemble:
        """The fitted `Ensemble`.

        A lazy ensemble holds no members: this builds every one of them (S·R × member size of
        memory), each time it is called; prefer `member_logits` / `predict_proba`, which hold
        one chunk of members at a time.
        """
        if not self.lazy:
            return super().ensemble()
        if not hasattr(self, "_direction_data"):
            raise NotFittedError(f"{type(self).__name__}: call fit(...) before predicting")
        ensemble = self.ensemble_at(float(getattr(self, f"{self.scale_name}_")))
        ensemble.meta = dict(self._lazy_meta)
        return ensemble

    @torch.no_grad()
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
        `chunk_size` members (default `LAZY_CHUNK_SIZE`) outside and batches inside: it
        regenerates a chunk (PEG: its gradients), predicts every batch of X with it (`strategy`
        within the chunk), keeps the logits and frees the chunk. Inputs that are not a tensor or
        array (a Dataset, a DataLoader) are gathered once, so every chunk sees the same rows.
        """
        if not self.lazy:
            return self.ensemble().member_logits(
                X, batch_size, strategy, progress, chunk_size, autocast
            )
        autocast_dtype(autocast)  # checked before any member is built
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
        batch_size = check_positive_int(batch_size, "batch_size")
        k = LAZY_CHUNK_SIZE if chunk_size is None else check_positive_int(chunk_size, "chunk_size")
        sources = self._lazy_sources()
        if not isinstance(X, (Tensor, np.ndarray)):
            parts = list(iter_inputs(X, batch_size))
            if not parts:
                raise ValueError("X: no inputs to predict (0 samples)")
            X = torch.cat(parts)
        scale = float(getattr(self, f"{self.scale_name}_"))
        M = len(self)
        out: Tensor | None = None
        start = 0
        shown = counter(f"predict ({M} members, {k} at a time)", progress)
        # no bar around the chunks: its iterator would hold the last chunk while making the next
        for r, members, D in self._chunks(sources, k):
            shown.update(len(members))
            ensemble = self._chunk_ensemble(r, D, scale)
            del D
            logits = ensemble.member_logits(X, batch_size, strategy, False, len(members), autocast)
            del ensemble
            if out is None:
                out = logits.new_empty((M, *logits.shape[1:]))
            out[start : start + len(members)] = logits
            start += len(members)
            del logits
        shown.close()
        assert out is not None and start == M
        return out

    # ---------------------------------------------------------------- recipes
    @classmethod
    def from_recipe(
        cls, bases: Ensemble, recipe: dict[str, Any], val: Data
    ) -> PerturbationEnsemble:
        """Rebuild an ensemble saved as a recipe, and check it (see `peg.recipe`).

        Raises ArchiveError (a ValueError) if `val` is not the data the ensemble was made from,
        or if the rebuilt members differ from the recorded fingerprints (the code changed).
        """
        X, y = as_xy(val, "val")
        assert y is not None
        options = recipe["options"]
        if recipe.get("recipe_version", 1) < 2:  # peg 0.1's option names
            options = {cls.RENAMED_OPTIONS.get(k, k): v for k, v in options.items()}
        if data_fingerprint(X, y) != recipe["data"]:
            raise ArchiveError(
                "val: not the validation data this ensemble was built from (its fingerprint "
                "differs); pass the same (X, y), in the same order"
            )
        rebuilt = cls(**options, **{recipe["scale_name"]: recipe["scale"]}, progress=False)
        rebuilt._split_as_searched = bool(recipe["searched"])
        rebuilt.fit(bases, (X, y))
        got = displacement_fingerprints(rebuilt.directions_, recipe["scale"])
        bad = fingerprints_match(got, recipe["fingerprints"])
        if bad:
            raise ArchiveError(
                f"recipe: rebuilt members {bad[:5]} differ from the ones saved (relative "
                f"tolerance {TOLERANCE}): the code or the library version changed since; save "
                "with materialize=True to keep the members themselves"
            )
        return rebuilt

    def _recipe_options(self) -> dict[str, Any] | None:
        """Constructor arguments that rebuild this ensemble (None: not expressible as a recipe)."""
        if callable(self.params) or callable(self.criterion) or self.bn == "refresh":
            return None
        return {
            "n_members": self.n_members,
            "seed": self.seed,
            "bn": self.bn,
            "params": self.params,
            "criterion": self.criterion,
            "batch_size": self.batch_size,
            "max_score_points": self.max_score_points,
            "on_nonfinite": self.on_nonfinite,
            "early_stop": self.early_stop,
            "race": self.race,
            "search_tol": self.search_tol,
        }

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
        if not isinstance(materialize, bool):
            raise TypeError(f"materialize: expected True or False, got {materialize!r}")
        if self.lazy and not hasattr(self, "_direction_data"):
            raise NotFittedError(f"{type(self).__name__}: call fit(...) before saving")
        options = None if materialize else self._recipe_options()
        if options is None:
            ensemble = self.ensemble()  # a lazy ensemble builds its members here
            if not materialize:
                warnings.warn(
                    f"{type(self).__name__}.save: this ensemble cannot be stored as a recipe "
                    "(callable params/criterion/loss, momentum buffers or bn='refresh'); saving "
                    "every member (pass materialize=True to say so and silence this warning)",
                    stacklevel=2,
                )
            return ensemble.save(path)
        meta = self._lazy_meta if self.lazy else self.ensemble().meta
        scale = float(getattr(self, f"{self.scale_name}_"))
        fingerprints = (
            self._lazy_fingerprints(scale)
            if self.lazy
            else displacement_fingerprints(self.directions_, scale)
        )
        recipe = {
            "kind": "recipe",
            "recipe_version": RECIPE_VERSION,
            "method": self.method,
            "options": options,
            "scale_name": self.scale_name,
            "scale": scale,
            "searched": self._searched,
            "data": self._data_fingerprint,
            "data_points": self._data_points,
            "members": len(self),
            "fingerprints": fingerprints,
        }
        bases = Ensemble.from_state_dicts(self._skeleton, self._bases)
        bases.meta = {**meta, "recipe": recipe}
        return bases.save(path)

    def ensemble_at(self, scale: float) -> Ensemble:
        """The members at another scale, from the stored directions (no gradient is recomputed).

        Members are θ_r + scale·D_r[i] for every base r and member i, base-major; scale 0 gives
        copies of the base models. Used by the scale search, and to plot a metric against it.
        A lazy ensemble regenerates its directions for this (and builds every member).
        """
        if not (hasattr(self, "directions_") or hasattr(self, "_direction_data")):
            raise AttributeError(f"{type(self).__name__}: call fit(...) before ensemble_at(...)")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
            raise ValueError(f"scale: expected a finite number >= 0, got {scale!r}")
        if hasattr(self, "directions_"):
            directions = self.directions_
        else:
            with torch.enable_grad():
                directions = [source(range(self.n_members)) for source in self._lazy_sources()]
        dropped = set(getattr(self, "dropped_", ()))
        return self._states_ensemble(
            list(zip(self._bases, directions, strict=True)), scale, dropped
        )

    def _states_ensemble(
        self, pairs: list[tuple[dict[str, Tensor], Tensor]], scale: float, dropped: set[int]
    ) -> Ensemble:
        """Members θ_r + scale·D_r[i] for (θ_r, D_r `[S_r, P]`) in `pairs`, base-major, but
        those numbered in `dropped` (r·S_r + i), from one state dict per member."""
        names = self.param_names_
        shapes = [pairs[0][0][n].shape for n in names]
        states = []
        for r, (base, D) in enumerate(pairs):
            steps = entry_views(scale * D, shapes)  # per parameter: [S, *shape]
            for i in range(D.shape[0]):
                if r * D.shape[0] + i in dropped:
                    continue
                state = dict(base)
                for n, step in zip(names, steps, strict=True):
                    state[n] = base[n] + step[i].to(base[n].dtype)
                if self._bn_batches is not None:
                    state = refresh_bn(self._skeleton, state, self._bn_batches)
                states.append(state)
        return Ensemble.from_state_dicts(self._skeleton, states)
