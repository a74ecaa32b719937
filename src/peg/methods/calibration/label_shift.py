"""Label-shift adaptation after deployment: the target class priors from unlabelled target
inputs, and any predictor's probabilities reweighted by them.

`LabelShift(method="em" | "bbse").fit(predictor, val, target=X_target)` reads the labelled
validation data once (member logits → scores log p̄ `[N, C]`, as every calibrator), fits the
calibration step on them (`calibrate`), then streams the target inputs through the predictor,
keeping only what the estimate needs (EM: the calibrated probabilities `[N_t, C]`; BBSE: the
counts of predicted classes `[C]`). The estimators are `peg.methods.calibration._label_shift`'s. The
adapted prediction is q(y | x) ∝ p̂(y | x) · q̂(y) / p̂(y), a per-row map like any calibrator's:
`member_logits` `[1, N, C]`, `predict_proba`, `save` / `peg.load`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from peg._features import check_target_shape
from peg._schema import Fields
from peg.errors import ArchiveError, NotStreamable
from peg.methods import _constraints as checks
from peg.methods._predictors import (
    SavedLogits,
    check_classes,
    check_saved_logits,
    iter_member_logits_of,
    logits_and_labels,
    member_logits_of,
    read_predictor,
    scores_of,
)
from peg.methods.base import store_arguments
from peg.methods.calibration._calibrator import READING, stored
from peg.methods.calibration._label_shift import (
    bbse_priors,
    calibrated_log_probs,
    confusion,
    em_priors,
    fit_bcts,
)
from peg.methods.calibration._wraps import WrapsCalibrator
from peg.source import Data
from peg.source._values import as_tensor, check_finite, check_labels
from peg.source.batches import BatchFn, as_array, check_batch_fn

METHODS = ("em", "bbse")
CALIBRATIONS = ("bcts", "ts", None)


class LabelShift(WrapsCalibrator):
    """Adapt a predictor to new class priors estimated from unlabelled target inputs.

    Args:
        method: "em": maximum likelihood by EM on the calibrated probabilities of the target
            points (Saerens et al. 2002; with `calibrate="bcts"` the method Alexandari et al.
            2020 found hard to beat); "bbse": black-box shift estimation (Lipton et al. 2018):
            the confusion matrix of the (calibrated) predictor's hard predictions on `val`,
            solved against the target's predicted-class frequencies, weights clipped at 0 and
            renormalised, with a delta-method standard error (`priors_se_`).
        calibrate: the calibration step fitted on `val` before estimating: "bcts" (bias-
            corrected temperature scaling: softmax(log p̄ / T + b)), "ts" (temperature only) or
            None (the predictor's probabilities as they are: pass an already calibrated
            predictor, e.g. a fitted `peg.DirichletCalibration`). EM needs calibrated
            probabilities; BBSE is consistent with any fixed predictor, calibrated or not.
        max_iter, tol: EM's iteration cap and stopping rule (largest change of a prior).
        batch_size, batch_fn: how the predictor reads data (`peg.source.batches`).

    After `fit(predictor, val, target=X_target)`: `priors_` `[C]` (the target priors),
    `source_priors_` `[C]` (the class frequencies of `val`), `weights_` (their ratio),
    `n_iter_` and `converged_` (EM; BBSE: 1 and True), `priors_se_` `[C]` (BBSE's standard
    error; None for EM), `condition_` (BBSE: the confusion matrix's condition number),
    `temperature_`, `bias_` `[C]` (the calibration step), `n_target_`; `member_logits(X)` →
    `[1, N, C]`, the adapted log-probabilities; `save(path)` / `peg.load(path, model)`.
    The guarantee is that of label shift only: where q(x | y) moved too, the reweighting is
    not the target's posterior.
    """

    method = "label_shift"
    label = "label-shift adaptation"

    def __init__(
        self,
        *,
        method: str = "em",
        calibrate: str | None = "bcts",
        max_iter: int = 1000,
        tol: float = 1e-8,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "method": checks.one_of(*METHODS),
        "calibrate": checks.one_of(*CALIBRATIONS),
        "max_iter": checks.positive_int(),
        "tol": checks.number(),
        **READING,
    }

    # ---------------------------------------------------------------- fitting
    # adds `target=` (the unlabelled shifted inputs) to the calibrators' fit(predictor, val)
    def fit(  # type: ignore[override]
        self,
        predictor: Any,
        val: Data | None = None,
        *,
        target: Data | None = None,
        bn_data: Data | None = None,
        classes: Any = None,
    ) -> LabelShift:
        """Estimate the target priors; returns self.

        Args:
            predictor: an nn.Module returning logits, or anything with `member_logits(X)`; or
                saved logits `[N, C]`, `val` then their labels `[N]` and `target` the target
                logits (`fit(logits, labels, target=target_logits)`).
            val: labelled validation data from the source distribution (read once).
            target: unlabelled inputs from the target distribution (a tensor, an array, a
                Dataset or a DataLoader; labels in it are ignored), streamed once.
            bn_data: unused (accepted as by every post-hoc method).
            classes: the class of each logit column, in order, where the labels name their
                classes (strings); see `peg.TemperatureScaling.fit`.
        """
        self._check_params()
        # fit(logits, labels, target=...); labels named by `classes` read as their indices
        predictor, val = read_predictor(predictor, val, classes=classes)
        if val is None:
            raise ValueError(f"val: {self.label} needs labelled validation data (X, y)")
        if target is None:
            raise ValueError(f"target: {self.label} needs unlabelled target inputs")
        target = as_array(target)  # a list of rows, a pandas DataFrame: an array
        if isinstance(predictor, SavedLogits) and isinstance(target, (Tensor, np.ndarray)):
            check_saved_logits(target, "target", " like the validation logits")
        check_target_shape(val, target)
        if isinstance(target, (Tensor, np.ndarray)):  # a loader's: checked as they are read
            check_finite(as_tensor(target, "target"), "target")
        size, split = int(self.batch_size), check_batch_fn(self.batch_fn)
        logits, y = logits_and_labels(predictor, val, size, split, "val")
        scores = scores_of(logits, "log_probs", "val")
        check_classes(classes, scores.shape[1])
        classes = scores.shape[1]
        self._check_classes(classes)
        y = check_labels(y, *scores.shape, name="val labels")
        source = torch.bincount(y.cpu(), minlength=classes).double() / len(y)
        if bool((source == 0).any()):
            missing = [int(c) for c in torch.nonzero(source == 0)[:5, 0]]
            raise ValueError(
                f"val: no validation point of class(es) {missing}: the source priors p(y) must "
                "all be positive for the weights q(y) / p(y)"
            )
        temperature, bias = 1.0, torch.zeros(classes, dtype=torch.float64)
        if self.calibrate is not None:
            temperature, bias = fit_bcts(scores, y, bias=self.calibrate == "bcts")
        cal = calibrated_log_probs(scores, temperature, bias)
        state = {"temperature_": temperature, "bias_": bias, "source_priors_": source}
        target_probs = self._read_target(predictor, target, size, split, classes, state)
        state |= self._estimate(cal, y, target_probs, source, classes)
        state["weights_"] = state["priors_"] / source
        self._set_fitted(
            predictor,
            {**state, "n_target_": len(target_probs), "scores_": "log_probs"}
            | {"n_classes_": classes},
        )
        return self

    def _read_target(
        self, predictor: Any, target: Data, size: int, split: Any, classes: int, state: dict
    ) -> Tensor:
        """The calibrated probabilities `[N_t, C]` of the target points, batch by batch."""
        try:
            batches = iter_member_logits_of(predictor, target, size, split)
        except NotStreamable:
            batches = iter([member_logits_of(predictor, target, size, split)])
        kept, start = [], 0
        for logits in batches:
            if logits.ndim != 3 or logits.shape[-1] != classes:
                raise ValueError(
                    f"target: the predictor gives outputs of shape {tuple(logits.shape)} on "
                    f"it, expected [M, B, {classes}] (the classes of val)"
                )
            s = scores_of(logits, "log_probs", "target", start)
            kept.append(calibrated_log_probs(s, state["temperature_"], state["bias_"]).exp())
            start += logits.shape[1]
        probs = torch.cat(kept) if kept else torch.zeros(0, classes, dtype=torch.float64)
        need = max(10, classes)
        if len(probs) < need:
            raise ValueError(
                f"target: {len(probs)} points are too few to estimate {classes} class priors "
                f"(at least {need})"
            )
        return probs

    def _estimate(
        self, cal: Tensor, y: Tensor, target: Tensor, source: Tensor, classes: int
    ) -> dict[str, Any]:
        if self.method == "em":
            priors, n_iter, converged = em_priors(target, source, int(self.max_iter), self.tol)
            if not converged:
                warnings.warn(
                    f"target: EM did not converge in max_iter={self.max_iter} iterations "
                    f"(tol={self.tol:g}); priors_ is the last iterate",
                    stacklevel=3,
                )
            return {
                "priors_": priors,
                "n_iter_": n_iter,
                "converged_": converged,
                "priors_se_": None,
                "condition_": None,
            }
        joint = confusion(cal.argmax(-1), y, classes)
        counts = torch.bincount(target.argmax(-1).cpu(), minlength=classes)
        priors, se, cond = bbse_priors(joint, counts, source, len(y))
        return {
            "priors_": priors,
            "n_iter_": 1,
            "converged_": True,
            "priors_se_": se,
            "condition_": cond,
        }

    def _described(self) -> dict[str, Any]:
        described = super()._described()  # meta_'s "method" is the class's: "label_shift"
        described["estimator"] = described.pop("method")
        return described

    # ---------------------------------------------------------------- predicting
    def _apply(self, scores: Tensor) -> Tensor:
        cal = calibrated_log_probs(scores, self.temperature_, self.bias_)
        w = self.weights_.to(cal).clamp_min(torch.finfo(torch.float64).tiny)
        return (cal + w.log()).log_softmax(-1)

    # ---------------------------------------------------------------- persistence
    def _entry(self) -> dict[str, Any]:
        return {
            "temperature": float(self.temperature_),
            "n_iter": int(self.n_iter_),
            "converged": bool(self.converged_),
            "n_target": int(self.n_target_),
            "priors": [round(float(p), 6) for p in self.priors_][:20],  # shown; stored below
        }

    def _tensors(self) -> dict[str, Tensor]:
        out = {"priors": self.priors_, "source_priors": self.source_priors_, "bias": self.bias_}
        return out | ({} if self.priors_se_ is None else {"priors_se": self.priors_se_})

    def _classes_of(self, state: Mapping[str, Any]) -> int | None:
        return int(state["priors_"].shape[0])

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        """Every field checked (unchecked, a string `n_iter`, an infinite temperature, negative
        priors or priors of the wrong shape loaded and failed later, or predicted nonsense)."""
        fields = Fields(entry, "calibration", "meta.calibration.")
        temperature = fields.number("temperature", positive=True)
        priors = _distribution(tensors, "priors", None)
        c = (len(priors),)
        source = _distribution(tensors, "source_priors", c, positive=True)
        se = stored(tensors, "priors_se", c) if "priors_se" in tensors else None
        bias = stored(tensors, "bias", c)
        for name, t in (("bias", bias), ("priors_se", se)):
            if t is not None and not bool(torch.isfinite(t).all()):
                raise ArchiveError(f"calibration: {name!r} holds inf")
        if se is not None and bool((se < 0).any()):
            raise ArchiveError("calibration: 'priors_se' holds negative standard errors")
        return {
            "temperature_": temperature,
            "bias_": bias,
            "priors_": priors,
            "source_priors_": source,
            "weights_": priors / source,
            "priors_se_": se,
            "condition_": None,
            "n_iter_": fields.integer("n_iter", minimum=0, optional=True, default=0),
            "converged_": fields.boolean("converged", optional=True, default=False),
            "n_target_": fields.integer("n_target", minimum=0, optional=True, default=0),
        }


def _distribution(
    tensors: Mapping[str, Tensor], name: str, shape: tuple[int, ...] | None, positive: bool = False
) -> Tensor:
    """Stored class priors `[C]`: finite, >= 0 (> 0 with `positive`: they divide), summing to 1
    (an `ArchiveError` naming the tensor otherwise)."""
    t = stored(tensors, name, shape)
    if t.ndim != 1 or len(t) < 1:
        raise ArchiveError(f"calibration: {name!r} has shape {tuple(t.shape)}, expected [C]")
    low = bool((t <= 0).any()) if positive else bool((t < 0).any())
    if not bool(torch.isfinite(t).all()) or low or abs(float(t.sum()) - 1.0) > 1e-6:
        sign = "> 0" if positive else ">= 0"
        raise ArchiveError(
            f"calibration: {name!r}: expected class priors (finite, {sign}, summing to 1), got "
            f"min {float(t.min()):.3g}, sum {float(t.sum()):.6g}"
        )
    return t
