"""Split conformal classification on any predictor (Vovk et al. 2005; Angelopoulos & Bates
2021): prediction sets that hold the true label with probability >= 1 - alpha for exchangeable
data, whatever the model.

`ConformalClassifier(alpha, score).fit(predictor, val)` reads the calibration data once,
keeping one score per point (the label's nonconformity score under the predictor's averaged
probabilities), and takes their ⌈(n + 1)(1 − α)⌉-th smallest as the threshold q̂ (`quantile_`;
per class for `class_conditional=True`). `predict_set(X)` is `{c : score_c(x) ≤ q̂}`; the
scores and the quantile are `peg.methods.conformal._split`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from peg._forward import warn_probabilities
from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods._predictors import check_classes, read_predictor
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import stored
from peg.methods.conformal._base import ConformalBase
from peg.methods.conformal._shift import (
    FEATURES_OPTION,
    HEAVY,
    SEPARABLE,
    SHIFTS,
    WEIGHT_CUTOFFS,
    check_target,
    covariate_sets,
    fit_shifted,
)
from peg.methods.conformal._split import (
    ALPHA,
    SCORES,
    check_scores,
    class_scores,
    class_sets,
    conformal_quantile,
    ensemble_probs,
    labelled_batches,
    min_points,
    quantile_rank,
)
from peg.methods.conformal.kinds import refuse_other_kinds
from peg.source import Data, Source
from peg.source._namespace import like_input
from peg.source._values import check_finite_logits, check_labels
from peg.source.batches import BatchFn
from peg.streams import generator


def _randomized_needs_mass(cp: Any) -> None:
    if cp.randomized and cp.score == "lac":
        raise ValueError(
            "randomized: LAC has no randomised variant (its score has no mass to split); "
            "use score='aps' or 'raps'"
        )


def _one_weighting(cp: Any) -> None:
    if cp.shift is not None and cp.class_conditional:
        raise ValueError("class_conditional: not available with shift (one weighting)")


class ConformalClassifier(ConformalBase):
    """Split conformal prediction sets for a classifier: C(x) = {c : s(x, c) ≤ q̂}, q̂ the
    ⌈(n + 1)(1 − α)⌉-th smallest score of the n calibration points, so P(y ∈ C(x)) ≥ 1 − α on
    average over exchangeable data (Vovk et al. 2005; Angelopoulos & Bates 2021, "A Gentle
    Introduction to Conformal Prediction and Distribution-Free Uncertainty Quantification").

    Args:
        alpha: the miscoverage level in (0, 1): sets hold the label with probability >= 1 - α.
        score: "lac" (1 − p̂_y: the smallest sets on average), "aps" (the mass of the classes
            ranked up to y: adaptive sets, better conditional coverage) or "raps" (APS plus
            `lam`·(rank − `k_reg`)⁺: APS without its long tails).
        class_conditional: one quantile per class (Mondrian conformal): coverage >= 1 − α
            for every class, not only on average; each class needs >= 1/α − 1 points.
        k_reg, lam: RAPS's regularisation (the rank from which a class is penalised, and the
            penalty per rank); unused by LAC and APS.
        randomized: APS/RAPS with the uniform draw u (score = mass before y + u·p̂_y): exact
            coverage 1 − α in expectation and smaller sets; the draws come from `seed`.
        seed: the random stream of the randomised scores (calibration and each `predict_set`
            call start from it, so a prediction is reproducible for the same rows in order).
        shift: None (exchangeable data), "covariate" or "label": weighted split conformal for
            a deployment whose inputs (covariate shift, Tibshirani et al. 2019) or class priors
            (label shift, Podkopaev & Ramdas 2021) differ from the calibration data's; `fit`
            then needs `target=` unlabelled deployment inputs (`peg.methods.conformal._shift`;
            docs/shift.md says when the guarantee holds). Label shift reads `val` a second
            time, to fit `peg.LabelShift` (EM after BCTS) for the priors (`priors_`).
        features: what the covariate-shift domain classifier reads: "penultimate" (the
            model's trunk; the logits, with a warning, for a model without one), "logits"
            (log p̄) or "inputs" (flattened).
        n_folds: the domain classifier's cross-fitting folds.
        max_auroc, min_ess, warn_ess: the cut-offs of the covariate-shift weights
            (`peg.methods.conformal._shift.DomainWeights.check`, docs/shift.md): `fit` refuses
            where the domain classifier's out-of-fold AUROC is >= `max_auroc` (no overlap:
            unbounded weights) or the weights' effective sample size (Σw)² / Σw² is below
            `min_ess` (None: 1/α − 1, the fewest points a conformal quantile needs), and warns
            below `warn_ess` · n (heavy weights: wide sets that vary between calibration sets).
        batch_size, batch_fn: how the predictor reads data (`peg.source.batches`).

    After `fit(predictor, val)`: `quantile_` (q̂, a float, or `[C]` per class; label shift:
    `[C]` per candidate class; covariate shift: None, the threshold is per test point),
    `n_calib_`, `n_classes_`, `predictor_`, `meta_`; `predict_set(X) -> bool [N, C]`;
    `member_logits` / `predict_proba` / `predict` are the predictor's; `save(path)` /
    `peg.load(path, model)` as every calibrator.

    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 3, (300,), generator=g)
        >>> logits = torch.randn(300, 3, generator=g)
        >>> logits[torch.arange(300), labels] += 1.0
        >>> logits = 4 * logits  # an over-confident model's saved logits [N, C]
        >>> conformal = peg.ConformalClassifier(alpha=0.1).fit(logits[:200], labels[:200])
        >>> sets = conformal.predict_set(logits[200:])  # bool [N, C]: the classes in each set
        >>> sets.shape, sets.dtype
        (torch.Size([100, 3]), torch.bool)

    See Also:
        peg.ConformalRegressor: intervals for a regressor, the same guarantee.
        peg.TemperatureScaling: probabilities instead of sets.
        docs/conformal.md: the scores (LAC, APS, RAPS), class-conditional sets and shift.
    """

    method = "conformal"
    label = "conformal prediction"

    def __init__(
        self,
        *,
        alpha: float = 0.1,
        score: str = "lac",
        class_conditional: bool = False,
        k_reg: int = 1,
        lam: float = 0.01,
        randomized: bool = False,
        seed: int = 0,
        shift: str | None = None,
        features: str = "penultimate",
        n_folds: int = 5,
        max_auroc: float = SEPARABLE,
        min_ess: float | None = None,
        warn_ess: float = HEAVY,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "alpha": ALPHA,
        "score": checks.one_of(*SCORES),
        "class_conditional": checks.boolean(),
        "k_reg": checks.positive_int(minimum=0),
        "lam": checks.number(allow_zero=True),
        "randomized": checks.boolean(),
        "seed": checks.positive_int(minimum=0),
        "shift": checks.one_of(*SHIFTS),
        "features": FEATURES_OPTION,
        "n_folds": checks.positive_int(minimum=2),
        **WEIGHT_CUTOFFS,
        **ConformalBase.parameter_constraints,
    }
    parameter_rules: ClassVar[tuple[checks.Rule, ...]] = (
        _randomized_needs_mass,
        _one_weighting,
    )

    # ---------------------------------------------------------------- scores
    def _probs_and_draws(
        self, logits: Tensor, u: torch.Generator | None, what: str, start: int | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """The averaged probabilities `[B, C]` of member logits `[M, B, C]` (checked: finite,
        as every calibrator's, `check_finite_logits`; rows from `start`) and the randomised
        scores' uniform draws `[B]` (None when not randomised)."""
        check_finite_logits(logits, what, start)
        probs = ensemble_probs(logits)
        check_scores(probs, what)
        draws = None if u is None else torch.rand(len(probs), generator=u, dtype=torch.float64)
        return probs, None if draws is None else draws.to(probs.device)

    def _stream(self, key: int) -> torch.Generator | None:
        return generator(int(self.seed), key) if self.randomized else None

    # ---------------------------------------------------------------- fitting
    def fit(
        self,
        predictor: Any,
        val: Data | None = None,
        *,
        target: Data | None = None,
        bn_data: Data | None = None,
        classes: Any = None,
    ) -> ConformalClassifier:
        """Fit q̂ on labelled calibration data `val` ((X, y), Dataset or DataLoader), read
        once (one score per point is kept); returns self. `fit(logits, labels)` takes saved
        logits `[N, C]` and their labels (`peg.methods._predictors.read_predictor`).
        `target`: unlabelled deployment inputs, with `shift` only. `bn_data` is unused.
        `classes`: the class of each logit column, in order, where the labels name their
        classes (strings): each label is read as its class's column."""
        self._check_params()
        refuse_other_kinds(predictor, val)  # binary, multi-label, dense: their own predictors
        # fit(logits, labels) too; labels named by `classes` read as their indices
        predictor, val = read_predictor(predictor, val, classes=classes)
        if val is None:
            raise ValueError("val: conformal prediction needs labelled calibration data (X, y)")
        check_target(self.shift, target, val)
        if self.shift is not None:
            self._set_fitted(predictor, fit_shifted(self, predictor, val, target))
            return self
        rows = Source(val).known_rows()
        if rows is not None:  # too few points: said before reading them
            quantile_rank(rows, float(self.alpha))
        size = int(self.batch_size)
        batches = labelled_batches(predictor, val, size, self.batch_fn, "val")
        score, y, width = self.label_scores(batches, isinstance(predictor, nn.Identity))
        check_classes(classes, width)
        self._set_fitted(
            predictor,
            {
                "quantile_": self._quantiles(score, y, width),
                "n_calib_": len(score),
                "n_classes_": width,
                "scores_": "log_probs",
            },
        )
        return self

    def label_scores(
        self, batches: Iterable[tuple[Tensor, Tensor]], saved: bool = False
    ) -> tuple[Tensor, Tensor, int]:
        """The scores of the labels `[n]` (float64, CPU), the labels `[n]` and the number of
        classes, from `(member logits [M, B, C], labels [B])` batches of calibration data
        (`saved`: saved logits, for the warning of probabilities)."""
        u = self._stream(0)
        scores, labels, classes, start = [], [], None, 0
        for logits, y in batches:
            if logits.ndim != 3 or (classes is not None and logits.shape[-1] != classes):
                raise ValueError(
                    f"predictor: expected member logits [M, B, {classes or 'C'}], got "
                    f"{tuple(logits.shape)}"
                )
            if classes is None:
                warn_probabilities(logits[0], saved)
            classes = logits.shape[-1]
            y = check_labels(y, logits.shape[1], classes, "val labels", logits.device)
            probs, draws = self._probs_and_draws(logits, u, "val", start)
            start += logits.shape[1]
            every = class_scores(probs, self.score, int(self.k_reg), float(self.lam), draws)
            scores.append(every.gather(1, y[:, None])[:, 0].cpu())
            labels.append(y.cpu())
        if classes is None:
            raise ValueError("val: no calibration points (0 samples)")
        return torch.cat(scores), torch.cat(labels), classes

    def _quantiles(self, score: Tensor, y: Tensor, classes: int) -> float | Tensor:
        alpha = float(self.alpha)
        if not self.class_conditional:
            return conformal_quantile(score, alpha)
        counts = torch.bincount(y, minlength=classes)
        need = min_points(alpha)
        few = [c for c in range(classes) if int(counts[c]) < need]
        if few:
            shown = ", ".join(f"class {c}: {int(counts[c])}" for c in few[:5])
            raise ValueError(
                f"val: class_conditional=True needs >= {need} calibration points per class "
                f"for alpha={alpha:g}; too few for {len(few)} of {classes} classes ({shown})"
            )
        return torch.tensor(
            [conformal_quantile(score[y == c], alpha) for c in range(classes)],
            dtype=torch.float64,
        )

    # ---------------------------------------------------------------- predicting
    def sets_of(
        self, logits: Tensor, u: torch.Generator | None = None, start: int | None = None
    ) -> Tensor:
        """Prediction sets `[B, C]` bool of member logits `[M, B, C]` (`u`: the random stream
        of a randomised score, drawn from in row order; None: a fresh one from `seed`;
        `start`: the batch's first row in X, which an error names)."""
        self._check_fitted()
        if logits.shape[-1] != self.n_classes_:
            raise ValueError(
                f"X: the predictor gives {logits.shape[-1]} classes, fitted on {self.n_classes_}"
            )
        u = self._stream(1) if u is None else u
        probs, draws = self._probs_and_draws(logits, u, "X", start)
        k_reg, lam = int(self.k_reg), float(self.lam)
        return class_sets(probs, self.quantile_, self.score, k_reg, lam, draws)

    def sets_fn(self) -> Callable[[Tensor], Tensor]:
        """`logits [M, B, C] -> sets [B, C]` for consecutive batches, drawing the randomised
        scores in row order as `predict_set` does (what `peg.evaluate` streams)."""
        self._check_fitted()
        if self.shift == "covariate":
            raise TypeError(
                "shift='covariate': a set's threshold depends on the input's weight, not on its "
                "logits alone; use predict_set(X)"
            )
        u, rows = self._stream(1), [0]

        def sets(logits: Tensor) -> Tensor:
            start, rows[0] = rows[0], rows[0] + logits.shape[1]
            return self.sets_of(logits, u, start)

        return sets

    def predict_set(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None
    ) -> Tensor:
        """Prediction sets `[N, C]` bool: `sets[n, c]` says class c is in the set of row n (a
        NumPy array for NumPy inputs, a tensor otherwise)."""
        if self.shift == "covariate":
            return like_input(covariate_sets(self, X, batch_size, batch_fn), X)
        make = self.sets_fn()
        sets = torch.cat([make(b) for b in self._batches(X, batch_size, batch_fn)])
        return like_input(sets, X)

    # ---------------------------------------------------------------- persistence
    def _entry(self) -> dict[str, Any]:
        q = self.quantile_
        return {
            "quantile": None if q is None or isinstance(q, Tensor) else float(q),
            "n_calib": int(self.n_calib_),
            "n_classes": int(self.n_classes_),
        }

    def _tensors(self) -> dict[str, Tensor]:
        if self.shift == "covariate":
            raise TypeError(
                "save: a covariate-shift conformal predictor holds a domain classifier, which "
                "peg does not save yet; refit it from the calibration and target data"
            )
        q = self.quantile_
        return {"quantiles": q} if isinstance(q, Tensor) else {}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        n, c = entry.get("n_calib"), entry.get("n_classes")
        if not all(isinstance(v, int) and v >= 1 for v in (n, c)):
            raise ArchiveError(f"calibration: bad n_calib / n_classes {n!r} / {c!r}")
        q: Any = entry.get("quantile")
        if self.class_conditional or self.shift == "label":
            q = stored(tensors, "quantiles", (c,))
        elif not isinstance(q, (int, float)) or isinstance(q, bool) or not math.isfinite(q):
            raise ArchiveError(f"calibration: expected a finite quantile, got {q!r}")
        self._check_range(q, c)
        return {"quantile_": q, "n_calib_": n, "n_classes_": c}

    def _check_range(self, q: float | Tensor, classes: int) -> None:
        """q̂ within the range of its score (an `ArchiveError` naming the field): LAC 1 − p̂ and
        APS a probability mass lie in [0, 1], RAPS adds up to λ (C − k_reg)⁺. A quantile of -5
        loaded and covered nothing."""
        high = 1.0
        if self.score == "raps":
            high += float(self.lam) * max(classes - int(self.k_reg), 0)
        values = q.reshape(-1) if isinstance(q, Tensor) else torch.tensor([float(q)])
        # rounding: APS's cumulated mass may pass 1 by a few ulps
        bad = (values < -1e-9) | (values > high + 1e-9)
        if bool(bad.any()):
            name = "'quantiles' tensor" if isinstance(q, Tensor) else "'meta.calibration.quantile'"
            raise ArchiveError(
                f"calibration: {name}: expected {self.score.upper()} thresholds in [0, "
                f"{high:g}] (its scores' range), got {float(values[bad][0]):g}"
            )
