"""Figures: reliability diagrams, risk–coverage curves, decision boundaries and the
function-space diversity figures.

Headless: figures are drawn with matplotlib's object API on an Agg canvas (no pyplot, no
display, no global figure state; matplotlib is imported on the first figure, not with peg), so
importing or calling these never needs a screen and never changes the caller's matplotlib
backend. Every function takes `path=None` and `ax=None` (keywords):

- neither: returns the new matplotlib `Figure` (a notebook shows it once: it is not in pyplot's
  registry, so no backend shows it again at the end of the cell);
- `path`: writes the PNG atomically (`peg.utils.io.atomic_open`: a temporary file in the same
  folder, then `os.replace`), creates missing parent folders and returns the path
  (`risk_coverage` returns its Axes, as it always has);
- `ax`: draws on that matplotlib Axes of your own figure (one-panel figures, and every
  method of `reliability_diagram`), or on one Axes per panel (a sequence); one Axes given for
  several panels, they are drawn in its place (a SubFigure where the Axes was: always for
  `corruption_grid`'s grid); returns `ax` (or that SubFigure); with `path` too, your whole
  figure is written.

- `reliability`: `reliability_diagram`, from probabilities and labels
  (`reliability_diagram(probs, labels)`, or a dict {name: probs} for one panel each) or from
  `peg.metrics.reliability` data.
- `kinds`: `binary_reliability_diagram`, `multilabel_reliability_diagram` (pooled or per
  label), `dense_reliability_diagram` (positions not ignored), drawn by `reliability_diagram`.
- `selective`: `risk_coverage`.
- `boundaries`: `decision_boundaries`.
- `heatmaps`: `similarity_matrices`, `radial_landscape`.
- `embedding`: `prediction_map`.
- `curves`: `diversity_accuracy_plane`, `ensemble_size_curves`, `scale_search`.
- `corruptions`: `corruption_grid` (one image under every corruption and a few severities).
- `_figure`: what they share (where a figure is drawn, what it returns, the PNG write, input
  checks, colours and markers).

The diversity figures are those of `peg.analysis` (Fort et al. 2019, "Deep ensembles: a loss
landscape perspective").
"""

from peg.plots.boundaries import decision_boundaries
from peg.plots.corruptions import corruption_grid
from peg.plots.curves import diversity_accuracy_plane, ensemble_size_curves, scale_search
from peg.plots.embedding import prediction_map
from peg.plots.heatmaps import radial_landscape, similarity_matrices
from peg.plots.kinds import (
    binary_reliability_diagram,
    dense_reliability_diagram,
    multilabel_reliability_diagram,
)
from peg.plots.reliability import reliability_diagram
from peg.plots.selective import risk_coverage

__all__ = [
    "binary_reliability_diagram",
    "corruption_grid",
    "decision_boundaries",
    "dense_reliability_diagram",
    "diversity_accuracy_plane",
    "ensemble_size_curves",
    "multilabel_reliability_diagram",
    "prediction_map",
    "radial_landscape",
    "reliability_diagram",
    "risk_coverage",
    "scale_search",
    "similarity_matrices",
]
