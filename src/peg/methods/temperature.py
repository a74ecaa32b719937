"""Temperature scaling (Guo et al. 2017): one scalar T > 0 fitted on validation NLL.

Works on a single model and on any ensemble: the scores scaled are the log of the averaged
predictive distribution, log p̄ `[N, C]` (for one model these are its logits up to a per-row
constant, which softmax ignores). T is fitted by L-BFGS on log T, so it stays positive.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._inputs import (
    Data,
    Tapped,
    as_xy,
    check_positive_int,
    checked_labels,
    model_device,
    weights_device,
)
from peg.batches import BatchFn, check_batch_fn
from peg.ensemble import Ensemble
from peg.errors import ArchiveError, NotFittedError, NotStreamable
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


def member_logits_of(
    predictor: Any, X: Data, batch_size: int = 512, batch_fn: BatchFn | None = None
) -> Tensor:
    """`[M, N, C]` from anything that predicts: an object with `member_logits`, or an nn.Module.

    `batch_fn` (`peg.batches`) is passed on only when given, so objects whose `member_logits`
    does not take it keep working."""
    _check_predictor(predictor)
    extra = {} if batch_fn is None else {"batch_fn": batch_fn}
    if hasattr(predictor, "member_logits"):
        return predictor.member_logits(X, batch_size, **extra)
    model_device(predictor, "predictor")
    return Ensemble.from_models([predictor]).member_logits(X, batch_size, **extra)


def iter_member_logits_of(
    predictor: Any, X: Data, batch_size: int = 512, batch_fn: BatchFn | None = None
) -> Iterator[Tensor]:
    """`member_logits_of` batch by batch: `[M, B_j, C]` per batch j, from the predictor's
    `iter_member_logits` (an nn.Module through a one-member `Ensemble`). `NotStreamable`, raised
    here, before any batch is read, for a predictor without one (a foreign object that only has
    `member_logits`) or that cannot (a lazy PEG/PEP)."""
    _check_predictor(predictor)
    extra = {} if batch_fn is None else {"batch_fn": batch_fn}
    if isinstance(predictor, nn.Module) and not hasattr(predictor, "member_logits"):
        model_device(predictor, "predictor")
        return Ensemble.from_models([predictor]).iter_member_logits(X, batch_size, **extra)
    if not hasattr(predictor, "iter_member_logits"):
        raise NotStreamable(f"predictor: {type(predictor).__name__} has no iter_member_logits")
    return predictor.iter_member_logits(X, batch_size, **extra)


def in_memory(data: Data) -> bool:
    """Whether `data` is tensors or arrays already in memory (a pair `(X, y)` of them)."""
    return (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and all(isinstance(t, (Tensor, np.ndarray)) for t in data)
    )


def logits_and_labels(
    predictor: Any, data: Data, batch_size: int, batch_fn: BatchFn | None, name: str
) -> tuple[Tensor, Tensor]:
    """Member logits `[M, N, C]` and labels `[N]` of labelled data in one pass over it.

    A pair `(X, y)` of tensors is predicted as it is (`as_xy`); a loader or a Dataset (batches
    of any shape, `peg.batches`) is handed to the predictor as a `Tapped` stream, which records
    each batch's labels as the predictor reads it: the inputs are never gathered, and the
    logits are those `predictor.member_logits(data)` gives (same batches, same bits)."""
    if in_memory(data):
        X, y = as_xy(data, name, device=predictor_device(predictor))
        assert y is not None
        return member_logits_of(predictor, X, batch_size), y
    if isinstance(data, (tuple, list)):
        raise TypeError(
            f"{name}: expected a pair (X, y) of tensors or arrays, a mapping, a Dataset or a "
            f"DataLoader, got a {type(data).__name__} of {len(data)}"
        )
    tapped = Tapped(data, batch_fn, name)
    logits = member_logits_of(predictor, tapped, batch_size)
    y = checked_labels(tapped.labels(), name, logits.shape[1], predictor_device(predictor))
    return logits, y


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
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches that are neither
            `(x, y, ...)` nor a mapping with "labels" (`peg.batches`); used by `fit` and
            `member_logits`. None: those conventions.

    After `fit(predictor, val)`: `temperature_` (T), `predictor_`, `meta_` (method, T and the
    predictor's meta when it has one), `member_logits(X) -> [1, N, C]` (log p̄ / T),
    `predict_proba(X) -> [N, C]`, `predict(X) -> [N]`; `save(path)` writes the calibrated
    ensemble, which `peg.load(path, model)` gives back as a fitted `TemperatureScaling`.
    """

    method = "temperature"

    def __init__(
        self, *, max_iter: int = 100, batch_size: int = 512, batch_fn: BatchFn | None = None
    ) -> None:
        store_arguments(self, locals())

    def _check_params(self) -> None:
        check_positive_int(self.max_iter, "max_iter")
        check_positive_int(self.batch_size, "batch_size")
        check_batch_fn(self.batch_fn)

    def fit(
        self, predictor: Any, val: Data | None = None, *, bn_data: Data | None = None
    ) -> TemperatureScaling:
        """Fit T on validation data `val` ((X, y), Dataset or DataLoader, batches of any shape).

        Args:
            predictor: an nn.Module returning logits, or anything with `member_logits(X)` (an
                `Ensemble`, a fitted method).
            val: labelled validation data (required). A loader is read once, its inputs never
                gathered: the predictor reads it batch by batch and the labels are collected as
                it goes (`logits_and_labels`).
            bn_data: unused (accepted as by every post-hoc method).
        """
        _check_predictor(predictor)
        if val is None:
            raise ValueError("val: temperature scaling needs labelled validation data (X, y)")
        logits, y = logits_and_labels(
            predictor, val, int(self.batch_size), check_batch_fn(self.batch_fn), "val"
        )
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

    def member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        batch_fn: BatchFn | None = None,
        **_: Any,
    ) -> Tensor:
        """Scaled scores `[1, N, C]` (one "member": the calibrated predictor)."""
        self._check_fitted()
        size = int(self.batch_size) if batch_size is None else batch_size
        split = check_batch_fn(getattr(self, "batch_fn", None) if batch_fn is None else batch_fn)
        if isinstance(X, Tapped):
            split = None  # the stream carries its own
        # scaled whole (not the concatenated `iter_member_logits`): `peg.distributed` gathers
        # the predictor's logits and scales them as one process does, on the same shapes
        return self.scale(member_logits_of(self.predictor_, X, size, split))

    def iter_member_logits(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None, **_: Any
    ) -> Iterator[Tensor]:
        """`member_logits` batch by batch, `[1, B_j, C]`: log p̄ / T is a per-row transform, here
        of the predictor's batches (equal to `member_logits` up to rounding: the same per-row
        operations on other shapes); `NotStreamable` if the predictor cannot give them."""
        self._check_fitted()
        size = int(self.batch_size) if batch_size is None else batch_size
        split = check_batch_fn(getattr(self, "batch_fn", None) if batch_fn is None else batch_fn)
        if isinstance(X, Tapped):
            split = None  # the stream carries its own
        batches = iter_member_logits_of(self.predictor_, X, size, split)
        return (self.scale(logits) for logits in batches)

    def scale(self, logits: Tensor) -> Tensor:
        """Scaled scores `[1, N, C]` (log p̄ / T) from the predictor's member logits `[M, N, C]`."""
        self._check_fitted()
        return (ensemble_log_probs(logits) / self.temperature_).float().unsqueeze(0)

    def predict_proba(self, X: Data, batch_size: int | None = None, **kwargs: Any) -> Tensor:
        """Calibrated probabilities `[N, C]`."""
        return self.member_logits(X, batch_size, **kwargs)[0].softmax(-1)

    def predict(self, X: Data, batch_size: int | None = None, **kwargs: Any) -> Tensor:
        """Predicted classes `[N]` (temperature scaling never changes them)."""
        return self.predict_proba(X, batch_size, **kwargs).argmax(-1)

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
