"""How a fitted calibrator is saved and loaded (`Archived`, a base of
`peg.methods.calibration._calibrator.Calibrator`): `save` writes the predictor's ensemble with
the map in the archive, its scalars in the meta's `"calibration"` entry (JSON: `_archived`), its
arrays as safetensors beside the members (`peg.archive`; a map fitted on saved logits,
`nn.Identity()`, is saved alone and loads without a model; one fitted on another module without
weights is saved alone with that module's architecture: `weightless_meta`), and
`_from_archive`, what `peg.load` calls, gives the fitted calibrator back. The map's own part
is the calibrator's hooks (`_entry`, `_tensors`, `_restore`, `_classes_of`); `stored` reads
one of its arrays back, checked.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor, nn

from peg import archive
from peg._schema import Fields
from peg._wrappers import archived_meta
from peg.ensemble import Ensemble
from peg.errors import ArchiveError
from peg.methods._predictors import SavedLogits, ensemble_of, stateless

SCORES = ("log_probs", "logits")  # what a map acts on (`scores_`)


class Archived:
    """`save` / `_from_archive` of a calibrator (a mixin of `Calibrator`, whose hooks and
    fitted state it reads: `method`, `scores_`, `predictor_`, `_entry`, `_tensors`,
    `_restore`, `_classes_of`, `_width`, `_set_fitted`)."""

    def _archived(self) -> dict[str, Any]:
        """The archive's `"calibration"` entry: method, constructor arguments (`params`), what
        the map acts on (`fitted_on`), the map's scalars and C (`n_classes`)."""
        return {
            "method": type(self).method,  # an argument may be called `method` too
            "params": self._json_params(),
            "fitted_on": self.scores_,
            **self._map_entry(),
            **self._width(),
        }

    def _json_params(self) -> dict[str, Any]:
        """The constructor arguments as JSON (`batch_fn`, a callable, is not stored)."""
        params = {k: v for k, v in self.get_params().items() if k not in ("batch_fn",)}
        # as an archive gives them back: tuples as lists, NumPy scalars as Python numbers
        return json.loads(json.dumps(params, default=_plain))

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
        return self._write(path, self.predictor_, self._archived(), self._map_tensors())

    @staticmethod
    def _write(
        path: str | os.PathLike[str],
        base: Any,
        entry: dict[str, Any],
        tensors: Mapping[str, Tensor],
    ) -> str:
        """`base`'s ensemble archive with `entry` as its meta's "calibration" and `tensors`
        beside the members (the one writer of calibrated predictors). A `stateless` base has no
        weights: the archive holds the map alone (`weightless_meta`; a map fitted on logits
        given as such has `nn.Identity()` as its predictor, and is `archive.LOGITS`)."""
        if stateless(base):
            meta = {**weightless_meta(base), "calibration": entry}
            return archive.write(os.fspath(path), {}, {}, meta, type(base).__name__, dict(tensors))
        ensemble = ensemble_of(base)
        meta = {**archived_meta(ensemble.meta, ensemble.skeleton), "calibration": entry}
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
        state = fitted._restored(calibration, tensors or {})
        fitted._set_fitted(ensemble, {**state, "scores_": kind})
        return fitted

    def _restored(self, entry: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        """`_restore`'s state with C (`n_classes_`): the entry's `"n_classes"`, which must be
        the C the map's arrays fix where they fix one (a header claiming 2e8 classes over
        arrays of 5 is refused, not allocated for), else theirs (an archive written before C
        was recorded), else None (any width)."""
        state = self._restore(entry, tensors)
        own = state.get("n_classes_", self._classes_of(state))
        if "n_classes" not in entry:
            return {**state, "n_classes_": own}
        fields = Fields(entry, "calibration", "meta.calibration.")
        classes = fields.integer("n_classes", minimum=1)
        if own is not None and own != classes:
            raise fields.error("n_classes", f"{own}, the classes of the map's arrays", classes)
        return {**state, "n_classes_": classes}


def weightless_meta(base: nn.Module) -> dict[str, Any]:
    """The meta of an archive over a model without weights (`stateless`): `nn.Identity()`
    (saved logits: `peg.load(path)` needs no model) is `archive.LOGITS`; any other module is
    `archive.MODULE` with its `repr`, and loads only with a module of that architecture (its
    outputs, not the logits, are what the map was fitted on: `5 * x` saved as a map over logits
    loaded without it and predicted other probabilities). A module keeping tensors as plain
    attributes, not parameters or buffers, is warned of: they are not in the archive."""
    if type(base) is nn.Identity or type(base) is SavedLogits:
        return {"inputs": archive.LOGITS}
    kept = [
        f"{name}.{key}" if name else key
        for name, module in base.named_modules()
        for key, value in vars(module).items()
        if isinstance(value, Tensor)
    ]
    if kept:
        warnings.warn(
            f"model: {type(base).__name__} keeps tensors as plain attributes ({', '.join(kept[:5])}"
            "), not as parameters or buffers: the archive holds no weights, and peg.load(path, "
            "model) runs the module it is given with its own (register_buffer saves them)",
            stacklevel=4,
        )
    return {"inputs": archive.MODULE, "module": repr(base)[: archive.MODULE_REPR]}


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
