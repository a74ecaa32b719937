"""Figures: reliability diagrams, risk–coverage curves, decision boundaries and the
function-space diversity figures.

Headless: figures are drawn with matplotlib's object API on an Agg canvas (no pyplot, no
display, no global figure state), so importing or calling these never needs a screen and never
changes the caller's matplotlib backend. Every function writes its PNG atomically
(`peg._io.atomic_open`: a temporary file in the same folder, then `os.replace`), creates missing
parent folders and returns the path (`risk_coverage` returns its Axes: it may draw into one).

- `reliability`: `reliability_diagram`.
- `selective`: `risk_coverage` (draws into a given matplotlib Axes too; writes a PNG only when
  given a path, and returns the Axes).
- `boundaries`: `decision_boundaries`.
- `heatmaps`: `similarity_matrices`, `radial_landscape`.
- `embedding`: `prediction_map`.
- `curves`: `diversity_accuracy_plane`, `ensemble_size_curves`, `scale_search`.
- `corruptions`: `corruption_grid` (one image under every corruption and a few severities).
- `_figure`: what they share (canvas, PNG write, input checks, colours and markers).

The diversity figures are those of `peg.analysis` (Fort et al. 2019, "Deep ensembles: a loss
landscape perspective").
"""

from peg.plots.boundaries import decision_boundaries
from peg.plots.corruptions import corruption_grid
from peg.plots.curves import diversity_accuracy_plane, ensemble_size_curves, scale_search
from peg.plots.embedding import prediction_map
from peg.plots.heatmaps import radial_landscape, similarity_matrices
from peg.plots.reliability import reliability_diagram
from peg.plots.selective import risk_coverage

__all__ = [
    "corruption_grid",
    "decision_boundaries",
    "diversity_accuracy_plane",
    "ensemble_size_curves",
    "prediction_map",
    "radial_landscape",
    "reliability_diagram",
    "risk_coverage",
    "scale_search",
    "similarity_matrices",
]
