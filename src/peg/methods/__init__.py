"""Methods: each turns a model (and data) into an `Ensemble` or a predictor with `member_logits`."""

from peg.methods.calibration.beta import BetaCalibration
from peg.methods.calibration.binning import HistogramBinning, IsotonicCalibration
from peg.methods.calibration.ensemble_temperature import EnsembleTemperatureScaling
from peg.methods.calibration.label_shift import LabelShift
from peg.methods.calibration.order_preserving import OrderPreservingScaling
from peg.methods.calibration.platt import PlattScaling
from peg.methods.calibration.scaling import DirichletCalibration, MatrixScaling, VectorScaling
from peg.methods.calibration.spline import SplineCalibration
from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.calibration.venn_abers import VennAbers
from peg.methods.conformal.classifier import ConformalClassifier
from peg.methods.conformal.regressor import ConformalRegressor
from peg.methods.dropout import MCDropout
from peg.methods.laplace.laplace import Laplace
from peg.methods.packed import PackedEnsemble
from peg.methods.patching import MCPatched
from peg.methods.perturbation.peg import PEG
from peg.methods.perturbation.pep import PEP
from peg.methods.trained.deep_ensemble import DeepEnsemble
from peg.methods.trained.subspace import (
    DiagonalGaussian,
    DropoutSubspace,
    LowRankGaussian,
    RandomSubspace,
)
from peg.methods.trained.swag import SWA, SWAG

__all__ = [
    "PEG",
    "PEP",
    "SWA",
    "SWAG",
    "BetaCalibration",
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
    "PlattScaling",
    "RandomSubspace",
    "SplineCalibration",
    "TemperatureScaling",
    "VectorScaling",
    "VennAbers",
]
