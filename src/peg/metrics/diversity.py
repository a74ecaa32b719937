"""How different ensemble members are, in weight space and in function space (Fort et al. 2019).

Pure functions of tensors. Weights are a list of state dicts or a matrix `[M, P]`; predictions
are member logits `[M, N, C]` (member first, as everywhere in `peg.metrics`).

- `cosine_similarity(weights) -> [M, M]`: cosine of the angle between flattened weight vectors
  (Fig. 2a, 3 of the paper).
- `disagreement(member_logits) -> [M, M]`: fraction of points whose predicted classes differ
  (Fig. 2b, 3).
- `normalized_disagreement(member_logits, y) -> [M, M]`: disagreement divided by the error rate
  of the row member (the paper's "diversity" axis of the diversity–accuracy plane, §4.3, which
  normalises by the reference solution's error, 1 − accuracy).
- `pairwise_kl(member_logits) -> [M, M]`: mean over points of KL(p_i ‖ p_j).
- `jensen_shannon(member_logits) -> float`: the paper's §5 measure, (1/M) Σ_m KL(p_m ‖ p̄),
  averaged over points (nats).
- `mutual_information`: re-exported from `peg.metrics.ood` (mean over points, here).
- `size_curve(member_logits, y, orders=...)`: accuracy and NLL of the ensemble of the first k
  members, k = 1..M, in the given order and averaged over random orders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg._params import flatten_state
from peg.metrics.classification import error, nll
from peg.metrics.ood import mutual_information as _mi_per_point
from peg.source._values import as_tensor, check_labels

Weights = Tensor | Sequence[Mapping[str, Tensor]]


def _members(member_logits: Any, name: str = "member_logits") -> Tensor:
    t = as_tensor(member_logits, name)
    if t.ndim != 3:
        raise ValueError(f"{name}: expected member logits [M, N, C], got shape {tuple(t.shape)}")
    if t.shape[0] < 2:
        raise ValueError(f"{name}: diversity needs at least 2 members, got {t.shape[0]}")
    if t.shape[1] == 0:
        raise ValueError(f"{name}: expected at least one point (N >= 1), got N = 0")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: expected finite values, got NaN or inf")
    return t.double()


def weight_matrix(weights: Weights, floating_only: bool = True) -> Tensor:
    """Flatten weights to `[M, P]`: a matrix as is, or state dicts with the same keys/shapes.

    With `floating_only`, integer buffers (e.g. BatchNorm's num_batches_tracked) are skipped.
    """
    if isinstance(weights, Tensor):
        if weights.ndim != 2:
            raise ValueError(f"weights: expected [M, P], got shape {tuple(weights.shape)}")
        W = weights.detach().double()
    else:
        states = list(weights)
        if not states or not all(isinstance(s, Mapping) for s in states):
            raise ValueError("weights: expected an [M, P] tensor or a list of state dicts")
        keys = [k for k, v in states[0].items() if v.is_floating_point() or not floating_only]
        for i, s in enumerate(states[1:], 1):
            if set(s) != set(states[0]) or any(s[k].shape != states[0][k].shape for k in keys):
                raise ValueError(
                    f"weights: state dict {i} differs from state dict 0 in names/shapes"
                )
        W = torch.stack([flatten_state(s, keys, dtype=torch.float64) for s in states])
    if W.shape[0] < 2:
        raise ValueError(f"weights: need at least 2 members, got {W.shape[0]}")
    return W


def cosine_similarity(weights: Weights) -> Tensor:
    """Cosine similarity between members' flattened weights, `[M, M]` (diagonal 1)."""
    W = weight_matrix(weights)
    norms = W.norm(dim=1, keepdim=True)
    if (norms == 0).any():
        raise ValueError("weights: a member has all-zero weights (cosine undefined)")
    U = W / norms
    return (U @ U.T).clamp(-1, 1)


def disagreement(member_logits: Any) -> Tensor:
    """Fraction of points on which members i and j predict different classes, `[M, M]`."""
    pred = _members(member_logits).argmax(-1)  # [M, N]
    return (pred[:, None, :] != pred[None, :, :]).double().mean(-1)


def normalized_disagreement(member_logits: Any, y: Any) -> Tensor:
    """Disagreement divided by the error rate of the row member, `[M, M]`.

    Row i is the diversity of every member relative to member i as the reference solution
    (Fort et al. §4.3: disagreement / (1 − accuracy of the reference)). A reference with zero
    error gives inf where it disagrees and 0 where it does not (documented, not an error).
    """
    logits = _members(member_logits)
    labels = check_labels(y, logits.shape[1], logits.shape[2], device=logits.device)
    err = (logits.argmax(-1) != labels).double().mean(-1)  # [M]
    d = disagreement(logits)
    out = d / err[:, None]  # inf where a perfect reference disagrees
    return torch.where(d == 0, torch.zeros_like(out), out)


def pairwise_kl(member_logits: Any) -> Tensor:
    """Mean over points of KL(p_i ‖ p_j) in nats, `[M, M]` (not symmetric; diagonal 0)."""
    logp = torch.log_softmax(_members(member_logits), -1)  # [M, N, C]
    p = logp.exp()
    # KL(i||j) = Σ_c p_i (log p_i − log p_j), averaged over points
    cross = torch.einsum("inc,jnc->ijn", p, logp)
    self_term = (p * logp).sum(-1)  # [M, N]
    return (self_term[:, None, :] - cross).mean(-1).clamp_min(0)


def jensen_shannon(member_logits: Any) -> float:
    """(1/M) Σ_m KL(p_m ‖ p̄), averaged over points (nats): the paper's §5 diversity measure."""
    logp = torch.log_softmax(_members(member_logits), -1)
    log_mean = torch.logsumexp(logp, 0) - math.log(logp.shape[0])  # [N, C]
    kl = (logp.exp() * (logp - log_mean)).sum(-1)  # [M, N]
    return float(kl.mean().clamp_min(0))


def mutual_information(member_logits: Any) -> float:
    """The ensemble's mutual information H[p̄] − mean H[p_m], averaged over points (nats)."""
    return float(_mi_per_point(_members(member_logits)).mean())


def size_curve(
    member_logits: Any, y: Any, orders: int = 20, seed: int = 0
) -> dict[str, list[float]]:
    """Accuracy and NLL of the ensemble of its first k members, k = 1..M.

    Returns `{"size": [1..M], "accuracy", "nll"}` for the members in their given order, and
    `"accuracy_random"`, `"nll_random"` averaged over `orders` random permutations (seeded).
    """
    logits = _members(member_logits)
    check_labels(y, logits.shape[1], logits.shape[2])
    M = logits.shape[0]
    rng = np.random.default_rng(seed)

    def curve(order: Sequence[int]) -> tuple[list[float], list[float]]:
        acc, nl = [], []
        for k in range(1, M + 1):
            sub = logits[list(order[:k])]
            acc.append(1.0 - error(sub, y))
            nl.append(nll(sub, y))
        return acc, nl

    acc, nl = curve(range(M))
    runs = [curve(rng.permutation(M).tolist()) for _ in range(orders)]
    return {
        "size": list(range(1, M + 1)),
        "accuracy": acc,
        "nll": nl,
        "accuracy_random": np.mean([r[0] for r in runs], axis=0).tolist(),
        "nll_random": np.mean([r[1] for r in runs], axis=0).tolist(),
    }


def summary(member_logits: Any, y: Any, weights: Weights | None = None) -> dict[str, float]:
    """Mean off-diagonal disagreement, normalised disagreement, cosine similarity (if weights),
    Jensen-Shannon, mutual information, and the whole ensemble's accuracy and NLL."""
    logits = _members(member_logits)
    M = logits.shape[0]
    off = ~torch.eye(M, dtype=torch.bool)
    nd = normalized_disagreement(logits, y)[off]
    out = {
        "disagreement": float(disagreement(logits)[off].mean()),
        "normalized_disagreement": float(nd.mean()),
        "jensen_shannon": jensen_shannon(logits),
        "mutual_information": mutual_information(logits),
        "accuracy": 1.0 - error(logits, y),
        "nll": nll(logits, y),
    }
    if weights is not None:
        out["cosine_similarity"] = float(cosine_similarity(weights)[off].mean())
    return out
