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

import copy
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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
    iter_inputs,
    model_device,
    to_device,
    weights_device,
)
from peg._params import entry_views
from peg._progress import counter
from peg.ensemble import STRATEGIES, Ensemble, Strategy, autocast_dtype, model_output
from peg.methods._search import PairedRace, select_scale
from peg.methods.base import FittedEnsemble, NotFittedError
from peg.metrics._inputs import pred_and_labels
from peg.recipe import (
    FINGERPRINT_SEED,
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
RACE_FIRST = 1024  # scoring points of a race's first look (`PairedRace`), doubling after


def _point_nll(logits: Tensor, y: Tensor) -> Tensor:
    """Per-point NLL `[N]` of the ensemble of member logits `[M, N, C]` (mean: `metrics.nll`)."""
    log_p, y = pred_and_labels(logits, y)
    return -log_p.gather(1, y[:, None]).squeeze(1)


def _point_brier(logits: Tensor, y: Tensor) -> Tensor:
    """Per-point Brier score `[N]` (mean: `metrics.brier`)."""
    p, y = pred_and_labels(logits, y, log=False)
    return (p - torch.nn.functional.one_hot(y, p.shape[1]).to(p.dtype)).pow(2).sum(-1)


POINT_LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "nll": _point_nll,
    "brier": _point_brier,
}
REGRESSION_CRITERIA: dict[str, Callable[[Tensor, Tensor], float]] = {"nll": mixture_nll}


def is_regression(y: Tensor) -> bool:
    """Floating-point targets mean regression; integer labels mean classification."""
    return torch.is_floating_point(y)


# Random-stream keys: (MEMBER_KEY, base, member) for anything drawn per member.
MEMBER_KEY = 0
SPLIT_KEY = 2**31  # the validation split into gradient and scoring parts


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


def module_like(skeleton: nn.Module, state: Mapping[str, Tensor]) -> nn.Module:
    """A copy of `skeleton` whose state-dict entries ARE the tensors of `state` (no copy).

    Used to run a stored base model without duplicating its weights, and with tensors on the
    meta device for a skeleton that costs no memory. Buffers outside the state dict
    (non-persistent ones) are copied.
    """
    memo: dict[int, Any] = {}
    for name, t in skeleton.state_dict(keep_vars=True).items():
        memo[id(t)] = (
            nn.Parameter(state[name], requires_grad=t.requires_grad)
            if isinstance(t, nn.Parameter)
            else state[name]
        )
    return copy.deepcopy(skeleton, memo)


def fingerprint_probe(P: int) -> Tensor:
    """The fixed random vector `[P]` (float32) that `displacement_fingerprints` projects on."""
    return torch.randn(P, generator=torch.Generator().manual_seed(FINGERPRINT_SEED))


def fingerprint_rows(
    D: Tensor, scale: float, probe: Tensor, step: int = 2**20
) -> list[list[float]]:
    """`peg.recipe.displacement_fingerprints` of the rows of D `[k, P]` (equal to its relative
    tolerance), in float64 pieces of `step` entries instead of a float64 copy of every row;
    `probe` is `fingerprint_probe(P)`."""
    out = []
    for row in D:
        proj = sq = 0.0
        for a in range(0, len(row), step):
            v = scale * row[a : a + step].detach().double().cpu()
            proj += float(v @ probe[a : a + step].double())
            sq += float(v @ v)
        out.append([proj, math.sqrt(sq)])
    return out


class NonFiniteError(FloatingPointError):
    """A loss, gradient or member weight became NaN or infinite."""


