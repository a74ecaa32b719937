"""`peg.AutoSelect`: the best post-hoc predictor for a trained model, chosen by cross-fitting on
its validation data only (`auto`), from cross-fitted per-point scores (`cross`, `folds`) with a
report (`report`). Guide: docs/select.md."""

from peg.apps.select import builder  # noqa: F401  (registers "auto-select")
from peg.apps.select.auto import DEFAULT_CANDIDATES, AutoSelect

__all__ = ["DEFAULT_CANDIDATES", "AutoSelect"]
