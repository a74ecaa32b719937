"""Methods fitted on an earlier method's fitted predictor, shared by `peg bench` and
`peg.compare`: a column or row whose base names an earlier method ("PEG + TS": temperature
scaling of the PEG ensemble's averaged prediction; "TS → PEG": PEG around the temperature-scaled
model) gets that method's predictor through `as_base`, which hands each method the base it can
fit on (`peg.methods.calibration.composed`: `Scaled`, a temperature-scaled model as a module; a
model with its vector / matrix scaling or Dirichlet map as the last layer, "Dirichlet → PEG"). The
fit time of such a method counts its base's (`chained_seconds`): "TS → PEG" costs temperature
scaling plus PEG.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from peg.ensemble import Ensemble
from peg.methods.base import FittedEnsemble
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.calibration.composed import Scaled, calibrated_module, composable
from peg.methods.calibration.temperature import TemperatureScaling

# registry keys whose method takes any predictor as it is: the base and the calibrators
# (`Calibrator.registry`'s keys, read on use); the others need a module or ensemble
AS_IS = ("base",)


def as_base(fitted: Any, key: str, name: str) -> Any:
    """The fitted predictor of method `name` as the base of a method with registry `key`."""
    as_is = key in AS_IS or key in Calibrator.registry
    if as_is or isinstance(fitted, (nn.Module, Ensemble)):
        return fitted
    if isinstance(fitted, TemperatureScaling) and isinstance(fitted.predictor_, nn.Module):
        return Scaled(fitted.predictor_, fitted.temperature_)
    if composable(fitted):
        return calibrated_module(fitted)  # "Dirichlet → PEG": the map as the last layer
    if isinstance(fitted, FittedEnsemble):
        return fitted.ensemble()
    raise ValueError(
        f"on={name!r}: {key!r} needs a model or an ensemble as its base; {name} gives a "
        f"{type(fitted).__name__}"
    )


def chained_seconds(own: float, base: str, seconds: Mapping[str, float]) -> float:
    """The fit time of a method on `base`: its own plus its base's (`seconds[base]`, 0 for a
    base that is not a fitted method)."""
    return own + float(seconds.get(base, 0.0))
