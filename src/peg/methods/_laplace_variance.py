"""laplace-torch's GLM predictive for a last-layer KFAC posterior, evaluated through the
Kronecker structure instead of materialised Jacobians.

laplace-torch 0.3 (`KronLLLaplace._glm_predictive_distribution`) forms the last layer's
Jacobians `Js [B, C, P]` (P = C·D + C: weight, then bias, as `parameters_to_vector` orders a
`nn.Linear`'s parameters) and takes `posterior_precision.inv_square_form(Js)`, which multiplies
every one of the B·C rows by the inverse KFAC precision: O(B·C·P·D) (13.8 ms per image for
SmallCNN's Linear(1568 → 10) at one thread, ~500 × its forward pass: benchmarks/laplace_predict.py).
This module computes the same `[B, C, C]`
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

ψ costs D² per point, s C·D, the sum C³: no `[B, C, P]` tensor. Anything else (another
structure, a layout other than that, features that are not `[B, D]`, a joint covariance) goes
to laplace-torch's own code.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

_PATCHED = "_glm_predictive_distribution"


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


def glm_predictive_distribution(
    la: Any,
    X: Tensor | MutableMapping[str, Any],
    joint: bool = False,
    diagonal_output: bool = False,
) -> tuple[Tensor, Tensor]:
    """laplace-torch's `LLLaplace._glm_predictive_distribution(X, joint, diagonal_output)`:
    the logits `f_mu [B, C]` and their covariance `[B, C, C]` (`[B, C]` with
    `diagonal_output`), the covariance by `kron_functional_variance`. A joint covariance, or
    features that are not `[B, D]`, go to laplace-torch's own method."""
    own = partial(type(la)._glm_predictive_distribution, la, X)
    if joint:
        return own(joint=joint, diagonal_output=diagonal_output)
    layer = _layer(la)
    assert layer is not None  # `kronecker` installs this only where `supported`
    with torch.set_grad_enabled(torch.is_grad_enabled() and bool(la.enable_backprop)):
        f_mu, phi = la.model.forward_with_features(X)
        C, D = layer.out_features, layer.in_features
        if f_mu.ndim != 2 or phi.ndim != 2 or f_mu.shape[1] != C or phi.shape[1] != D:
            return own(joint=joint, diagonal_output=diagonal_output)  # e.g. 3-d features
        f_var = kron_functional_variance(la.posterior_precision, phi, layer.bias is not None)
    if diagonal_output:
        f_var = f_var.diagonal(dim1=-2, dim2=-1)
    return (f_mu, f_var) if la.enable_backprop else (f_mu.detach(), f_var.detach())


@contextmanager
def kronecker(la: Any) -> Iterator[bool]:
    """While open, `la`'s GLM predictive distribution is `glm_predictive_distribution` where
    `supported(la)` (yields whether it is); laplace-torch's own code otherwise.

    laplace-torch applies its link approximations (probit, bridge, MC samples) inside
    `__call__` / `predictive_samples` right after its one call to
    `self._glm_predictive_distribution(x, ...)`, the step that forms the Jacobians: that one
    step is replaced on this instance (an attribute, removed on exit), so everything else,
    links and sampling included, stays laplace-torch's."""
    if not supported(la):
        yield False
        return
    setattr(la, _PATCHED, partial(glm_predictive_distribution, la))
    try:
        yield True
    finally:
        la.__dict__.pop(_PATCHED, None)
