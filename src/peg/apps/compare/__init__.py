"""`peg.compare` and `peg compare`: which post-hoc method suits a trained model? Fit them on its
validation data, compare them on its test data: one table of costs and metrics.

`compare` (`peg.apps.compare.run`), the methods (`methods`: named ones, `method(...)` for
others), the costs (`costs`), the result (`report.Comparison`), the command line's data and
model specifications (`sources`).
"""

from peg.apps.compare.methods import CATALOGUE, DEFAULTS, method
from peg.apps.compare.report import Comparison
from peg.apps.compare.run import compare

__all__ = ["CATALOGUE", "DEFAULTS", "Comparison", "compare", "method"]
