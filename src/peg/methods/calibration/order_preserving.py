"""Diagonal intra order-preserving scaling (Rahimi et al. 2020, "Intra order-preserving
functions for calibration of multi-class neural networks", NeurIPS; their "DIAG" family).

One monotone increasing function g: R → R is applied to every score of a row, element-wise,
and the softmax taken:

    p(s) = softmax(g(s_1), ..., g(s_C)),   g' > 0,

so the order of the classes (and the argmax: accuracy) is kept, and the same g serves every
class (C-free: a map fitted at 1,000 classes has as many parameters as at 10). Temperature
scaling is the linear special case g(s) = s / T. Rahimi et al. parameterise g with an
unconstrained monotonic neural network; peg uses a monotone piecewise-linear g, the simplest
family with positive increments that contains TS exactly:

    g(s) = v_j + β_j (s - t_{j-1})   on the j-th piece, knots t_0 < ... < t_{K-1}, β_j > 0,

linear beyond the outer knots with the end slopes (K + 1 slopes; the v_j make g continuous;
an additive constant is irrelevant to the softmax). The knots are fixed before fitting: half at
quantiles of all the validation scores (the bulk, which sets the mass of the tail classes), half
at quantiles of each row's largest score (the top, which sets the confidence), merged. The
slopes β are fitted on validation NLL plus `reg` × mean_j (T (β_{j+1} - β_j))² (a smoothness
penalty on the slopes relative to TS's 1/T, whose limit, reg → ∞, is one slope: temperature
scaling). g is linear in β, so the NLL is convex in β: Newton's method in float64
(`peg.methods.calibration._monotone.fit_slopes`) from β = 1/T, the fitted temperature, keeping β >
0: the map starts at TS and departs from it only where the NLL says so.

What the scores are: as vector scaling's (`scores="auto"`): the raw logits z of a one-member
predictor (the paper's g acts on logits; log p̄ = z - logsumexp(z) differs by a per-row shift,
which a non-linear g does not ignore), log p̄ of an ensemble (`scores="log_probs"`: always).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from peg.errors import ArchiveError
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.calibration._affine import finite_scores
from peg.methods.calibration._calibrator import Calibrator, stored
from peg.methods.calibration._export import CalibrationMap, as_f64, at_or_below
from peg.methods.calibration._few_points import warn_few_points_shared
from peg.methods.calibration._monotone import evaluate, fit_slopes, monotone_map, place_knots
from peg.methods.calibration.scaling import SCORE_OPTIONS
from peg.methods.calibration.temperature import fit_temperature, fitted_temperature
from peg.source._kinds import IGNORE_INDEX
from peg.source.batches import BatchFn
from peg.utils.memory import require_memory

__all__ = ["OrderPreservingScaling", "monotone_map"]

# the largest |score| float32 logits give: the logit itself, or log p̄ (down to twice its range)
SCORE_LIMIT = 2 * float(torch.finfo(torch.float32).max)


class Monotone(CalibrationMap):
    """Order-preserving scaling: one monotone piecewise-linear g of every score."""

    knots: Tensor
    slopes: Tensor
    anchors: Tensor
    base: Tensor

    def __init__(self, scores: str, knots: Tensor, slopes: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("knots", as_f64(knots))
        self.register_buffer("slopes", as_f64(slopes))
        self.register_buffer("anchors", torch.cat([self.knots[:1], self.knots]))
        # g at each piece's anchor, computed once here: the graph has no diff or cumsum, which
        # the TorchScript ONNX exporter lacks (`_monotone.evaluate` at offset 0)
        pieces = torch.arange(len(self.slopes))
        zero = torch.zeros(len(self.slopes), dtype=torch.float64)
        self.register_buffer("base", evaluate(pieces, zero, self.knots, self.slopes))

    def log_probs(self, s: Tensor) -> Tensor:
        s = finite_scores(s)
        idx = at_or_below(s, self.knots)  # the piece of each score (`_monotone.pieces`)
        return self.base[idx] + self.slopes[idx] * (s - self.anchors[idx])


class OrderPreservingScaling(Calibrator):
    """Diagonal intra order-preserving scaling (Rahimi et al. 2020, DIAG): one monotone
    piecewise-linear function applied to every score, fitted on validation NLL from temperature
    scaling (`peg.methods.calibration.order_preserving`).

    Args:
        n_knots: knots of the piecewise-linear map, at most: the knots are distinct quantiles
            of the scores, so tied or few scores leave fewer (`knots_` holds those used; K + 1
            slopes); refused where the fit's `[N, K + 1, K + 1]` moments would not fit in memory.
        reg: weight of the smoothness penalty, the mean squared difference of neighbouring
            slopes times T² (0: none; large: one slope, temperature scaling).
        scores: "auto" (the raw logits of a one-member predictor; log p̄ of an ensemble) or
            "log_probs" (log p̄ always).
        max_iter: Newton iterations (of temperature scaling's fit, then of the slopes').
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

    After `fit(predictor, val)`: `knots_` `[K]`, `slopes_` `[K + 1]`, `temperature_` (the TS
    it started from), `scores_`, `predictor_`, `meta_`; `member_logits(X) -> [1, N, C]` (g of
    the scores), `predict_proba`, `predict` (the predictor's class), `save` / `peg.load`.
    """

    method = "order-preserving"
    label = "order-preserving scaling"
    name = "Order-preserving"  # the registry's entry (`Calibrator`): compare's, AutoSelect's row
    growth = 1  # priced as O(C): its fit's cost grows so
    order = 8
    simplicity = 2
    cost_order = 4
    on_logits_default = True

    def __init__(
        self,
        *,
        n_knots: int = 8,
        reg: float = 0.01,
        scores: str = "auto",
        max_iter: int = 100,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        per_label: bool = False,
        class_dim: int | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "n_knots": checks.positive_int(),
        "reg": checks.number(allow_zero=True),
        "scores": checks.one_of(*SCORE_OPTIONS),
        "max_iter": checks.positive_int(),
        **Calibrator.parameter_constraints,
    }

    def _score_kind(self, logits: Tensor) -> str:
        one = self.scores == "auto" and logits.shape[0] == 1
        return "logits" if one else "log_probs"

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        s, y = finite_scores(scores), y.long()  # finite: `Calibrator.fit` checked the logits
        temperature = fit_temperature(s, y, int(self.max_iter), label=self.label)
        # no more quantiles than scores (n_knots=2**31 asked numpy for 8 GB of them), and the
        # Newton step's moments `[N, K + 1, K + 1]` within memory (unchecked: 8 TB after 38 s)
        knots = place_knots(s, min(int(self.n_knots), s.numel() + len(s)))
        require_memory("n_knots", int(self.n_knots), 5 * len(s) * (len(knots) + 1) ** 2 * 8,
                       s.device, f"the Newton step's moments of {len(knots)} distinct knots on "
                       f"{len(s)} rows", "give fewer knots (the default is 8)")  # fmt: skip
        warn_few_points_shared(
            len(y), len(knots) + 1, self.label,
            "its slopes rest on a handful of points: temperature scaling (one parameter), or a "
            "larger reg (towards it), is safer",
        )  # fmt: skip
        start = torch.full((len(knots) + 1,), 1 / temperature, dtype=s.dtype, device=s.device)
        reg = float(self.reg) * temperature**2  # on slopes relative to TS's 1 / T
        slopes = fit_slopes(s, y, knots, start, reg, int(self.max_iter))
        if not bool(torch.isfinite(slopes).all()) or not bool((slopes > 0).all()):
            raise FloatingPointError(f"{self.label} diverged (slopes {slopes.tolist()})")
        return {"knots_": knots, "slopes_": slopes, "temperature_": temperature}

    def _module(self) -> CalibrationMap:
        """The fitted map as a module (`to_module`)."""
        return Monotone(self.scores_, self.knots_, self.slopes_)

    def _apply(self, scores: Tensor) -> Tensor:
        return monotone_map(scores, self.knots_, self.slopes_)

    def _entry(self) -> dict[str, Any]:
        return {"temperature": float(self.temperature_)}

    def _tensors(self) -> dict[str, Tensor]:
        return {"knots": self.knots_, "slopes": self.slopes_}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        knots = stored(tensors, "knots")
        if knots.ndim != 1 or len(knots) < 1 or not bool(torch.isfinite(knots).all()):
            raise ArchiveError("calibration: 'knots' must be a 1-D array of finite numbers")
        if len(knots) > 1 and not bool((knots.diff() > 0).all()):
            raise ArchiveError("calibration: 'knots' must be increasing")
        slopes = stored(tensors, "slopes", (len(knots) + 1,))
        if not bool(torch.isfinite(slopes).all()) or not bool((slopes > 0).all()):
            raise ArchiveError("calibration: 'slopes' must be finite and > 0")
        # g finite wherever float32 logits put a score: slopes and knots × 1e300 (a digest
        # recomputed) loaded, then predicted NaN for every input
        ends = knots.new_tensor([-SCORE_LIMIT, SCORE_LIMIT])
        g = monotone_map(torch.cat([ends[:1], knots, ends[1:]])[None], knots, slopes)
        if not bool(torch.isfinite(g).all()):
            raise ArchiveError(
                "calibration: 'slopes' and 'knots' overflow: the map is not finite on the scores "
                f"of float32 logits (|s| <= {SCORE_LIMIT:.3g}), which no fit of them gives"
            )
        return {"knots_": knots, "slopes_": slopes, "temperature_": fitted_temperature(entry)}
