"""peg: cheap, well-calibrated ensembles from an already-trained PyTorch model.

import peg
ens = peg.PEG(n_members=15, eta="search").fit(model, (X_val, y_val))
peg.evaluate(ens, X_test, y_test)   # {'nll': ..., 'error': ..., 'brier': ..., 'ece': ..., ...}
peg.compare(model, (X_val, y_val), (X_test, y_test))   # which post-hoc method? one table
peg.AutoSelect().fit(model, (X_val, y_val))   # the best of them, chosen on validation data only
"""

import importlib
from typing import Any

from peg import distributed, layers, models, subspace, train
from peg._version import __version__
from peg.detectors import OODDetector
from peg.ensemble import Ensemble
from peg.errors import ArchiveError, InvalidParameterError, NonFiniteError, NotFittedError
from peg.evaluate import evaluate
from peg.loading import load
from peg.methods.calibration.binning import HistogramBinning, IsotonicCalibration
from peg.methods.calibration.ensemble_temperature import EnsembleTemperatureScaling
from peg.methods.calibration.label_shift import LabelShift
from peg.methods.calibration.order_preserving import OrderPreservingScaling
from peg.methods.calibration.scaling import DirichletCalibration, MatrixScaling, VectorScaling
from peg.methods.calibration.spline import SplineCalibration
from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.conformal.classifier import ConformalClassifier
from peg.methods.conformal.regressor import ConformalRegressor
from peg.methods.dropout import MCDropout
from peg.methods.estimation import PerformanceEstimator
from peg.methods.laplace.laplace import Laplace
from peg.methods.packed import PackedEnsemble
from peg.methods.patching import MCPatched
from peg.methods.perturbation._scale_search import ScaleSearch
from peg.methods.perturbation.peg import PEG
from peg.methods.perturbation.pep import PEP
from peg.methods.trained.deep_ensemble import DeepEnsemble
from peg.methods.trained.swag import SWA, SWAG
from peg.output import with_output

__all__ = [
    "PEG",
    "PEP",
    "SWA",
    "SWAG",
    "ArchiveError",
    "AutoSelect",
    "ConformalClassifier",
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
    "ScaleSearch",
    "SplineCalibration",
    "TemperatureScaling",
    "VectorScaling",
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
    """`peg.compare`, `peg.AutoSelect` and `peg.Monitor`, the applications
    `peg.apps.compare.compare`, `peg.apps.select.AutoSelect` and `peg.apps.monitor.Monitor`,
    imported on first use (PEP 562): `import peg` loads no application
    (tests/apps/test_layout.py)."""
    if name == "compare":
        return importlib.import_module("peg.apps.compare").compare
    if name == "AutoSelect":
        return importlib.import_module("peg.apps.select").AutoSelect
    if name == "Monitor":
        return importlib.import_module("peg.apps.monitor").Monitor
    raise AttributeError(f"module 'peg' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"compare", "AutoSelect", "Monitor"})
