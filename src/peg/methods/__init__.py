"""Methods: each turns a model (and data) into an `Ensemble` or a predictor with `member_logits`."""

from peg.methods.peg import PEG
from peg.methods.pep import PEP
from peg.methods.temperature import TemperatureScaling

__all__ = ["PEG", "PEP", "TemperatureScaling"]
