"""Affine calibration maps of the scores: vector and matrix scaling (Guo et al. 2017) and
Dirichlet calibration (Kull et al. 2019).

All three map scores s `[N, C]` to s W^T + b (W `[C, C]`; diagonal for vector scaling, stored as
its diagonal `[C]`) and take the softmax. They are fitted on validation NLL in float64 by a
deterministic optimiser (Newton's method; truncated Newton for maps too large for a Hessian:
`peg.methods.calibration._affine`), from temperature scaling's map (W = I / T, b = 0), with a
penalty:

- by default (`reg_lambda="auto"`, `reg_mu="auto"`), shrinkage towards temperature scaling,
  its strengths (on W's diagonal and b, then on W's off-diagonal) chosen by cross-validation
  on the validation data (`peg.methods.calibration._affine_select`): k = ∞ is temperature
  scaling itself, so a map keeps more than TS only where that predicted held-out points better.
  Fitted without it, the maps lost to TS by up to +9 nats (vector) and +143 (Dirichlet) at 1000
  classes and 5 points per class;
- with numbers, the penalties of Kull et al. 2019 ("Fitting and ODIR regularisation"), each a
  mean over the entries it covers as in the paper: ODIR (off-diagonal and intercept
  regularisation), λ/(C(C-1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j² (the diagonal is left free, so
  λ, μ → ∞ gives vector scaling without intercept), and L2 (Dirichlet only):
  l2/(C(C+1)) (Σ_ij W_ij² + Σ_j b_j²), towards W = 0, b = 0 (the reference code's
  `reg_format=None`); 0 and 0: Guo et al.'s unregularised maps.

Either way the rows of a class absent from the validation labels stay at temperature scaling's
(nothing there is data; `peg.methods.calibration._affine`), and fewer than 10 points per class
is a warning naming the map and the counts (`peg.methods.calibration._few_points`).

What the scores are: **log p̄**, the log of the averaged prediction (`ensemble_log_probs`, what
temperature scaling scales), for Dirichlet calibration (its definition: the log of the
probabilities; for one model, log softmax z) and for vector / matrix scaling of an ensemble,
which has no single logits. For a one-member predictor (an nn.Module, a one-member
`Ensemble`), vector and matrix scaling act by default on its **raw logits** z, as Guo et al.
define them (`scores="auto"`). log p̄ = z - logsumexp(z) differs from z by a per-row constant,
which temperature scaling ignores but a non-scalar W does not (W (z - c 1) = W z - c W 1): on
one model, matrix scaling of log p̄ *is* (unregularised) Dirichlet calibration, and of the
logits it is Guo et al.'s. `scores="log_probs"` makes them act on log p̄ for any predictor.
Either way vector scaling contains temperature scaling (W = I / T, b = 0), so its fitted
validation NLL is never above it (up to the optimiser's tolerance).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.calibration._affine import affine, fit_affine
from peg.methods.calibration._affine_select import FOLDS, fit_auto
from peg.methods.calibration._calibrator import Calibrator, stored
from peg.methods.calibration._export import CalibrationMap, as_f64
from peg.methods.calibration._few_points import warn_few_points
from peg.methods.calibration.temperature import TemperatureScaling
from peg.source._kinds import IGNORE_INDEX
from peg.source.batches import BatchFn

SCORE_OPTIONS = ("auto", "log_probs")
AUTO = "auto"
OLD_DEFAULTS = {"DirichletCalibration": 10.0}  # λ and μ before "auto" (matrix, vector: 0)


def _auto_or_number(value: Any, name: str) -> None:
    """ "auto" or a finite number >= 0."""
    if not (isinstance(value, str) and value == AUTO):
        try:
            checks.number(allow_zero=True)(value, name)
        except (TypeError, ValueError) as e:
            raise type(e)(f'{e} or "auto"') from None


AUTO_OR_NUMBER = checks.described(_auto_or_number, "'auto' or a finite number >= 0")


def fixed_strengths(method: Any) -> dict[str, float] | None:
    """Kull et al.'s strengths where any is given as a number (or an L2 penalty is asked for),
    an "auto" among them standing for its value before "auto" was the default (`OLD_DEFAULTS`,
    so `DirichletCalibration(reg_lambda=1.0)` means what it did); None: all "auto"."""
    names = [n for n in ("reg_lambda", "reg_mu") if n in type(method)._param_names()]
    given = {n: getattr(method, n) for n in names}
    l2 = float(getattr(method, "l2", 0.0))
    if all(isinstance(v, str) for v in given.values()) and l2 == 0.0:
        return None
    old = OLD_DEFAULTS.get(type(method).__name__, 0.0)
    fixed = {n: old if isinstance(v, str) else float(v) for n, v in given.items()}
    return {"reg_lambda": 0.0, "reg_mu": 0.0, **fixed, "l2": l2}


class Affine(CalibrationMap):
    """Vector and matrix scaling, Dirichlet calibration: s W^T + b (W `[C, C]`, or `[C]`)."""

    weights: Tensor
    bias: Tensor

    def __init__(self, scores: str, weights: Tensor, bias: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("weights", as_f64(weights))
        self.register_buffer("bias", as_f64(bias))

    def log_probs(self, s: Tensor) -> Tensor:
        return affine(s, self.weights, self.bias)


class _Affine(Calibrator):
    """What vector, matrix scaling and Dirichlet calibration share: `weights_`, `bias_`."""

    class_wise = True

    full = True
    scores: str = "log_probs"
    reg_lambda: float | str = 0.0
    reg_mu: float | str = 0.0
    l2: float = 0.0
    cv: int = FOLDS
    max_iter: int

    def _score_kind(self, logits: Tensor) -> str:
        one = self.scores == "auto" and logits.shape[0] == 1
        return "logits" if one else "log_probs"

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        fixed = fixed_strengths(self)
        if fixed is None:
            weights, bias, chosen = fit_auto(
                scores, y, full=self.full, max_iter=int(self.max_iter), cv=int(self.cv)
            )
        else:
            weights, bias = fit_affine(
                scores, y, full=self.full, max_iter=int(self.max_iter), **fixed
            )
            chosen = None
        self._warn_few_points(y, scores.shape[1], chosen)
        return {"weights_": weights, "bias_": bias, "regularisation_": chosen}

    def _warn_few_points(self, y: Tensor, c: int, chosen: dict[str, Any] | None) -> None:
        if chosen is None:
            outcome = (
                "with the fixed strengths given it may fit noise: leave reg_lambda and reg_mu "
                '"auto" (shrinkage towards temperature scaling chosen by cross-validation)'
            )
        else:
            ks = [chosen["k_diagonal"], *([chosen["k_off"]] if self.full else [])]
            shown = "/".join("∞" if k is None else f"{k:g}" for k in ks)
            outcome = f"cross-validation chose a prior of {shown} points per class towards "
            outcome += "temperature scaling" + (
                " (its map)" if all(k is None for k in ks) else ""
            )  # fmt: skip
        warn_few_points(y, c, self.label, outcome)

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Affine(self.scores_, self.weights_, self.bias_)

    def _entry(self) -> dict[str, Any]:
        chosen = getattr(self, "regularisation_", None)
        return {} if chosen is None else {"regularisation": _json(chosen)}

    def _apply(self, scores: Tensor) -> Tensor:
        return affine(scores, self.weights_, self.bias_)

    def _classes_of(self, state: Mapping[str, Any]) -> int | None:
        return int(state["bias_"].shape[0])

    def _tensors(self) -> dict[str, Tensor]:
        return {"weights": self.weights_, "bias": self.bias_}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        bias = stored(tensors, "bias")
        c = bias.shape[0]
        weights = stored(tensors, "weights", (c, c) if self.full else (c,))
        chosen = entry.get("regularisation")
        if chosen is not None and not isinstance(chosen, dict):
            raise ArchiveError(f"calibration: regularisation must be a mapping, got {chosen!r}")
        return {"weights_": weights, "bias_": bias, "regularisation_": chosen}


def _json(chosen: Mapping[str, Any]) -> dict[str, Any]:
    """The record of the chosen strengths as JSON (an infinite NLL as None)."""

    def plain(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {str(k): plain(x) for k, x in v.items()}
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return plain(chosen)


class VectorScaling(_Affine):
    """Vector scaling (Guo et al. 2017): softmax(w ⊙ s + b), w and b `[C]`, on validation NLL.

    Args:
        reg_mu: "auto" (default): w and b shrunk towards temperature scaling's (w = 1/T, b = 0)
            by a strength chosen by cross-validation on the validation data (see
            `peg.methods.calibration.scaling`); a number: Kull et al.'s μ on the mean squared
            intercept alone (0: Guo et al.'s unregularised vector scaling).
        cv: folds of the cross-validation choosing the "auto" strengths (>= 2).
        scores: "auto" (the raw logits of a one-member predictor, as Guo et al.; log p̄ of an
            ensemble) or "log_probs" (log p̄ always); see `peg.methods.calibration.scaling`.
        max_iter: iterations of the optimiser (Newton's method: about ten suffice; L-BFGS,
            for maps too large for a Hessian, stops here).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape
            (`peg.source.batches`).
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "multiclass", "binary" or "multilabel" where the shapes could be either
            (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100; 255 in
            Cityscapes and VOC).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: where dense logits hold the classes, 1 (`[B, C, *S]`) or -1 (`[B, *S, C]`, a
            language model's); None: read from the shapes (an error where both read).

    After `fit(predictor, val)`: `weights_` (w `[C]`), `bias_` (b `[C]`), `scores_` (what they
    act on: "logits" or "log_probs"), `regularisation_` ("auto": T, the chosen strength in
    prior points per class, None for ∞, and the cross-validated NLL of each tried; None
    otherwise), `predictor_`, `meta_`; `member_logits(X) -> [1, N, C]`
    (w ⊙ s + b), `predict_proba`, `predict`, `save(path)` (w, b stored as tensors; `peg.load`).
    """

    method = "vector-scaling"
    label = "vector scaling"
    name = "Vector scaling"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    kinds = ("multiclass", "dense")
    table_name = "Vector-scaled"
    growth = 1  # 2C
    order = 1
    simplicity = 4
    # right after the one-parameter maps: the usual winner at many classes, a fold of O(C)
    # parameters like order-preserving's (0.72 s against 0.81 s at 100 classes, 5,000 points);
    # behind it, at load average ~11, it was priced at order-preserving's fold and not started
    # (+0.013 nats)
    cost_order = 2
    on_logits_default = True
    # every strength ∞: W = I / T, b = 0, temperature scaling's map
    parents: ClassVar[Mapping[str, str]] = {"temperature": TemperatureScaling.method}
    full = False

    def __init__(
        self,
        *,
        reg_mu: float | str = AUTO,
        cv: int = FOLDS,
        scores: str = "auto",
        max_iter: int = 200,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "reg_mu": AUTO_OR_NUMBER,
        "cv": checks.positive_int(minimum=2),
        "scores": checks.one_of(*SCORE_OPTIONS),
        "max_iter": checks.positive_int(),
        **Calibrator.parameter_constraints,
    }


class MatrixScaling(_Affine):
    """Matrix scaling (Guo et al. 2017): softmax(s W^T + b), W `[C, C]`, on validation NLL,
    optionally with ODIR (Kull et al. 2019: "MS-ODIR"; see `peg.methods.calibration.scaling`).

    Args:
        reg_lambda: "auto" (default, with `reg_mu`): W and b shrunk towards temperature
            scaling's (W = I / T, b = 0), the strengths on the diagonal and intercept and on
            the off-diagonal chosen by cross-validation on the validation data (see
            `peg.methods.calibration.scaling`); a number: λ of ODIR, on the mean squared
            off-diagonal weight (0: none, Guo et al.'s matrix scaling).
        reg_mu: "auto" (with `reg_lambda`), or μ of ODIR, on the mean squared intercept. With
            one of them a number, the other "auto" stands for 0 (its value before "auto").
        cv: folds of the cross-validation choosing the "auto" strengths (>= 2).
        scores: "auto" (the raw logits of a one-member predictor, as Guo et al.; log p̄ of an
            ensemble) or "log_probs" (log p̄ always).
        max_iter: iterations of the optimiser (Newton's method: about ten suffice; L-BFGS,
            for maps too large for a Hessian, stops here).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "multiclass", "binary" or "multilabel" where the shapes could be either
            (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100; 255 in
            Cityscapes and VOC).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: where dense logits hold the classes, 1 (`[B, C, *S]`) or -1 (`[B, *S, C]`, a
            language model's); None: read from the shapes (an error where both read).

    After `fit`: `weights_` (W `[C, C]`), `bias_` (b `[C]`), `scores_`, `regularisation_` (as
    vector scaling's, with `k_off`), `predictor_`, `meta_`;
    `member_logits(X) -> [1, N, C]` (s W^T + b). `save` stores W and b as tensors (C² float64
    values: 8 MB for C = 1000).
    """

    method = "matrix-scaling"
    label = "matrix scaling"
    name = "Matrix scaling"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    kinds = ("multiclass", "dense")
    table_name = "Matrix-scaled"
    growth = 2  # C² + C
    order = 2
    simplicity = 6
    cost_order = 6
    on_logits_default = True
    priced_from = VectorScaling.method
    # both on the logits: its off-diagonal strength ∞ makes it vector scaling's map
    parents: ClassVar[Mapping[str, str]] = {
        "temperature": TemperatureScaling.method,
        "diagonal": VectorScaling.method,
    }

    def __init__(
        self,
        *,
        reg_lambda: float | str = AUTO,
        reg_mu: float | str = AUTO,
        cv: int = FOLDS,
        scores: str = "auto",
        max_iter: int = 200,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "reg_lambda": AUTO_OR_NUMBER,
        **VectorScaling.parameter_constraints,
    }


class DirichletCalibration(_Affine):
    """Dirichlet calibration (Kull et al. 2019, "Beyond temperature scaling: obtaining
    well-calibrated multiclass probabilities with Dirichlet calibration", NeurIPS):
    softmax(W log p̄ + b), fitted on validation NLL with ODIR and/or L2 (see
    `peg.methods.calibration.scaling`).

    Args:
        reg_lambda: "auto" (default, with `reg_mu`): W and b shrunk towards temperature
            scaling's, the strengths chosen by cross-validation on the validation data (as
            the paper tunes λ and μ; see `peg.methods.calibration.scaling`); a number: λ of
            ODIR, on the mean squared off-diagonal weight (the default was 10, fixed: +143 nats
            against TS at 1000 classes, 5 points per class).
        reg_mu: "auto" (with `reg_lambda`), or μ of ODIR, on the mean squared intercept. With
            one of them a number, or l2 > 0, an "auto" stands for 10 (its value before "auto").
        l2: weight of the L2 penalty on every entry of W and b ("Dir-L2"; 0: none; with
            numbers for reg_lambda and reg_mu).
        cv: folds of the cross-validation choosing the "auto" strengths (>= 2).
        max_iter: iterations of the optimiser (Newton's method: about ten suffice; L-BFGS,
            for maps too large for a Hessian, stops here).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.
        task: the kind of input, read from the logits' and labels' shapes ("auto"), or
            "multiclass", "binary" or "multilabel" where the shapes could be either
            (`peg.source._kinds`).
        ignore_index: labels equal to it are left out of the fit (torch's -100; 255 in
            Cityscapes and VOC).
        per_label: on a multilabel head, one map per label instead of one shared map.
        class_dim: where dense logits hold the classes, 1 (`[B, C, *S]`) or -1 (`[B, *S, C]`, a
            language model's); None: read from the shapes (an error where both read).

    After `fit`: `weights_` (W `[C, C]`), `bias_` (b `[C]`), `regularisation_` (as matrix
    scaling's), `predictor_`, `meta_`; `member_logits(X) -> [1, N, C]` (W log p̄ + b),
    `predict_proba`, `predict`, `save`.
    """

    method = "dirichlet"
    label = "Dirichlet calibration"
    name = "Dirichlet"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    kinds = ("multiclass", "dense")
    growth = 2  # C² + C
    order = 3
    simplicity = 5
    cost_order = 5
    on_logits_default = True
    priced_from = VectorScaling.method
    # its diagonal map acts on log p, not vector scaling's logits: no "diagonal" parent
    parents: ClassVar[Mapping[str, str]] = {"temperature": TemperatureScaling.method}

    def __init__(
        self,
        *,
        reg_lambda: float | str = AUTO,
        reg_mu: float | str = AUTO,
        l2: float = 0.0,
        cv: int = FOLDS,
        max_iter: int = 200,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "reg_lambda": AUTO_OR_NUMBER,
        "reg_mu": AUTO_OR_NUMBER,
        "l2": checks.number(allow_zero=True),
        "cv": checks.positive_int(minimum=2),
        "max_iter": checks.positive_int(),
        **Calibrator.parameter_constraints,
    }
