"""Methods: each turns a model (and data) into an `Ensemble` or a predictor with `member_logits`."""

from peg.methods.binning import HistogramBinning, IsotonicCalibration
from peg.methods.conformal import ConformalClassifier
from peg.methods.conformal_regression import ConformalRegressor
from peg.methods.deep_ensemble import DeepEnsemble
from peg.methods.dropout import MCDropout
from peg.methods.ensemble_temperature import EnsembleTemperatureScaling
from peg.methods.label_shift import LabelShift
from peg.methods.laplace import Laplace
from peg.methods.order_preserving import OrderPreservingScaling
from peg.methods.packed import PackedEnsemble
from peg.methods.patching import MCPatched
from peg.methods.peg import PEG
from peg.methods.pep import PEP
from peg.methods.scaling import DirichletCalibration, MatrixScaling, VectorScaling
from peg.methods.spline import SplineCalibration
from peg.methods.subspace import DiagonalGaussian, DropoutSubspace, LowRankGaussian, RandomSubspace
from peg.methods.swag import SWA, SWAG
from peg.methods.temperature import TemperatureScaling

__all__ = [
    "PEG",
    "PEP",
    "SWA",
    "SWAG",
    "ConformalClassifier",
    "ConformalRegressor",
    "DeepEnsemble",
    "DiagonalGaussian",
    "DirichletCalibration",
    "DropoutSubspace",
    "EnsembleTemperatureScaling",
    "HistogramBinning",
    "IsotonicCalibration",
    "LabelShift",
    "Laplace",
    "LowRankGaussian",
    "MCDropout",
    "MCPatched",
    "MatrixScaling",
    "OrderPreservingScaling",
    "PackedEnsemble",
    "RandomSubspace",
    "SplineCalibration",
    "TemperatureScaling",
    "VectorScaling",
]
