"""Label-free performance estimation after deployment: a model's accuracy on unlabelled target
data with an interval (`PerformanceEstimator`), each estimator registered by key
(`estimators.ESTIMATORS`), the streamed summary they read (`_stats`), the interval's
calibration on synthetic shifts (`_shifts`)."""

from peg.methods.estimation.estimator import Estimate, PerformanceEstimator
from peg.methods.estimation.estimators import ESTIMATORS

__all__ = ["ESTIMATORS", "Estimate", "PerformanceEstimator"]
