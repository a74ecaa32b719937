"""peg: cheap, well-calibrated ensembles from an already-trained PyTorch model.

import peg
ens = peg.PEG(n_members=15, eta="search").fit(model, (X_val, y_val))
peg.evaluate(ens, X_test, y_test)   # {'nll': ..., 'error': ..., 'brier': ..., 'ece': ..., ...}
peg.compare(model, (X_val, y_val), (X_test, y_test))   # which post-hoc method? one table
peg.AutoSelect().fit(model, (X_val, y_val))   # the best of them, chosen on validation data only
"""

# Every public name is imported on first use (PEP 562 `__getattr__`): `import peg` loads no
# torch, so the `peg` command's `--help` and argument errors start in a fraction of a second
# (`peg.apps.cli`); `peg.<name>`, `from peg import <name>` and `from peg import *` are as before.

import importlib
import importlib.util
import sys
import types
from typing import Any

from peg._version import __version__

# name -> the module that defines it
_NAMES = {
    "ArchiveError": "peg.errors",
    "InvalidParameterError": "peg.errors",
    "NonFiniteError": "peg.errors",
    "NotFittedError": "peg.errors",
    "OODDetector": "peg.detectors",
    "Ensemble": "peg.ensemble",
    "evaluate": "peg.evaluate",
    "load": "peg.loading",
    "BetaCalibration": "peg.methods.calibration.beta",
    "HistogramBinning": "peg.methods.calibration.binning",
    "IsotonicCalibration": "peg.methods.calibration.binning",
    "EnsembleTemperatureScaling": "peg.methods.calibration.ensemble_temperature",
    "LabelShift": "peg.methods.calibration.label_shift",
    "OrderPreservingScaling": "peg.methods.calibration.order_preserving",
    "PlattScaling": "peg.methods.calibration.platt",
    "DirichletCalibration": "peg.methods.calibration.scaling",
    "MatrixScaling": "peg.methods.calibration.scaling",
    "VectorScaling": "peg.methods.calibration.scaling",
    "SplineCalibration": "peg.methods.calibration.spline",
    "TemperatureScaling": "peg.methods.calibration.temperature",
    "VennAbers": "peg.methods.calibration.venn_abers",
    "ConformalBinary": "peg.methods.conformal.kinds",
    "ConformalClassifier": "peg.methods.conformal.classifier",
    "ConformalDense": "peg.methods.conformal.kinds",
    "ConformalMultilabel": "peg.methods.conformal.kinds",
    "ConformalRegressor": "peg.methods.conformal.regressor",
    "MCDropout": "peg.methods.dropout",
    "PerformanceEstimator": "peg.methods.estimation",
    "Laplace": "peg.methods.laplace.laplace",
    "PackedEnsemble": "peg.methods.packed",
    "MCPatched": "peg.methods.patching",
    "ScaleSearch": "peg.methods.perturbation._scale_search",
    "PEG": "peg.methods.perturbation.peg",
    "PEP": "peg.methods.perturbation.pep",
    "DeepEnsemble": "peg.methods.trained.deep_ensemble",
    "SWA": "peg.methods.trained.swag",
    "SWAG": "peg.methods.trained.swag",
    "with_output": "peg.output",
    # the applications (`import peg` loads none of them: tests/apps/test_layout.py)
    "compare": "peg.apps.compare",
    "AutoSelect": "peg.apps.select",
    "Monitor": "peg.apps.monitor",
}
# the subpackages `dir(peg)` lists, reached as `peg.<name>` without importing them (plots: in a
# script as in a notebook); any other submodule is reached so too
_MODULES = (
    "analysis",
    "data",
    "distributed",
    "layers",
    "metrics",
    "methods",
    "models",
    "plots",
    "subspace",
    "train",
)

__all__ = [
    "PEG",
    "PEP",
    "SWA",
    "SWAG",
    "ArchiveError",
    "AutoSelect",
    "BetaCalibration",
    "ConformalBinary",
    "ConformalClassifier",
    "ConformalDense",
    "ConformalMultilabel",
    "ConformalRegressor",
    "DeepEnsemble",
    "DirichletCalibration",
    "Ensemble",
    "EnsembleTemperatureScaling",
    "HistogramBinning",
    "InvalidParameterError",
    "IsotonicCalibration",
    "LabelShift",
    "Laplace",
    "MCDropout",
    "MCPatched",
    "MatrixScaling",
    "Monitor",
    "NonFiniteError",
    "NotFittedError",
    "OODDetector",
    "OrderPreservingScaling",
    "PackedEnsemble",
    "PerformanceEstimator",
    "PlattScaling",
    "ScaleSearch",
    "SplineCalibration",
    "TemperatureScaling",
    "VectorScaling",
    "VennAbers",
    "__version__",
    "compare",
    "distributed",
    "evaluate",
    "layers",
    "load",
    "models",
    "subspace",
    "train",
    "with_output",
]


def __getattr__(name: str) -> Any:
    """`peg.<name>`, imported on first use and kept (see the comment at the top)."""
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif not name.startswith("__") and importlib.util.find_spec(f"peg.{name}") is not None:
        value = importlib.import_module(f"peg.{name}")  # any submodule, as an eager peg had
    else:
        raise AttributeError(f"module 'peg' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES) | set(_MODULES))


class _Package(types.ModuleType):
    """`peg` itself: importing the module `peg.evaluate` (as peg's own modules do) sets the
    package's attribute `evaluate` to that module; `peg.evaluate` stays the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _NAMES.get(name) == value.__name__:
            return  # the function of that name, not its module (imported on first use)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
