"""Affine calibration maps of the scores: vector and matrix scaling (Guo et al. 2017) and
Dirichlet calibration (Kull et al. 2019).

All three map scores s `[N, C]` to s W^T + b (W `[C, C]`; diagonal for vector scaling, stored as
its diagonal `[C]`) and take the softmax. They are fitted on validation NLL in float64 by a
deterministic optimiser (Newton's method; L-BFGS for maps too large for a Hessian:
`peg.methods._affine.fit_affine`), from the identity map (W = I, b = 0: the predictor as it
is), with the penalties of Kull et al. 2019 ("Fitting and ODIR regularisation"), each a mean
over the entries it covers as in the paper:

- ODIR (off-diagonal and intercept regularisation): λ/(C(C-1)) Σ_{i≠j} W_ij² + μ/C Σ_j b_j²;
  the diagonal is left free, so λ, μ → ∞ gives vector scaling without intercept;
- L2 (Dirichlet only): l2/(C(C+1)) (Σ_ij W_ij² + Σ_j b_j²), towards W = 0, b = 0 (the
  reference code's `reg_format=None`).

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

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from peg.batches import BatchFn
from peg.methods import _constraints as checks
from peg.methods._affine import affine, fit_affine
from peg.methods._calibrator import Calibrator, stored
from peg.methods.base import store_arguments

SCORE_OPTIONS = ("auto", "log_probs")


class _Affine(Calibrator):
    """What vector, matrix scaling and Dirichlet calibration share: `weights_`, `bias_`."""

    class_wise = True

    full = True
    scores: str = "log_probs"
    reg_lambda: float = 0.0
    reg_mu: float = 0.0
    l2: float = 0.0
    max_iter: int

    def _score_kind(self, logits: Tensor) -> str:
        one = self.scores == "auto" and logits.shape[0] == 1
        return "logits" if one else "log_probs"

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        weights, bias = fit_affine(
            scores,
            y,
            full=self.full,
            reg_lambda=float(self.reg_lambda),
            reg_mu=float(self.reg_mu),
            l2=float(self.l2),
            max_iter=int(self.max_iter),
        )
        return {"weights_": weights, "bias_": bias}

    def _apply(self, scores: Tensor) -> Tensor:
        return affine(scores, self.weights_, self.bias_)

    def _fitted_classes(self) -> int | None:
        return int(self.bias_.shape[0])

    def _tensors(self) -> dict[str, Tensor]:
        return {"weights": self.weights_, "bias": self.bias_}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        bias = stored(tensors, "bias")
        c = bias.shape[0]
        weights = stored(tensors, "weights", (c, c) if self.full else (c,))
        return {"weights_": weights, "bias_": bias}


class VectorScaling(_Affine):
    """Vector scaling (Guo et al. 2017): softmax(w ⊙ s + b), w and b `[C]`, on validation NLL.

    Args:
        scores: "auto" (the raw logits of a one-member predictor, as Guo et al.; log p̄ of an
            ensemble) or "log_probs" (log p̄ always); see `peg.methods.scaling`.
        max_iter: iterations of the optimiser (Newton's method: about ten suffice; L-BFGS,
            for maps too large for a Hessian, stops here).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape
            (`peg.batches`).

    After `fit(predictor, val)`: `weights_` (w `[C]`), `bias_` (b `[C]`), `scores_` (what they
    act on: "logits" or "log_probs"), `predictor_`, `meta_`; `member_logits(X) -> [1, N, C]`
    (w ⊙ s + b), `predict_proba`, `predict`, `save(path)` (w, b stored as tensors; `peg.load`).
    """

    method = "vector-scaling"
    label = "vector scaling"
    full = False

    def __init__(
        self,
        *,
        scores: str = "auto",
        max_iter: int = 200,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "scores": checks.one_of(*SCORE_OPTIONS),
        "max_iter": checks.positive_int(),
        **Calibrator.parameter_constraints,
    }


class MatrixScaling(_Affine):
    """Matrix scaling (Guo et al. 2017): softmax(s W^T + b), W `[C, C]`, on validation NLL,
    optionally with ODIR (Kull et al. 2019: "MS-ODIR"; see `peg.methods.scaling`).

    Args:
        reg_lambda: λ of ODIR, on the mean squared off-diagonal weight (0: none, Guo et al.'s
            matrix scaling; Kull et al. choose λ and μ by cross-validation).
        reg_mu: μ of ODIR, on the mean squared intercept (0: none).
        scores: "auto" (the raw logits of a one-member predictor, as Guo et al.; log p̄ of an
            ensemble) or "log_probs" (log p̄ always).
        max_iter: iterations of the optimiser (Newton's method: about ten suffice; L-BFGS,
            for maps too large for a Hessian, stops here).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.

    After `fit`: `weights_` (W `[C, C]`), `bias_` (b `[C]`), `scores_`, `predictor_`, `meta_`;
    `member_logits(X) -> [1, N, C]` (s W^T + b). `save` stores W and b as tensors (C² float64
    values: 8 MB for C = 1000).
    """

    method = "matrix-scaling"
    label = "matrix scaling"

    def __init__(
        self,
        *,
        reg_lambda: float = 0.0,
        reg_mu: float = 0.0,
        scores: str = "auto",
        max_iter: int = 200,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "reg_lambda": checks.number(allow_zero=True),
        "reg_mu": checks.number(allow_zero=True),
        **VectorScaling.parameter_constraints,
    }


class DirichletCalibration(_Affine):
    """Dirichlet calibration (Kull et al. 2019, "Beyond temperature scaling: obtaining
    well-calibrated multiclass probabilities with Dirichlet calibration", NeurIPS):
    softmax(W log p̄ + b), fitted on validation NLL with ODIR and/or L2 (see
    `peg.methods.scaling`).

    Args:
        reg_lambda: λ of ODIR, on the mean squared off-diagonal weight. Default 10: on
            over-confident synthetic models (C = 10 and 40 classes, 1k and 10k validation
            points; λ = μ in {0, 0.01, 1, 10, 100}) it was within 0.02 nats of the best test
            NLL except for C = 40 on 1k points (C² > N: 100 was far better, and 0 far worse).
            The paper tunes λ and μ by cross-validation: raise them as C² nears N.
        reg_mu: μ of ODIR, on the mean squared intercept. Default 10.
        l2: weight of the L2 penalty on every entry of W and b ("Dir-L2"; 0: none).
        max_iter: iterations of the optimiser (Newton's method: about ten suffice; L-BFGS,
            for maps too large for a Hessian, stops here).
        batch_size: rows per forward pass.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.

    After `fit`: `weights_` (W `[C, C]`), `bias_` (b `[C]`), `predictor_`, `meta_`;
    `member_logits(X) -> [1, N, C]` (W log p̄ + b), `predict_proba`, `predict`, `save`.
    """

    method = "dirichlet"
    label = "Dirichlet calibration"

    def __init__(
        self,
        *,
        reg_lambda: float = 10.0,
        reg_mu: float = 10.0,
        l2: float = 0.0,
        max_iter: int = 200,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "reg_lambda": checks.number(allow_zero=True),
        "reg_mu": checks.number(allow_zero=True),
        "l2": checks.number(allow_zero=True),
        "max_iter": checks.positive_int(),
        **Calibrator.parameter_constraints,
    }
