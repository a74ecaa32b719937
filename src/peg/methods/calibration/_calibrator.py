"""The one mechanism every post-hoc calibrator shares (temperature, vector and matrix scaling,
Dirichlet calibration, histogram binning, isotonic regression, spline calibration, ensemble
temperature scaling, order-preserving scaling).

A calibrator is fitted on a predictor (an nn.Module, a `peg.Ensemble`, any fitted method) and
labelled validation data. `Calibrator.fit` reads the data once (`logits_and_labels`), turns the
member logits `[M, N, C]` into scores `[N, C]` (`scores_of`: log p̄, the log of the averaged
prediction, or the raw logits of a one-member predictor for the scalings that ask for them),
and hands them to the subclass's `_fit_map`; `scale` applies the fitted map (`_apply`) to the
predictor's logits, which `member_logits` / `iter_member_logits` / `predict_proba` go through.
`save` writes the predictor's ensemble with the map in the archive: its scalars in the meta's
`"calibration"` entry (JSON), its arrays as safetensors beside the members (`peg.archive`; a
map fitted on saved logits, `nn.Identity()`, is saved alone and loads without a model),
and every subclass is registered with `peg.loading.register_calibrator` under its `method`
name, so `peg.load` gives the fitted calibrator back (`_restore`).

A subclass sets `method` (the archive's and meta's name), `label` (for messages) and
implements `_fit_map(scores, y) -> state` (the fitted attributes, trailing underscore),
`_apply(scores) -> [N, C]` (float64 log-scores whose softmax is the calibrated prediction),
`_entry()` / `_tensors()` (what `save` stores) and `_restore(entry, tensors) -> state`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
from torch import Tensor, nn

from peg import archive
from peg.ensemble import Ensemble, Predicts
from peg.errors import ArchiveError
from peg.loading import register_calibrator
from peg.methods import _constraints as checks
from peg.methods._predictors import (
    ensemble_of,
    iter_member_logits_of,
    logits_and_labels,
    member_logits_of,
    predictor_meta,
    read_predictor,
    stateless,
)
from peg.methods.base import Method
from peg.metrics._inputs import check_labels, ensemble_log_probs
from peg.source import Data, is_pair
from peg.source._values import warn_absent_classes
from peg.source.batches import BatchFn, check_batch_fn

SCORES = ("log_probs", "logits")  # what a map acts on (`scores_`)
# `to_module`'s builders by calibrator `method` (`_export`'s, registered when it is imported)
EXPORTS: dict[str, Callable[[Any], nn.Module]] = {}


def scores_of(logits: Tensor, kind: str) -> Tensor:
    """Scores `[N, C]` from member logits `[M, N, C]`: log p̄ (`"log_probs"`, float64, any M;
    `ensemble_log_probs`) or the raw logits of a one-member predictor (`"logits"`)."""
    if kind == "log_probs":
        return ensemble_log_probs(logits)
    if logits.shape[0] != 1:
        raise ValueError(
            "scores: the map was fitted on the raw logits of a one-member predictor, got "
            f"{logits.shape[0]} members"
        )
    return logits[0].double()


class Calibrator(Predicts, Method):
    """Base of the post-hoc calibrators (see the module doc): `fit(predictor, val)`,
    `member_logits(X) -> [1, N, C]`, `iter_member_logits`, `scale(logits)`, `predict_proba`,
    `predict`, `save(path)`; `peg.load(path, model)` gives a fitted one back."""

    method: ClassVar[str] = ""
    label: ClassVar[str] = ""
    # parameters per class (vector / matrix scaling, Dirichlet, binning): a class absent from
    # the labels is warned of at fit (`peg.source._values.warn_absent_classes`)
    class_wise: ClassVar[bool] = False
    batch_size: int
    batch_fn: BatchFn | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "method" in cls.__dict__:  # a concrete calibrator: its archives load as it
            register_calibrator(cls.method, cls._from_archive)

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "batch_size": checks.positive_int(),
        "batch_fn": checks.batch_fn,
    }

    # ---------------------------------------------------------------- subclass hooks
    def _score_kind(self, logits: Tensor) -> str:
        """What the map is fitted on and applied to, given the predictor's logits `[M, N, C]`."""
        return "log_probs"

    def _check_classes(self, classes: int) -> None:
        """A clear error for arguments that do not suit C classes (checked before fitting)."""

    def _fitted_classes(self) -> int | None:
        """C of the fitted map, where it has one (None: any C, as temperature scaling)."""
        return None

    def _fit_map(self, scores: Tensor, y: Tensor) -> dict[str, Any]:
        raise NotImplementedError

    def _apply(self, scores: Tensor) -> Tensor:
        raise NotImplementedError

    def _entry(self) -> dict[str, Any]:
        """The fitted map's scalars, saved (JSON) in the archive's `"calibration"` entry."""
        return {}

    def _tensors(self) -> dict[str, Tensor]:
        """The fitted map's arrays, saved as safetensors beside the members."""
        return {}

    def _restore(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        """The fitted state from what `save` stored (`ArchiveError` when it is not valid)."""
        raise NotImplementedError

    def _archived(self) -> dict[str, Any]:
        """The archive's `"calibration"` entry: method, constructor arguments (`params`), what
        the map acts on (`fitted_on`) and the map's scalars."""
        return {
            "method": type(self).method,  # an argument may be called `method` too
            "params": self._json_params(),
            "fitted_on": self.scores_,
            **self._entry(),
        }

    def _described(self) -> dict[str, Any]:
        """`meta_` beyond method and predictor: the arguments, what the map acts on
        (`fitted_on`: "log_probs" or "logits") and the map's scalars."""
        return {**self._json_params(), "fitted_on": self.scores_, **self._entry()}

    def _json_params(self) -> dict[str, Any]:
        """The constructor arguments as JSON (`batch_fn`, a callable, is not stored)."""
        params = {k: v for k, v in self.get_params().items() if k not in ("batch_fn",)}
        # as an archive gives them back: tuples as lists, NumPy scalars as Python numbers
        return json.loads(json.dumps(params, default=_plain))

    # ---------------------------------------------------------------- fitting
    def fit(
        self, predictor: Any, val: Data | None = None, *, bn_data: Data | None = None
    ) -> Calibrator:
        """Fit the map on validation data `val` ((X, y), Dataset or DataLoader, batches of any
        shape); returns self.

        Args:
            predictor: an nn.Module returning logits, or anything with `member_logits(X)` (an
                `Ensemble`, a fitted method); or saved logits `[N, C]` (a tensor or a NumPy
                array, memory-mapped too), `val` then their labels `[N]`: `fit(logits,
                labels)` is `fit(nn.Identity(), (logits, labels))` (`read_predictor`).
            val: labelled validation data (required). A loader is read once, its inputs never
                gathered: the predictor reads it batch by batch and the labels are collected as
                it goes (`logits_and_labels`).
            bn_data: unused (accepted as by every post-hoc method).
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        predictor, val = read_predictor(predictor, val)  # fit(logits, labels): SavedLogits()
        if val is None:
            raise ValueError(f"val: {self.label} needs labelled validation data (X, y)")
        labels = val[1] if is_pair(val) else None
        if isinstance(labels, (Tensor, np.ndarray)) and labels.ndim >= 1:
            # labels that cannot be labels (floats, a wrong shape): said before the forwards
            check_labels(labels, len(labels), None, name="val labels")
        logits, y = logits_and_labels(
            predictor, val, int(self.batch_size), check_batch_fn(self.batch_fn), "val"
        )
        kind = self._score_kind(logits)
        scores = scores_of(logits, kind)
        y = check_labels(y, *scores.shape, name="val labels", device=scores.device)
        self._check_classes(scores.shape[1])
        if self.class_wise:
            warn_absent_classes(y, scores.shape[1], "val", self.label)
        state = self._fit_map(scores, y)
        self._set_fitted(predictor, {**state, "scores_": kind})
        return self

    def _set_fitted(self, predictor: Any, state: Mapping[str, Any]) -> None:
        self.__dict__.update(state)
        self.predictor_ = predictor
        meta: dict[str, Any] = {"method": type(self).method, **self._described()}
        described = predictor_meta(predictor)
        if described is not None:
            meta["predictor"] = described
        self.meta_ = meta  # last: `fitted_attribute`

    # ---------------------------------------------------------------- predicting
    def member_logits(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Tensor:  # fmt: skip
        """Calibrated scores `[1, N, C]` (one "member": the calibrated predictor), whose softmax
        is the calibrated prediction."""
        self._check_fitted()
        size, split = self._reading(batch_size, batch_fn)
        # mapped whole (not the concatenated `iter_member_logits`): `peg.distributed` gathers
        # the predictor's logits and maps them as one process does, on the same shapes
        return self.scale(member_logits_of(self.predictor_, X, size, split, **options))

    def iter_member_logits(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Iterator[Tensor]:  # fmt: skip
        """`member_logits` batch by batch, `[1, B_j, C]`: the map is a per-row transform, here
        of the predictor's batches (equal to `member_logits` up to rounding: the same per-row
        operations on other shapes); `NotStreamable` if the predictor cannot give them."""
        self._check_fitted()
        size, split = self._reading(batch_size, batch_fn)
        batches = iter_member_logits_of(self.predictor_, X, size, split, **options)
        return (self.scale(logits) for logits in batches)

    def scale(self, logits: Tensor) -> Tensor:
        """Calibrated scores `[1, N, C]` (float32) from the predictor's logits `[M, N, C]`."""
        self._check_fitted()
        classes = self._fitted_classes()
        if classes is not None and logits.shape[-1] != classes:
            raise ValueError(
                f"logits: this {type(self).__name__} was fitted on {classes} classes, got "
                f"logits with {logits.shape[-1]} columns (shape {tuple(logits.shape)}); the "
                "predictor or the saved logits are not the ones it was fitted on"
            )
        return self._apply(scores_of(logits, self.scores_)).float().unsqueeze(0)

    def __len__(self) -> int:
        self._check_fitted()
        return 1

    def to_module(self) -> nn.Module:
        """The fitted map as a frozen `nn.Module`, logits `[N, C]` -> probabilities `[N, C]`
        (buffers only; for `torch.export.export` and `torch.onnx.export` with a dynamic batch
        dimension; `peg.methods.calibration._export`)."""
        self._check_fitted("exporting")
        build = EXPORTS.get(type(self).method)
        if build is None:
            raise TypeError(
                f"to_module: {type(self).__name__} has no exported form (it is not a map of "
                f"logits alone); the calibrators have one: {sorted(EXPORTS)}"
            )
        return build(self).requires_grad_(False).eval()

    # ---------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the calibrated predictor as an ensemble archive; returns the path.

        The archive holds the predictor's `Ensemble` (a fitted method's `ensemble()`, an
        `Ensemble`, or an nn.Module as a one-member ensemble; a predictor without stacked
        weights, such as MC dropout, is a TypeError), its meta gaining
        `"calibration": {"method": ..., ...}` (the map's scalars), the map's arrays stored as
        tensors beside the members. `peg.load(path, model)` gives back a fitted calibrator of
        this class with the same `member_logits`.
        """
        self._check_fitted("saving")
        return self._write(path, self.predictor_, self._archived(), self._tensors())

    @staticmethod
    def _write(
        path: str | os.PathLike[str],
        base: Any,
        entry: dict[str, Any],
        tensors: Mapping[str, Tensor],
    ) -> str:
        """`base`'s ensemble archive with `entry` as its meta's "calibration" and `tensors`
        beside the members (the one writer of calibrated predictors). A `stateless` base (saved
        logits read through `nn.Identity()`) has no weights: the archive holds the map alone,
        its meta's `"inputs"` saying so (`archive.LOGITS`), and `peg.load(path)` needs no
        model."""
        if stateless(base):
            meta = {"inputs": archive.LOGITS, "calibration": entry}
            return archive.write(os.fspath(path), {}, {}, meta, type(base).__name__, dict(tensors))
        ensemble = ensemble_of(base)
        meta = {**ensemble.meta, "calibration": entry}
        arch = type(ensemble.skeleton).__name__
        return archive.write(
            os.fspath(path), ensemble.stacked, ensemble.shared, meta, arch, dict(tensors)
        )

    @classmethod
    def _unfitted(cls, calibration: dict[str, Any]) -> Any:
        """A new instance from an archive's "calibration" entry's arguments (`ArchiveError`
        when they are not a mapping or do not fit the class)."""
        params = calibration.get("params", {})
        if not isinstance(params, dict):
            raise ArchiveError(f"calibration: params must be a mapping, got {params!r}")
        try:
            return cls(**params)
        except (TypeError, ValueError) as e:
            raise ArchiveError(
                f"calibration: the archive's arguments do not fit {cls.__name__}: {e}"
            ) from e

    @classmethod
    def _from_archive(
        cls,
        ensemble: Ensemble,
        calibration: dict[str, Any],
        tensors: Mapping[str, Tensor] | None = None,
    ) -> Any:
        """A fitted calibrator around a loaded ensemble (`peg.load`'s calibrator)."""
        fitted = cls._unfitted(calibration)
        kind = calibration.get("fitted_on", "log_probs")
        if kind not in SCORES:
            raise ArchiveError(f"calibration: fitted_on must be one of {SCORES}, got {kind!r}")
        state = fitted._restore(calibration, tensors or {})
        fitted._set_fitted(ensemble, {**state, "scores_": kind})
        return fitted


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def stored(
    tensors: Mapping[str, Tensor],
    name: str,
    shape: tuple[int, ...] | None = None,
    empty: bool = False,
) -> Tensor:
    """The archive's array `name` as float64 (`ArchiveError` when missing, of another shape than
    `shape`, or holding NaN, which only `empty` arrays may: histogram binning's bins that no
    validation point fell in)."""
    t = tensors.get(name)
    if t is None:
        raise ArchiveError(f"calibration: the archive has no {name!r} tensor")
    if shape is not None and tuple(t.shape) != shape:
        raise ArchiveError(f"calibration: {name!r} has shape {tuple(t.shape)}, expected {shape}")
    if not empty and t.is_floating_point() and bool(t.isnan().any()):
        raise ArchiveError(f"calibration: {name!r} holds NaN")
    return t.double()
