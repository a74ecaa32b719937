"""What PEG and PEP share: members θ_r + scale · D_r[i] around one or more base models.

A subclass supplies the directions `D_r` (`[S, P]`, one row per member, over the P perturbed
parameter entries of base model r); this class validates the inputs, splits the validation
data, chooses the scale on held-out validation points, and builds the `Ensemble`. Because the
directions are computed once, trying another scale costs forward passes only.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.swa_utils import update_bn

from peg import metrics
from peg._inputs import (
    Data,
    as_xy,
    check_number,
    check_positive_int,
    diagnose,
    eval_mode,
    model_device,
    to_device,
    weights_device,
)
from peg._progress import counter
from peg.ensemble import Ensemble, model_output
from peg.methods._search import select_scale
from peg.methods.base import FittedEnsemble
from peg.recipe import (
    RECIPE_VERSION,
    TOLERANCE,
    data_fingerprint,
    displacement_fingerprints,
    fingerprints_match,
)

BNMode = Literal["eval", "batch", "refresh"]
ParamFilter = Literal["all", "weights"] | Callable[[str, nn.Parameter], bool]
Criterion = Literal["nll", "ece", "brier"] | Callable[[Tensor, Tensor], float]
Models = nn.Module | Sequence[nn.Module] | Ensemble

CRITERIA: dict[str, Callable[[Tensor, Tensor], float]] = {
    "nll": metrics.nll,
    "ece": metrics.ece,
    "brier": metrics.brier,
}


def mixture_nll(outputs: Tensor, y: Tensor) -> float:
    """Regression criterion: minus the log predictive density of the members' Gaussian mixture.

    `outputs` `[M, N, 2]` are Gaussian heads (mean, log-variance; `peg.models.gaussian`). A
    log-variance whose exponential overflows to inf or underflows to 0 (a scale so large the
    members diverged) scores +inf, the worst, like non-finite outputs.
    """
    from peg.metrics.regression import log_predictive_density, split_gaussian

    mean, var = split_gaussian(outputs)
    if not (torch.isfinite(var).all() and (var > 0).all()):
        return math.inf
    return -log_predictive_density(mean, var, y)


# criteria that are means of non-negative per-point losses (scored batch by batch, early stop)
PER_POINT = ("nll", "brier")
REGRESSION_CRITERIA: dict[str, Callable[[Tensor, Tensor], float]] = {"nll": mixture_nll}


def is_regression(y: Tensor) -> bool:
    """Floating-point targets mean regression; integer labels mean classification."""
    return torch.is_floating_point(y)


# Random-stream keys: (MEMBER_KEY, base, member) for anything drawn per member.
MEMBER_KEY = 0
SPLIT_KEY = 2**31  # the validation split into gradient and scoring parts


class NonFiniteError(FloatingPointError):
    """A loss, gradient or member weight became NaN or infinite."""


def generator(seed: int, *key: int) -> torch.Generator:
    """An independent, reproducible random stream for (seed, *key) (numpy SeedSequence)."""
    state = np.random.SeedSequence(entropy=seed, spawn_key=key).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


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


def select_parameters(model: nn.Module, params: ParamFilter) -> list[str]:
    """Names of the trainable parameters to perturb."""
    if params == "all":
        keep = lambda name, p: True  # noqa: E731
    elif params == "weights":  # conv / linear weight tensors, as the original PEP code
        keep = lambda name, p: p.ndim >= 2  # noqa: E731
    elif callable(params):
        keep = params
    else:
        raise ValueError(f"params: expected 'all', 'weights' or a callable, got {params!r}")
    names = [n for n, p in model.named_parameters() if p.requires_grad and keep(n, p)]
    if not names:
        raise ValueError(
            "model: has no trainable parameters to perturb (requires_grad=True"
            + (f" and selected by params={params!r})" if params != "all" else ")")
        )
    return names


class PerturbationEnsemble(FittedEnsemble):
    """Base class of PEG and PEP (not used directly)."""

    method = "perturbation"
    scale_name = "scale"
    default_grid: tuple[float, ...] = ()
    uses_direction_data = True
    _split_as_searched: bool | None = None  # a rebuilt recipe splits val as its search did

    def __init__(
        self,
        size: int,
        scale: float | Sequence[float] | str,
        seed: int,
        bn: BNMode,
        params: ParamFilter,
        criterion: Criterion,
        holdout: float,
        eval_batch_size: int,
        progress: bool | None,
        max_score_points: int | None = None,
        on_nonfinite: str = "raise",
        early_stop: bool = True,
        search_tol: float = 1e-4,
    ) -> None:
        self.size = check_positive_int(size, "size")
        self.search_tol = check_number(search_tol, "search_tol", allow_zero=True)
        if not isinstance(early_stop, bool):
            raise TypeError(f"early_stop: expected True or False, got {early_stop!r}")
        self.early_stop = early_stop
        if on_nonfinite not in ("raise", "drop"):
            raise ValueError(f"on_nonfinite: expected 'raise' or 'drop', got {on_nonfinite!r}")
        self.on_nonfinite = on_nonfinite
        self.seed = check_positive_int(seed, "seed", minimum=0)
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
        self.scale = scale
        if bn not in ("eval", "batch", "refresh"):
            raise ValueError(f"bn: expected 'eval', 'batch' or 'refresh', got {bn!r}")
        self.bn = bn
        if not (params in ("all", "weights") or callable(params)):
            raise ValueError(f"params: expected 'all', 'weights' or a callable, got {params!r}")
        self.params = params
        if not (criterion in CRITERIA or callable(criterion)):
            raise ValueError(
                f"criterion: expected one of {sorted(CRITERIA)} or a callable, got {criterion!r}"
            )
        self.criterion = criterion
        if not (isinstance(holdout, (int, float)) and 0 <= holdout < 1):
            raise ValueError(f"holdout: expected a fraction in [0, 1), got {holdout!r}")
        self.holdout = float(holdout)
        self.eval_batch_size = check_positive_int(eval_batch_size, "eval_batch_size")
        self.progress = progress
        if max_score_points is not None:
            check_positive_int(max_score_points, "max_score_points")
        self.max_score_points = max_score_points

    # ---------------------------------------------------------------- to override
    def _directions(
        self, model: nn.Module, r: int, names: list[str], X: Tensor, y: Tensor
    ) -> Tensor:
        """Directions `[S, P]` for base model r (P = total size of the `names` parameters)."""
        raise NotImplementedError

    def _min_direction_points(self) -> int:
        return 1

    def _hyperparameters(self) -> dict[str, Any]:
        return {}

    # ---------------------------------------------------------------- fitting
    @property
    def searches(self) -> bool:
        """Whether the scale is chosen from several candidates."""
        return not isinstance(self.scale, (int, float))

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

    def _split(self, X: Tensor, y: Tensor) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """(direction data, scoring data): disjoint when a scale is searched and holdout > 0.

        The scoring part is a seeded random subset of at most `max_score_points` points.
        """
        perm = torch.randperm(len(X), generator=generator(self.seed, SPLIT_KEY))
        searched = self.searches if self._split_as_searched is None else self._split_as_searched
        if searched and self.uses_direction_data and self.holdout > 0:
            n_score = round(self.holdout * len(X))
            score, direction = perm[:n_score], perm[n_score:]
            if n_score == 0 or len(direction) == 0:
                raise ValueError(
                    f"val: {len(X)} points are too few to hold out {self.holdout:.0%} for "
                    f"choosing {self.scale_name}"
                )
            Xd, yd = X[direction], y[direction]
        else:
            score, Xd, yd = perm, X, y
        score = score[: self.max_score_points]
        return (Xd, yd), (X[score], y[score])

    def fit(self, model: Models, val: Data, bn_data: Data | None = None) -> PerturbationEnsemble:
        """Build the ensemble around `model` (or around each member of an ensemble).

        Args:
            model: a trained nn.Module, a list of them or a `peg.Ensemble` (one set of `size`
                members is built around each, `size * R` members in all).
            val: validation data: a tuple (X, y), a Dataset or a DataLoader of (x, y).
            bn_data: inputs (training data) for re-estimating BatchNorm statistics of every
                member; required when bn="refresh", ignored otherwise.

        Returns:
            self, with `ensemble_` (the `Ensemble`), `<scale>_` (the scale used) and
            `search_` ({scale: criterion} for every scale evaluated; for the scales listed in
            `search_stopped_`, whose scoring stopped early, a lower bound above the best).
        """
        models = base_models(model)
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
        (Xd, yd), (Xs, ys) = self._split(X, y)
        need = self._min_direction_points()
        if len(Xd) < need:
            where = (
                f" after holding out {self.holdout:.0%} for choosing {self.scale_name}"
                if len(Xd) < len(X)
                else ""
            )
            raise ValueError(
                f"val: {len(Xd)} points{where}; {self.method} needs at least {need} "
                f"(the mini-batch size); lower batch_size or pass more validation data"
            )
        bn_batches = None
        if self.bn == "refresh":
            if bn_data is None:
                raise ValueError(
                    "bn_data: bn='refresh' re-estimates BatchNorm statistics and needs "
                    "training inputs: fit(model, val, bn_data=train_loader)"
                )
            Xb, _ = as_xy(bn_data, "bn_data", need_labels=False)
            bn_batches = list(Xb.split(self.eval_batch_size))

        self._bases = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
        self._skeleton = models[0]
        self._bn_batches = bn_batches
        self.param_names_ = names
        self.directions_ = [self._directions(m, r, names, Xd, yd) for r, m in enumerate(models)]
        self._check_directions()
        build = self.ensemble_at

        if self.searches:
            grid = self.default_grid if self.scale == "search" else self.scale
            table = REGRESSION_CRITERIA if is_regression(y) else CRITERIA
            criterion = table.get(self.criterion, self.criterion)  # type: ignore[arg-type]

            name = f"{self.method} {self.scale_name} search"
            with counter(name, self.progress) as shown:
                # a mean of non-negative per-point losses is scored batch by batch, and can stop
                # once its partial sum / N exceeds the best score so far (`_search`)
                per_point = self.criterion in PER_POINT and not is_regression(y)
                stopped: list[float] = []

                def score(scale: float, stop_above: float = math.inf) -> float:
                    ensemble = build(scale)
                    batches = Xs.split(self.eval_batch_size) if per_point else [Xs]
                    total, start = 0.0, 0
                    for x in batches:
                        logits = ensemble.member_logits(x, self.eval_batch_size, progress=False)
                        if not torch.isfinite(logits).all():
                            value = math.inf  # diverged: the worst score
                            break
                        total += float(criterion(logits, ys[start : start + len(x)])) * len(x)
                        start += len(x)
                        value = total / len(Xs) if per_point else total
                        if value > stop_above and start < len(Xs):
                            stopped.append(scale)  # a lower bound of the score, above the best
                            break
                    shown.update(1)
                    shown.set_postfix_str(f"{self.scale_name}={scale:.3g} score={value:.4g}")
                    return value

                best, self.search_ = select_scale(
                    score,
                    grid,
                    refine=self.scale == "search",
                    stop_above=self.early_stop,
                    tol=self.search_tol,
                )
                self.search_stopped_ = sorted(stopped)
        else:
            best, self.search_, self.search_stopped_ = float(self.scale), {}, []
        setattr(self, f"{self.scale_name}_", best)
        self._data_fingerprint = data_fingerprint(X, y)
        self._data_points = len(X)
        self._searched = (
            self.searches if self._split_as_searched is None else self._split_as_searched
        )
        self.ensemble_ = build(best)
        self.ensemble_.meta = self._meta(best, len(models), len(X), len(Xd), len(Xs))
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
            "size": self.size,
            "base_models": R,
            "seed": self.seed,
            "bn": self.bn,
            "params": params,
            "criterion": crit,
            "holdout": self.holdout,
            "dropped": list(getattr(self, "dropped_", [])),
            "validation_points": {"total": n_val, "directions": n_dir, "scoring": n_score},
            f"{self.scale_name}_search": {
                f"{k:.6g}": v for k, v in self.search_.items() if math.isfinite(v)
            },
            "search_stopped_early": [f"{k:.6g}" for k in self.search_stopped_],
            **self._hyperparameters(),
        }

    def _check_directions(self) -> None:
        """Find members whose step is NaN/inf: raise naming them, or (on_nonfinite="drop")
        keep their indices in `dropped_` (base-major numbering) and leave them out."""
        S = self.size
        bad = [
            r * S + i
            for r, D in enumerate(self.directions_)
            for i in range(len(D))
            if not torch.isfinite(D[i]).all()
        ]
        if bad and (self.on_nonfinite == "raise" or len(bad) == S * len(self.directions_)):
            raise NonFiniteError(
                f"members {bad[:10]} (base-major: member = base·{S} + i) have non-finite steps"
                + ("; every member diverged" if len(bad) == S * len(self.directions_) else "")
                + "; pass on_nonfinite='drop' to leave them out"
            )
        self.dropped_ = bad

    # ---------------------------------------------------------------- recipes
    def _recipe_options(self) -> dict[str, Any] | None:
        """Constructor arguments that rebuild this ensemble (None: not expressible as a recipe)."""
        if callable(self.params) or callable(self.criterion) or self.bn == "refresh":
            return None
        return {
            "size": self.size,
            "seed": self.seed,
            "bn": self.bn,
            "params": self.params,
            "criterion": self.criterion,
            "eval_batch_size": self.eval_batch_size,
            "max_score_points": self.max_score_points,
            "on_nonfinite": self.on_nonfinite,
            "early_stop": self.early_stop,
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
        ensemble = self.ensemble()
        options = None if materialize else self._recipe_options()
        if options is None:
            if not materialize:
                warnings.warn(
                    f"{type(self).__name__}.save: this ensemble cannot be stored as a recipe "
                    "(callable params/criterion/loss, momentum buffers or bn='refresh'); saving "
                    "every member (pass materialize=True to say so and silence this warning)",
                    stacklevel=2,
                )
            return ensemble.save(path)
        scale = float(getattr(self, f"{self.scale_name}_"))
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
            "members": len(ensemble),
            "fingerprints": displacement_fingerprints(self.directions_, scale),
        }
        bases = Ensemble.from_state_dicts(self._skeleton, self._bases)
        bases.meta = {**ensemble.meta, "recipe": recipe}
        return bases.save(path)

    def ensemble_at(self, scale: float) -> Ensemble:
        """The members at another scale, from the stored directions (no gradient is recomputed).

        Members are θ_r + scale·D_r[i] for every base r and member i, base-major; scale 0 gives
        copies of the base models. Used by the scale search, and to plot a metric against it.
        """
        if not hasattr(self, "directions_"):
            raise AttributeError(f"{type(self).__name__}: call fit(...) before ensemble_at(...)")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
            raise ValueError(f"scale: expected a finite number >= 0, got {scale!r}")
        names, bases = self.param_names_, self._bases
        shapes = [bases[0][n].shape for n in names]
        sizes = [math.prod(s) for s in shapes]
        states = []
        dropped = set(getattr(self, "dropped_", ()))
        for r, (base, D) in enumerate(zip(bases, self.directions_, strict=True)):
            steps = (scale * D).split(sizes, dim=1)  # per parameter: [S, numel]
            for i in range(D.shape[0]):
                if r * D.shape[0] + i in dropped:
                    continue
                state = dict(base)
                for n, shape, step in zip(names, shapes, steps, strict=True):
                    state[n] = base[n] + step[i].view(shape).to(base[n].dtype)
                if self._bn_batches is not None:
                    state = refresh_bn(self._skeleton, state, self._bn_batches)
                states.append(state)
        return Ensemble.from_state_dicts(self._skeleton, states)


def rebuild_recipe(bases: Ensemble, recipe: dict[str, Any], val: Data) -> PerturbationEnsemble:
    """Rebuild a PEG/PEP ensemble saved as a recipe, and check it (see `peg.recipe`).

    Raises ArchiveError (a ValueError) if `val` is not the data the ensemble was made from, or
    if the rebuilt members differ from the recorded fingerprints (the code changed).
    """
    from peg.archive import ArchiveError
    from peg.methods.peg import PEG
    from peg.methods.pep import PEP

    classes: dict[str, type[PerturbationEnsemble]] = {PEG.method: PEG, PEP.method: PEP}
    if recipe.get("recipe_version", 0) > RECIPE_VERSION or recipe.get("method") not in classes:
        raise ArchiveError(f"recipe: unknown kind {recipe.get('method')!r} or newer version")
    X, y = as_xy(val, "val")
    assert y is not None
    if data_fingerprint(X, y) != recipe["data"]:
        raise ArchiveError(
            "val: not the validation data this ensemble was built from (its fingerprint differs); "
            "pass the same (X, y), in the same order"
        )
    rebuilt = classes[recipe["method"]](
        **recipe["options"], **{recipe["scale_name"]: recipe["scale"]}, progress=False
    )
    rebuilt._split_as_searched = bool(recipe["searched"])
    rebuilt.fit(bases, (X, y))
    got = displacement_fingerprints(rebuilt.directions_, recipe["scale"])
    bad = fingerprints_match(got, recipe["fingerprints"])
    if bad:
        raise ArchiveError(
            f"recipe: rebuilt members {bad[:5]} differ from the ones saved (relative tolerance "
            f"{TOLERANCE}): the code or the library version changed since; save with "
            "materialize=True to keep the members themselves"
        )
    return rebuilt


def refresh_bn(
    skeleton: nn.Module, state: dict[str, Tensor], batches: list[Tensor]
) -> dict[str, Tensor]:
    """`state` with BatchNorm running statistics re-estimated on `batches` (swa_utils.update_bn)."""
    model = copy.deepcopy(skeleton)
    model.load_state_dict(state)
    update_bn(batches, model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
