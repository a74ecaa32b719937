"""Function-space diversity: the loss-landscape analyses of Fort et al. (2019), "Deep Ensembles:
A Loss Landscape Perspective", as library functions (the study that runs them all, `peg
diversity`, is an application: `peg.apps.diversity`).

    from peg.analysis import train_trajectories, tsne_predictions, radial_cut
    trajs = train_trajectories(factory, (X, y), Recipe(epochs=10), seeds=[0, 1, 2], cache="c/")
    xy = tsne_predictions(member_logits)                     # [K, N, C] -> [K, 2]
    plane = diversity_accuracy(ref_logits, sample_logits, y)  # accuracy and diversity per sample
    cut = radial_cut(model, [trajs[0].final, trajs[1].final], X_test, y_test)

The measures themselves (cosine similarity, disagreement, ...) are in `peg.metrics.diversity`;
the figures in `peg.plots`.
"""

from peg.analysis.embedding import default_perplexity, tsne_predictions
from peg.analysis.landscape import plane_basis, project, radial_cut
from peg.analysis.plane import (
    PAPER_EXPONENT,
    diversity_accuracy,
    flip_curve,
    reference_curves,
    uncorrelated_curve,
)
from peg.analysis.trajectories import Trajectory, train_trajectories, train_trajectory

__all__ = [
    "PAPER_EXPONENT",
    "Trajectory",
    "default_perplexity",
    "diversity_accuracy",
    "flip_curve",
    "plane_basis",
    "project",
    "radial_cut",
    "reference_curves",
    "train_trajectories",
    "train_trajectory",
    "tsne_predictions",
    "uncorrelated_curve",
]
