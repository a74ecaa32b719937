"""t-SNE of models' predictions (Fort et al. 2019, Figs. 2c and 4).

Each model (checkpoint, sample or ensemble member) is represented by its softmax outputs on a
fixed set of points, flattened to one vector `[N·C]`; t-SNE maps those vectors to the plane, so
nearby points are functions that predict alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

MAX_PERPLEXITY = 30.0  # scikit-learn's default, used once there are enough models


def default_perplexity(n: int) -> float:
    """A perplexity t-SNE accepts for `n` points: 30 when n is large, (n − 1)/3 (≥ 1) below.

    scikit-learn needs perplexity < n; a third of the neighbours keeps tiny inputs stable.
    """
    return float(min(MAX_PERPLEXITY, max(1.0, (n - 1) / 3)))


def tsne_predictions(
    member_logits: Any,
    perplexity: float | None = None,
    seed: int = 0,
    max_iter: int = 1000,
) -> np.ndarray:
    """2-D t-SNE embedding of models' softmax outputs: one point per model.

    Args:
        member_logits: logits `[K, N, C]` of K models on the same N points (Tensor or array),
            K >= 2; the softmax over C is taken here.
        perplexity: t-SNE perplexity, 0 < perplexity < K (default: `default_perplexity(K)`).
        seed: random state of t-SNE.
        max_iter: t-SNE iterations (>= 250, scikit-learn's minimum).

    Returns:
        `[K, 2]` float64 array, row k the position of model k.
    """
    from sklearn.manifold import TSNE

    logits = torch.as_tensor(member_logits).detach().double().cpu()
    if logits.ndim != 3:
        raise ValueError(
            f"member_logits: expected logits [K, N, C] (K models, N points, C classes), "
            f"got shape {tuple(logits.shape)}"
        )
    K = logits.shape[0]
    if K < 2:
        raise ValueError(f"member_logits: t-SNE needs at least 2 models, got {K}")
    if logits.shape[1] == 0 or logits.shape[2] == 0:
        raise ValueError(f"member_logits: expected N, C >= 1, got shape {tuple(logits.shape)}")
    if not torch.isfinite(logits).all():
        raise ValueError("member_logits: expected finite values, got NaN or inf")
    if perplexity is None:
        perplexity = default_perplexity(K)
    elif isinstance(perplexity, bool) or not (
        isinstance(perplexity, (int, float)) and 0 < perplexity < K
    ):
        raise ValueError(
            f"perplexity: expected a number in (0, {K}) for {K} models, got {perplexity!r}"
        )
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 250:
        raise ValueError(f"max_iter: expected an integer >= 250, got {max_iter!r}")
    features = logits.softmax(-1).reshape(K, -1).numpy()
    tsne = TSNE(
        n_components=2,
        perplexity=float(perplexity),
        init="pca" if K > 2 else "random",  # PCA init needs more points than components
        random_state=seed,
        max_iter=max_iter,
    )
    return np.asarray(tsne.fit_transform(features), dtype=np.float64)
