"""A calibrator whose predictor may itself be a calibrator: the conformal predictors
(`peg.methods.conformal`) and `peg.LabelShift` wrap a fitted predictor, temperature scaling or
Dirichlet among them, and save it with their own map. Here, beside the calibrators it extends,
so that `LabelShift` and the conformal predictors (one layer up) both import it downwards.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from peg.ensemble import Ensemble
from peg.errors import ArchiveError
from peg.loading import calibrator_for
from peg.methods import _constraints as checks
from peg.methods.calibration._calibrator import READING, Calibrator

INNER = "inner/"  # the prefix of a wrapped calibrator's arrays in the archive


class WrapsCalibrator(Calibrator):
    """A calibrator whose predictor may itself be a calibrator (the conformal predictors,
    `peg.LabelShift`): `save` / `_from_archive` save the inner calibrator's entry under
    `"inner"`, its arrays under `inner/`, and `peg.load` rebuilds both."""

    # how it reads its data; the kind arguments (`task`, `ignore_index`, ...) are each
    # subclass's own to take: multiclass input until it does
    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = READING

    # ---------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the predictor's ensemble with the fitted map (and the calibrator under it, if
        any); `peg.load(path, model)` gives this fitted predictor back."""
        self._check_fitted("saving")
        entry, tensors = self._archived(), dict(self._tensors())
        base = self.predictor_
        if isinstance(base, Calibrator):
            entry["inner"] = base._archived()
            tensors |= {INNER + k: v for k, v in base._map_tensors().items()}
            base = base.predictor_
        return self._write(path, base, entry, tensors)

    @classmethod
    def _from_archive(
        cls,
        ensemble: Ensemble,
        calibration: dict[str, Any],
        tensors: Mapping[str, Tensor] | None = None,
    ) -> Any:
        """The fitted predictor around a loaded ensemble (and its inner calibrator)."""
        tensors = dict(tensors or {})
        predictor: Any = ensemble
        inner = calibration.get("inner")
        if inner is not None:
            if not isinstance(inner, dict) or inner.get("method") in (None, cls.method):
                raise ArchiveError(f"calibration: inner must be a calibrator entry, got {inner!r}")
            own = {k[len(INNER) :]: v for k, v in tensors.items() if k.startswith(INNER)}
            try:
                predictor = calibrator_for(inner)(ensemble, inner, own)
            except ArchiveError as e:  # the inner map's checks name its fields: here, as inner
                said = str(e).replace("'meta.calibration.", "'meta.calibration.inner.")
                said = said.replace("calibration: ", "calibration.inner: ", 1)
                raise ArchiveError(said) from None
        fitted = cls._unfitted(calibration)
        state = fitted._restored(calibration, tensors)
        fitted._set_fitted(predictor, {**state, "scores_": "log_probs"})
        return fitted
