"""Temperature scaling (Guo et al. 2017): one scalar T > 0 fitted on validation NLL.

Works on a single model and on any ensemble: the scores scaled are the log of the averaged
predictive distribution, log p̄ `[N, C]` (for one model these are its logits up to a per-row
constant, which softmax ignores). T is fitted by L-BFGS on log T, so it stays positive.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._inputs import Data, as_xy, check_positive_int, model_device, weights_device
from peg.ensemble import Ensemble
from peg.errors import ArchiveError, NotFittedError
from peg.loading import register_calibrator
from peg.methods.base import FittedEnsemble, Method, ModulePredictor, store_arguments
from peg.metrics._inputs import check_labels, ensemble_log_probs


def _check_predictor(predictor: Any) -> None:
    if not (hasattr(predictor, "member_logits") or isinstance(predictor, nn.Module)):
        raise TypeError(
            "predictor: expected an nn.Module or an object with member_logits(X), "
            f"got {type(predictor).__name__}"
        )


def predictor_device(predictor: Any) -> torch.device | None:
    """Where `predictor` computes (its inputs are moved there), when it can be told cheaply."""
    if isinstance(predictor, nn.Module):
        return weights_device(predictor)
    if isinstance(predictor, Ensemble):
        return predictor.device
    if isinstance(predictor, FittedEnsemble) and hasattr(predictor, "ensemble_"):
        return predictor.ensemble_.device
    if isinstance(predictor, ModulePredictor) and hasattr(predictor, "model_"):
        return weights_device(predictor.model_)
    return None


def member_logits_of(predictor: Any, X: Data, batch_size: int = 512) -> Tensor:
    """`[M, N, C]` from anything that predicts: an object with `member_logits`, or an nn.Module."""
    _check_predictor(predictor)
    if hasattr(predictor, "member_logits"):
        return predictor.member_logits(X, batch_size)
    model_device(predictor, "predictor")
    return Ensemble.from_models([predictor]).member_logits(X, batch_size)


def _predictor_meta(predictor: Any) -> dict[str, Any] | None:
    """What `predictor` is (an `Ensemble`'s or a fitted method's meta), or None if not said."""
    if isinstance(predictor, Ensemble):
        meta: Any = predictor.meta
    elif isinstance(predictor, nn.Module):
        return None
    else:
        meta = getattr(predictor, "meta_", None)
    return dict(meta) if isinstance(meta, Mapping) and meta else None


def _ensemble_of(predictor: Any) -> Ensemble:
    """The stacked-weights `Ensemble` a predictor is (TypeError for one that has none)."""
    if isinstance(predictor, Ensemble):
        return predictor
    if isinstance(predictor, FittedEnsemble):
        return predictor.ensemble()
    if isinstance(predictor, nn.Module):
        return Ensemble.from_models([predictor])
    raise TypeError(
        "predictor: save writes an ensemble archive, which needs an nn.Module, a peg.Ensemble "
        f"or a fitted method holding one (DeepEnsemble, SWAG, PEG, ...); "
        f"{type(predictor).__name__} has no stacked member weights to save"
    )


class TemperatureScaling(Method):
    """Post-hoc calibration of a model or an ensemble by one temperature.

    Args:
        max_iter: L-BFGS iterations (the NLL is smooth and one-dimensional: a few suffice).
        batch_size: rows per forward pass.

    After `fit(predictor, val)`: `temperature_` (T), `predictor_`, `meta_` (method, T and the
    predictor's meta when it has one), `member_logits(X) -> [1, N, C]` (log p̄ / T),
    `predict_proba(X) -> [N, C]`, `predict(X) -> [N]`; `save(path)` writes the calibrated
    ensemble, which `peg.load(path, model)` gives back as a fitted `TemperatureScaling`.
    """

    method = "temperature"

    def __init__(self, *, max_iter: int = 100, batch_size: int = 512) -> None:
        store_arguments(self, locals())

    def _check_params(self) -> None:
        check_positive_int(self.max_iter, "max_iter")
        check_positive_int(self.batch_size, "batch_size")

    def fit(
        self, predictor: Any, val: Data | None = None, *, bn_data: Data | None = None
    ) -> TemperatureScaling:
        """Fit T on validation data `val` ((X, y), Dataset or DataLoader).

        Args:
            predictor: an nn.Module returning logits, or anything with `member_logits(X)` (an
                `Ensemble`, a fitted method).
            val: labelled validation data (required).
            bn_data: unused (accepted as by every post-hoc method).
        """
        _check_predictor(predictor)
        if val is None:
            raise ValueError("val: temperature scaling needs labelled validation data (X, y)")
        X, y = as_xy(val, "val", device=predictor_device(predictor))
        assert y is not None
        logits = member_logits_of(predictor, X, int(self.batch_size))
        scores = ensemble_log_probs(logits)
        y = check_labels(y, *scores.shape, name="val labels")
        temperature = fit_temperature(scores, y, int(self.max_iter))
        self._set_fitted(predictor, temperature)
        return self

    def _set_fitted(self, predictor: Any, temperature: float) -> None:
        self.predictor_ = predictor
        self.temperature_ = temperature
        meta: dict[str, Any] = {"method": self.method, "temperature": temperature}
        described = _predictor_meta(predictor)
        if described is not None:
            meta["predictor"] = described
        self.meta_ = meta

    def _check_fitted(self) -> None:
        if "temperature_" not in self.__dict__:
            raise NotFittedError("TemperatureScaling: call fit(predictor, val) before predicting")

    def member_logits(self, X: Data, batch_size: int | None = None, **_: Any) -> Tensor:
        """Scaled scores `[1, N, C]` (one "member": the calibrated predictor)."""
        self._check_fitted()
        size = int(self.batch_size) if batch_size is None else batch_size
        return self.scale(member_logits_of(self.predictor_, X, size))

    def scale(self, logits: Tensor) -> Tensor:
        """Scaled scores `[1, N, C]` (log p̄ / T) from the predictor's member logits `[M, N, C]`."""
        self._check_fitted()
        return (ensemble_log_probs(logits) / self.temperature_).float().unsqueeze(0)

    def predict_proba(self, X: Data, batch_size: int | None = None, **_: Any) -> Tensor:
        """Calibrated probabilities `[N, C]`."""
        return self.member_logits(X, batch_size)[0].softmax(-1)

    def predict(self, X: Data, batch_size: int | None = None, **_: Any) -> Tensor:
        """Predicted classes `[N]` (temperature scaling never changes them)."""
        return self.predict_proba(X, batch_size).argmax(-1)

    def __len__(self) -> int:
        self._check_fitted()
        return 1

    # ---------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the calibrated predictor as an ensemble archive; returns the path.

        The archive holds the predictor's `Ensemble` (a fitted method's `ensemble()`, an
        `Ensemble`, or an nn.Module as a one-member ensemble; a predictor without stacked
        weights, such as MC dropout, is a TypeError), its meta gaining
        `"calibration": {"method": "temperature", "temperature": T}`. `peg.load(path, model)`
        gives back a fitted `TemperatureScaling` with the same `member_logits`.
        """
        self._check_fitted()
        ensemble = _ensemble_of(self.predictor_)
        calibration = {"method": self.method, "temperature": float(self.temperature_)}
        meta = {**ensemble.meta, "calibration": calibration}
        copied = Ensemble(ensemble.skeleton, ensemble.stacked, ensemble.shared, meta)
        return copied.save(os.fspath(path))

    @classmethod
    def _from_archive(cls, ensemble: Ensemble, calibration: dict[str, Any]) -> TemperatureScaling:
        """A fitted TemperatureScaling around a loaded ensemble (`peg.load`'s calibrator)."""
        temperature = calibration.get("temperature")
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature)
            or temperature <= 0
        ):
            raise ArchiveError(
                f"calibration: expected a temperature > 0 in the archive, got {temperature!r}"
            )
        fitted = cls()
        fitted._set_fitted(ensemble, float(temperature))
        return fitted


register_calibrator(TemperatureScaling.method, TemperatureScaling._from_archive)


def fit_temperature(scores: Tensor, y: Tensor, max_iter: int = 100) -> float:
    """argmin_T NLL(softmax(scores / T), y) for scores `[N, C]`, labels `[N]`."""
    scores = scores.detach().double()
    finite = torch.isfinite(scores).all(-1)
    scores, y = scores[finite], y[finite].long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(scores / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    t = float(log_t.detach().exp())
    if not math.isfinite(t) or t <= 0:
        raise FloatingPointError(f"temperature scaling diverged (T = {t})")
    return t
