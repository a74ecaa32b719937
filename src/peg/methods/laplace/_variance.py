"""laplace-torch's GLM predictive for a last-layer KFAC posterior, evaluated through the
Kronecker structure instead of materialised Jacobians.

laplace-torch 0.3 (`KronLLLaplace._glm_predictive_distribution`) forms the last layer's
Jacobians `Js [B, C, P]` (P = C·D + C: weight, then bias, as `parameters_to_vector` orders a
`nn.Linear`'s parameters) and takes `posterior_precision.inv_square_form(Js)`, which multiplies
every one of the B·C rows by the inverse KFAC precision: O(B·C·P·D) (13.8 ms per image for
SmallCNN's Linear(1568 → 10) at one thread, ~500 × its forward pass: docs/performance.md,
"Laplace prediction"). This module computes the same `[B, C, C]`
covariances from the same fitted posterior (Hessian factors, prior precision, temperature: all
laplace-torch's, read from `la.posterior_precision`) in O(B·(D² + C·D + C³)).

The algebra. For `f = W φ + b` (W `[C, D]`), the Jacobian of output c with respect to vec(W)
(row-major) is `e_c ⊗ φ`, with respect to b `e_c`. laplace-torch lays out a Linear's posterior
precision as two blocks (`Kron.init_from_model`): the weight `A ⊗ G` (A `[C, C]` over outputs, G
`[D, D]` over inputs), held decomposed as A = Q₁ diag(a) Q₁ᵀ, G = Q₂ diag(g) Q₂ᵀ with an added
δ₀ (the weight's prior precision), and the bias, a dense `[C, C]` block Q diag(l) Qᵀ + δ₁ (the
two δ are one scalar prior or a per-layer one; laplace-torch refuses a diagonal prior for Kron).
The inverse of the weight block is (Q₁ ⊗ Q₂) diag(1/λ) (Q₁ ⊗ Q₂)ᵀ with λ_pq = a_p g_q + δ₀, or
(a_p + √δ₀)(g_q + √δ₀) with `damping` (`KronDecomposed._bmm`'s two cases). With ψ = Q₂ᵀ φ:

    Σ_cd = Σ_p Q₁[c, p] Q₁[d, p] s_p,   s_p = Σ_q ψ_q² / λ_pq        (weight)
         + (Q diag(1 / (l + δ₁)) Qᵀ)_cd                               (bias, the same for all x)

ψ costs D² per point, s C·D, the sum C³: no `[B, C, P]` tensor.

Called explicitly, never patched in: `predictive` and `gridsearch` compute the GLM predictive and
the prior's grid search from `glm_predictive_distribution`, with laplace-torch's own link
approximations written out (`link`, the same operations as its `_glm_forward_call`) and its own
Gaussian sampler (`laplace.utils.normal_samples`). They are used only where `usable(la)`: the
installed laplace-torch is the version this was written against (`TESTED`, whose posterior
layout `supported` reads) and the posterior is a last-layer KFAC one. Anywhere else (another
version, structure or layout, features that are not `[B, D]`) the caller goes through
laplace-torch's public calls, `la(x, ...)`, `la.predictive_samples` and
`la.optimize_prior_precision`.
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

TESTED = "0.3"  # the laplace-torch version whose posterior layout and links this mirrors


def tested_version() -> bool:
    """Whether the installed laplace-torch is `TESTED` (0.3.x)."""
    try:
        version = importlib.metadata.version("laplace-torch")
    except importlib.metadata.PackageNotFoundError:
        return False
    return version == TESTED or version.startswith(TESTED + ".")


def _layer(la: Any) -> nn.Linear | None:
    """The last nn.Linear of a last-layer laplace-torch object (None for any other)."""
    layer = getattr(getattr(la, "model", None), "last_layer", None)
    return layer if isinstance(layer, nn.Linear) else None


def supported(la: Any) -> bool:
    """Whether `la` is a fitted last-layer KFAC posterior laid out as this module reads it:
    `[[Q₁ [C, C], Q₂ [D, D]]]` for the weight, then `[[Q [C, C]]]` for a bias."""
    layer = _layer(la)
    if layer is None or getattr(la, "H_facs", None) is None:
        return False
    precision = la.posterior_precision
    if not all(hasattr(precision, k) for k in ("eigenvectors", "eigenvalues", "deltas", "damping")):
        return False  # a diagonal or dense posterior: a Tensor
    C, D = layer.out_features, layer.in_features
    expected = [[(C, C), (D, D)]] + ([[(C, C)]] if layer.bias is not None else [])
    vectors = [[tuple(q.shape) for q in qs] for qs in precision.eigenvectors]
    values = [[tuple(v.shape) for v in vs] for vs in precision.eigenvalues]
    return vectors == expected and values == [[(n,) for n, _ in b] for b in expected]


def kron_functional_variance(precision: Any, features: Tensor, bias: bool) -> Tensor:
    """`[B, C, C]`: laplace-torch's `precision.inv_square_form(Js)` for the Jacobians `Js` of
    a Linear layer (weight, then bias if `bias`) at `features [B, D]`, without forming them.

    `precision`: a `KronDecomposed` laid out as `supported` checks (its eigenvectors,
    eigenvalues, `deltas` and `damping` are read, nothing else)."""
    (Q1, Q2), (a, g) = precision.eigenvectors[0], precision.eigenvalues[0]
    delta = precision.deltas[0]
    if precision.damping:
        root = delta.sqrt()
        inverse = torch.outer(a + root, g + root).reciprocal()  # [C, D]
    else:
        inverse = (torch.outer(a, g) + delta).reciprocal()
    psi = features.to(Q2.dtype) @ Q2  # [B, D]: φ in G's eigenbasis
    s = psi.square() @ inverse.T  # [B, C]
    variance = (Q1 * s.unsqueeze(1)) @ Q1.T  # [B, C, C]
    if bias:  # the bias block's inverse: the same [C, C] for every point
        Q, l = precision.eigenvectors[1][0], precision.eigenvalues[1][0]
        variance = variance + (Q * (l + precision.deltas[1]).reciprocal()) @ Q.T
    return variance


def usable(la: Any) -> bool:
    """Whether the explicit path applies to `la`: laplace-torch `TESTED` and `supported(la)`."""
    return tested_version() and supported(la)


def glm_predictive_distribution(la: Any, X: Any) -> tuple[Tensor, Tensor] | None:
    """What laplace-torch's `LLLaplace._glm_predictive_distribution(X)` returns for a
    `usable` posterior: the logits `f_mu [B, C]` and their covariance `[B, C, C]`, the covariance
    by `kron_functional_variance`; None where the features are not `[B, D]` (the caller then
    takes laplace-torch's own path)."""
    layer = _layer(la)
    assert layer is not None  # only called where `usable`
    with torch.set_grad_enabled(torch.is_grad_enabled() and bool(la.enable_backprop)):
        f_mu, phi = la.model.forward_with_features(X)
        C, D = layer.out_features, layer.in_features
        if f_mu.ndim != 2 or phi.ndim != 2 or f_mu.shape[1] != C or phi.shape[1] != D:
            return None  # e.g. 3-d features
        f_var = kron_functional_variance(la.posterior_precision, phi, layer.bias is not None)
    return (f_mu, f_var) if la.enable_backprop else (f_mu.detach(), f_var.detach())


def link(f_mu: Tensor, f_var: Tensor, link_approx: str) -> Tensor:
    """laplace-torch 0.3's deterministic link approximations (`_glm_forward_call`), `[B, C]`
    probabilities from the Gaussian logits `f_mu [B, C]`, `f_var [B, C, C]`."""
    if link_approx == "probit":
        kappa = 1 / torch.sqrt(1.0 + math.pi / 8 * f_var.diagonal(dim1=1, dim2=2))
        return torch.softmax(kappa * f_mu, dim=-1)
    # the Laplace bridge, after laplace-torch's zero-mean correction
    total = f_var.sum(dim=(1, 2)).reshape(-1, 1)
    f_mu = f_mu - f_var.sum(-1) * f_mu.sum(-1).reshape(-1, 1) / total
    f_var = f_var - torch.einsum("bi,bj->bij", f_var.sum(-1), f_var.sum(-2)) / total[..., None]
    K = f_mu.size(-1)
    diagonal = torch.diagonal(f_var, dim1=1, dim2=2)
    if link_approx == "bridge_norm":
        mean = diagonal.mean(dim=1) / torch.as_tensor([K / 2], dtype=f_mu.dtype).to(f_mu).sqrt()
        f_mu = f_mu / mean.sqrt().unsqueeze(-1)
        diagonal = diagonal / mean.unsqueeze(-1)
    sum_exp = torch.exp(-f_mu).sum(dim=1).unsqueeze(-1)
    alpha = (1 - 2 / K + f_mu.exp() / K**2 * sum_exp) / diagonal
    return torch.nan_to_num(alpha / alpha.sum(dim=1).unsqueeze(-1), nan=1.0)


def predictive(
    la: Any, x: Any, link_approx: str, n_samples: int, generator: torch.Generator | None
) -> Tensor | None:
    """The GLM predictive of a `usable` posterior on `x`: `[S, B, C]` sampled softmax outputs
    for "mc" (`la.predictive_samples`'), else `[B, C]` (`la(x, link_approx=...)`'s); None where
    laplace-torch's own path must run (see `glm_predictive_distribution`)."""
    moments = glm_predictive_distribution(la, x)
    if moments is None:
        return None
    if link_approx == "mc":
        from laplace.utils import normal_samples  # laplace-torch is installed: `la` is one

        return torch.softmax(normal_samples(*moments, n_samples, generator), dim=-1)
    return link(*moments, link_approx)


def gridsearch(
    la: Any, batches: Iterable[tuple[Any, Tensor]], link_approx: str, n_samples: int
) -> None:
    """laplace-torch 0.3's `optimize_prior_precision(method="gridsearch")` for a `usable`
    posterior, its predictive computed by `predictive`: the prior precision among 100 values
    from 1e-4 to 1e4 (log-spaced) with the least NLL on `batches`, set on `la`."""
    from torch.linalg import LinAlgError

    la.model.eval()
    results: list[float] = []
    grid = list(torch.logspace(-4, 4, 100, base=10.0))
    # laplace-torch 0.3 scores with one RunningNLLMetric it never resets: the score of a grid
    # value is the NLL summed over it and every value before, over all their points, in float32
    # and in place; kept so, as the prior chosen must be laplace-torch's
    nll, count = torch.tensor(0.0), torch.tensor(0.0)
    for prior in grid:
        la.prior_precision = prior
        try:
            for x, y in batches:  # on the device (`_laplace_torch.Batches.pairs`)
                probs = predictive(la, x, link_approx, n_samples, None)
                if probs is None:
                    probs = la(x, pred_type="glm", link_approx=link_approx, n_samples=n_samples)
                elif link_approx == "mc":
                    probs = probs.mean(dim=0)
                nll += nn.functional.nll_loss(probs.log(), y, reduction="sum").cpu()
                count += y.numel()
            results.append(float(nll / count))
        except LinAlgError:
            results.append(math.inf)
        except RuntimeError as err:
            if "not positive definite" not in str(err):
                raise
            results.append(math.inf)
    la.prior_precision = grid[min(range(len(grid)), key=results.__getitem__)]