def finite_rows(D: Tensor) -> list[bool]:
    """Whether each row of D `[k, P]` is free of NaN and inf."""
    return [bool(torch.isfinite(row).all()) for row in D]


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
    lazy = False  # set by the constructor (see the module doc)
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
        lazy: bool = False,
        race: float = 3.0,
    ) -> None:
        self.size = check_positive_int(size, "size")
        self.race = check_number(race, "race", allow_zero=True)
        if not isinstance(lazy, bool):
            raise TypeError(f"lazy: expected True or False, got {lazy!r}")
        self.lazy = lazy
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

    def _split(self, X: Tensor, y: Tensor) -> tuple[DirectionData, tuple[Tensor, Tensor]]:
        """(direction data, scoring data): disjoint when a scale is searched and holdout > 0.

        The direction data refers to X and y (rows picked by index, not copied). The scoring
        part is a seeded random subset of at most `max_score_points` points.
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
            data = DirectionData(X, y, direction)
        else:
            score, data = perm, DirectionData(X, y)
        score = score[: self.max_score_points]
        return data, (X[score], y[score])

    def fit(self, model: Models, val: Data, bn_data: Data | None = None) -> PerturbationEnsemble:
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
                f" after holding out {self.holdout:.0%} for choosing {self.scale_name}"
                if len(data) < len(X)
                else ""
            )
            raise ValueError(
                f"val: {len(data)} points{where}; {self.method} needs at least {need} "
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
        for stale in ("directions_", "ensemble_", "_direction_data", "_fingerprints", "dropped_"):
            self.__dict__.pop(stale, None)  # a refit replaces everything
        sources = [self._row_source(m, r, names, data) for r, m in enumerate(models)]
        if self.lazy and not self.searches:  # chunk by chunk: never all S·R rows at once
            bad = []  # one row at a time, only checked: the fingerprints are taken by save()
            for r, members, D in self._chunks(sources, 1):
                bad += [
                    r * self.size + i
                    for i, ok in zip(members, finite_rows(D), strict=True)
                    if not ok
                ]
                del D
        else:
            self.directions_ = [source(range(self.size)) for source in sources]
            bad = [
                r * self.size + i
                for r, D in enumerate(self.directions_)
                for i, ok in enumerate(finite_rows(D))
                if not ok
            ]
        del sources
        self._check_directions(bad, len(models))
        build = self.ensemble_at

        if self.searches:
            grid = self.default_grid if self.scale == "search" else self.scale
            table = REGRESSION_CRITERIA if is_regression(y) else CRITERIA
            criterion = table.get(self.criterion, self.criterion)  # type: ignore[arg-type]

            name = f"{self.method} {self.scale_name} search"
            with counter(name, self.progress) as shown:
                # a mean of non-negative per-point losses is raced (`PairedRace`), or scored
                # batch by batch and stopped once its partial sum / N exceeds the best so far
                per_point = self.criterion in PER_POINT and not is_regression(y)
                points: dict[float, int] = {}  # scale → points scored
                race: PairedRace | None = None

                def show(scale: float, value: float) -> float:
                    shown.update(1)
                    shown.set_postfix_str(f"{self.scale_name}={scale:.3g} score={value:.4g}")
                    return value

                def score(scale: float, stop_above: float = math.inf) -> float:
                    ensemble = build(scale)
                    batches = Xs.split(self.eval_batch_size) if per_point else [Xs]
                    total, start = 0.0, 0  # per point: the sum of the losses seen so far
                    points[scale] = len(Xs)
                    for x in batches:
                        logits = ensemble.member_logits(x, self.eval_batch_size, progress=False)
                        if not torch.isfinite(logits).all():
                            value = math.inf  # diverged: the worst score
                            break
                        value = float(criterion(logits, ys[start : start + len(x)]))
                        if not per_point:
                            break  # one batch: the whole scoring set
                        total += value * len(x)
                        start += len(x)
                        value = total / len(Xs)  # until the last batch, a lower bound
                        if value > stop_above and start < len(Xs):
                            points[scale] = start  # above the best: it cannot win
                            break
                    return show(scale, value)

                if per_point and self.race > 0:
                    point_loss = POINT_LOSSES[str(self.criterion)]
                    built: dict[float, Ensemble] = {}  # the two scales racing, built once each

                    def losses(scale: float, start: int, stop: int) -> Tensor | None:
                        if scale in built:
                            built[scale] = built.pop(scale)  # the most recently used last
                        else:
                            while len(built) > 1:
                                del built[next(iter(built))]
                            built[scale] = build(scale)
                        logits = built[scale].member_logits(
                            Xs[start:stop], self.eval_batch_size, progress=False
                        )
                        if not torch.isfinite(logits).all():
                            return None
                        return point_loss(logits, ys[start:stop])

                    race = PairedRace(losses, len(Xs), self.race, RACE_FIRST)

                    def raced(scale: float, stop_above: float = math.inf) -> float:
                        return show(scale, race(scale))

                best, self.search_ = select_scale(
                    raced if race is not None else score,
                    grid,
                    refine=self.scale == "search",
                    stop_above=self.early_stop,
                    tol=self.search_tol,
                )
                points = race.points if race is not None else points
                self.search_points_ = {s: points.get(s, 0) for s in self.search_}
                self.search_stopped_ = [s for s, n in self.search_points_.items() if n < len(Xs)]
        else:
            best, self.search_, self.search_stopped_ = float(self.scale), {}, []
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
        self.ensemble_ = build(best)
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
            "search_points": {f"{k:.6g}": n for k, n in self.search_points_.items()},
            **self._hyperparameters(),
        }

    def _check_directions(self, bad: list[int], R: int) -> None:
        """Members `bad` (base-major numbering) have NaN/inf steps: raise naming them, or
        (on_nonfinite="drop") keep their indices in `dropped_` and leave them out."""
        S = self.size
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
            kept = [i for i in range(self.size) if r * self.size + i not in dropped]
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
                    found[r * self.size + i] = fp
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
            return self.size * len(self._bases) - len(self.dropped_)
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
                directions = [source(range(self.size)) for source in self._lazy_sources()]
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
