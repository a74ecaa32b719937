"""A calibrated model as a module: the calibrator's map becomes the model's last layer.

PEG (or PEP, MC dropout) starts from a module; a fitted calibrator is a predictor. For the
affine calibrators (temperature, vector and matrix scaling, Dirichlet calibration) fitted on a
module, `calibrated_module(calibrator)` gives `CalibratedModel(model, map)`:

    x ↦ map(s(x)),   s = the model's logits (`scores_ == "logits"`) or their log-softmax
                     (`"log_probs"`: Dirichlet calibration, or a scaling of log p̄),
    map = nn.Linear(C, C) with the calibrator's W and b (vector scaling: W diagonal; temperature
          scaling: W = I / T, b = 0),

whose softmax is the calibrator's prediction (up to float32 rounding: the calibrators compute
in float64). The map is the module's last Linear, so PEG perturbs it with the rest
(`params="all"`) or alone (`params="last_layer"`: "Dirichlet → last-layer PEG"), and K-FAC has
factors for it. An archive of PEG around `Scaled` or `CalibratedModel` records the wrapper
(`peg._wrappers`): it loads with the user's own model, `peg.load(path, model, val=val)`, wrapped
as it was saved (T from the record, the map's weights from the archive).
Other maps (histogram binning, isotonic, spline: piecewise; ensemble TS: a mixture of
probabilities; order-preserving: piecewise linear) are not an affine layer: refused.

`base_module(model)` is what PEG, PEP and MC dropout call on the model they are given: a fitted
temperature scaling on a module becomes `Scaled(model, T)`, a fitted vector / matrix scaling or
Dirichlet calibration on a module its `CalibratedModel` (as `peg.compare` chains them: "TS →
PEG", "Dirichlet → PEG"), anything else is returned as it is; binning and isotonic regression,
or a calibrator fitted on an ensemble, are a clear error naming `model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from peg._schema import Fields
from peg._wrappers import WRAPPERS
from peg.errors import ArchiveError
from peg.methods.base import is_fitted
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.calibration.scaling import _Affine
from peg.methods.calibration.temperature import TemperatureScaling
from peg.output import logits_of


class Scaled(nn.Module):
    """`model(x) / T`: a temperature-scaled model as a module (its softmax is temperature
    scaling's), for methods that start from a module (PEG, PEP, MC dropout: "TS → PEG"). T is
    a constant, not a parameter: PEG perturbs the model's own weights."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        super().__init__()
        self.model = model
        self.temperature = float(temperature)
        self.train(model.training)  # the model's mode (a new module starts in training mode)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return logits_of(self.model(*args, **kwargs)) / self.temperature

    def wrapper_record(self) -> dict[str, Any]:
        """What an archive records of this wrapper (`peg._wrappers`): T, no tensor."""
        return {"temperature": self.temperature}


class CalibratedModel(nn.Module):
    """`map(s(x))`: a model followed by a calibration map `nn.Linear(C, C)` (see the module doc).

    Args:
        model: the model (its logits `[N, C]`, or an output `logits_of` reads).
        n_classes: C.
        log_probs: apply the map to log-softmax of the logits (True) or to the logits.
    """

    def __init__(self, model: nn.Module, n_classes: int, *, log_probs: bool) -> None:
        super().__init__()
        self.model = model
        self.log_probs = bool(log_probs)
        p = next(iter(model.parameters()), None)
        options: dict[str, Any] = {} if p is None else {"dtype": p.dtype, "device": p.device}
        self.map = nn.Linear(n_classes, n_classes, **options)
        with torch.no_grad():
            self.map.weight.copy_(torch.eye(n_classes))
            self.map.bias.zero_()
        self.train(model.training)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        s = logits_of(self.model(*args, **kwargs))
        return self.map(s.log_softmax(-1) if self.log_probs else s)

    def wrapper_record(self) -> dict[str, Any]:
        """What an archive records of this wrapper (`peg._wrappers`): the map's weights are
        entries of the state dict, `log_probs` is not."""
        return {"log_probs": self.log_probs}


def _scaled(model: nn.Module, record: Fields, shapes: Mapping[str, tuple[int, ...]]) -> Scaled:
    """`Scaled(model, T)` from an archive's record (`peg._wrappers`)."""
    return Scaled(model, record.number("temperature", positive=True))


def _calibrated(
    model: nn.Module, record: Fields, shapes: Mapping[str, tuple[int, ...]]
) -> CalibratedModel:
    """`CalibratedModel(model, C, log_probs)` from an archive's record, C from the archive's
    own map (`map.weight` [C, C], `map.bias` [C]: no size the record alone implies)."""
    log_probs = record.boolean("log_probs")
    bias, weight = shapes.get("map.bias"), shapes.get("map.weight")
    if bias is None or len(bias) != 1 or weight != (bias[0], bias[0]) or bias[0] < 1:
        raise ArchiveError(
            f"{record.where}: a CalibratedModel archive needs its map, 'map.weight' [C, C] and "
            f"'map.bias' [C]; it holds {weight} and {bias}"
        )
    return CalibratedModel(model, bias[0], log_probs=log_probs)


# archives of PEG around either load with the user's own model ("TS → PEG", "Dirichlet → PEG")
WRAPPERS.add(Scaled.__name__, (Scaled, _scaled))
WRAPPERS.add(CalibratedModel.__name__, (CalibratedModel, _calibrated))


def composable(calibrator: Any) -> bool:
    """Whether `calibrator` is a fitted vector / matrix scaling or Dirichlet calibration on an
    nn.Module (its map can become the module's last layer without being told C)."""
    return (
        isinstance(calibrator, _Affine)
        and is_fitted(calibrator)
        and isinstance(calibrator.predictor_, nn.Module)
    )


def calibrated_module(calibrator: Any, n_classes: int | None = None) -> CalibratedModel:
    """The fitted affine calibrator `calibrator` (on an nn.Module) as a `CalibratedModel`.

    `n_classes` (C) is needed for temperature scaling only (a scalar map does not record it).
    Raises ValueError naming `calibrator` for a calibrator without an affine map (binning,
    isotonic), one not fitted on a module, or an unfitted one.
    """
    if not isinstance(calibrator, (_Affine, TemperatureScaling)):
        raise ValueError(
            "calibrator: expected a fitted temperature, vector or matrix scaling or Dirichlet "
            f"calibration (an affine map a gradient can move), got {type(calibrator).__name__}"
        )
    if "meta_" not in calibrator.__dict__:
        raise ValueError(f"calibrator: {type(calibrator).__name__} is not fitted; call fit first")
    model = calibrator.predictor_
    if not isinstance(model, nn.Module):
        raise ValueError(
            "calibrator: fitted on a " + type(model).__name__ + "; its map becomes a model's "
            "last layer only when it was fitted on an nn.Module"
        )
    if isinstance(calibrator, TemperatureScaling):
        c, weight, bias = n_classes, None, None
    else:
        weight, bias = calibrator.weights_, calibrator.bias_
        c = bias.shape[0]
    if c is None:
        raise ValueError(
            "n_classes: temperature scaling does not record the number of classes; pass it"
        )
    out = CalibratedModel(model, c, log_probs=calibrator.scores_ == "log_probs")
    with torch.no_grad():
        if weight is None:
            out.map.weight.copy_(torch.eye(c) / float(calibrator.temperature_))
        else:
            w = weight if weight.ndim == 2 else torch.diag(weight)
            out.map.weight.copy_(w.to(out.map.weight))
            out.map.bias.copy_(bias.to(out.map.bias))
    return out


def base_module(model: Any) -> Any:
    """`model` as the base of PEG, PEP or MC dropout (see the module doc): a fitted affine
    calibrator on an nn.Module → the calibrated module; any other calibrator → ValueError
    naming `model` and why; anything else unchanged."""
    if not isinstance(model, Calibrator):
        return model
    name = type(model).__name__
    if not isinstance(model, (_Affine, TemperatureScaling)):
        raise ValueError(
            f"model: a {name} cannot be the base of a perturbation or sampling method: only "
            "temperature, vector, matrix scaling and Dirichlet maps become a model's last layer "
            "(an affine map of the logits; the others are piecewise or mixtures of "
            "probabilities); build the ensemble on the model, then calibrate it: "
            f"peg.{name}().fit(ensemble, val)"
        )
    if "meta_" not in model.__dict__:
        raise ValueError(f"model: {name} is not fitted; call fit(model, val) first")
    if not isinstance(model.predictor_, nn.Module):
        raise ValueError(
            f"model: this {name} was fitted on a {type(model.predictor_).__name__}, not on an "
            "nn.Module; its map becomes a model's last layer only when it was fitted on one"
        )
    if isinstance(model, TemperatureScaling):
        return Scaled(model.predictor_, model.temperature_)
    return calibrated_module(model)
