"""Preconditioned PEG steps: each member's gradient row g mapped to λ·(F + λ)⁻¹·g.

Over random mini-batches, plain PEG's steps spread with the covariance of the mini-batch
gradient (≈ F / K): most where the loss is sharpest, the directions a Laplace posterior keeps
narrowest. A preconditioner reshapes the step at no extra forward cost per member:

- "kfac": F ≈ A ⊗ G for every layer that has Kronecker factors (A the second moment of the
  layer's inputs, with a 1 appended when its bias is perturbed; G that of the per-point
  gradients of the loss with respect to its outputs): `nn.Linear`, `nn.Conv2d` (inputs
  unfolded into patches, A averaged and G summed over positions, K-FAC's "expand" form),
  `nn.Embedding` (its inputs are one-hot tokens: A is diagonal, the tokens' mean counts) and
  HuggingFace's `Conv1D` (GPT-2's transposed Linear). Every other perturbed parameter
  (BatchNorm / LayerNorm affine, a ViT's class token and position embeddings, a grouped
  convolution, a bias without its weight) gets the diagonal of the per-point Fisher,
  estimated as (Σ_n ∇ℓ_n)² / K on the same mini-batches (exact in expectation when the
  points' gradients are uncorrelated with mean zero). `meta_["curvature"]` records which
  layer got which (`kfac_layers`). The inverse of A ⊗ G + λI is exact through the
  eigenvectors of A and G (`kfac`).
- "diag": F ≈ the mean of the squared mini-batch gradients (Adam's second moment, uniformly
  averaged), one number per entry.

Both are estimated from the `val_batches` mini-batches of the validation part that feeds the
steps (the streams (seed, VALIDATION, r, j), the ones the unbiased variant's ∇L(V) uses).

The damping is relative: λ = `damping` × the mean eigenvalue of F (trace / P), so it does not
depend on the loss's scale or reduction. The row is multiplied by λ, so that as `damping` → ∞,
λ·(F + λ)⁻¹ → I and the members are plain PEG's, with the same η; a small damping shrinks the
steps in the sharp directions and leaves the flat ones as they were. The η search is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from peg._params import entry_views
from peg.methods.perturbation._gradients import GradientPass
from peg.methods.perturbation._kfac_layers import KFACLayer, kfac_layers
from peg.streams import VALIDATION, generator

PRECONDITIONERS = (None, "diag", "kfac")
# λ relative to the mean eigenvalue of F (see the module doc)
DEFAULT_DAMPING = 0.1
Apply = Callable[[Tensor], None]


@torch.enable_grad()
def _kfac_factors(
    grad: GradientPass,
    layers: list[KFACLayer],
    diagonal: list[int],
    seed: int,
    n: int,
    keep_rows: bool = True,
) -> Tensor:
    """Fill each layer's A and G from `n` mini-batches (per-point loss gradients); returns the
    diagonal Fisher of the entries `diagonal`, flattened in row order."""

    def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Any, layer: KFACLayer) -> None:
        x = args[0] if args else next(iter(kwargs.values()))
        layer.calls.append((x.detach(), out))

    hooks = [
        layer.module.register_forward_hook(
            lambda m, a, k, o, lay=layer: hook(m, a, k, o, lay), with_kwargs=True
        )
        for layer in layers
    ]
    moments = {lay.name: InputMoment(keep_rows) for lay in layers}
    sums: dict[str, Tensor] = {}  # Σ g gᵀ
    extra = [grad.selected[j] for j in diagonal]
    fisher = [torch.zeros_like(p, dtype=grad.dtype) for p in extra]
    points = 0
    try:
        for j in range(n):
            for layer in layers:
                layer.calls.clear()
            losses = grad.losses(generator(seed, VALIDATION, grad.r, j))
            outs = [o for layer in layers for _, o in layer.calls]
            # per point: ∇ of its own loss (outputs); Σ_n ∇ℓ_n for the diagonal entries
            grads = torch.autograd.grad(losses.sum(), outs + extra, allow_unused=True)
            grad.restore_buffers()
            at = 0
            for layer in layers:
                for x, out in layer.calls:
                    gout = grads[at] if grads[at] is not None else torch.zeros_like(out)
                    at += 1
                    moments[layer.name].add(layer.inputs(x, grad.dtype), layer.kind)
                    G = layer.outputs(gout, grad.dtype)
                    sums.setdefault(layer.name, torch.zeros_like(G)).add_(G)
            for f, g in zip(fisher, grads[at:], strict=True):
                if g is not None:
                    f += g.to(grad.dtype).square() / len(losses)
            points += len(losses)
    finally:
        for h in hooks:
            h.remove()
    for layer in layers:  # A: mean over points and positions; G: summed over positions
        layer.calls.clear()
        if layer.name not in sums:
            raise ValueError(
                f"precondition: layer {layer.name!r} did not run in the model's forward pass; "
                "select the parameters the model uses (params=)"
            )
        layer.A, layer.A_rows = moments[layer.name].mean()
        order = layer.input_order()
        if order is not None:  # back to the weight's column order
            order = order.to(grad.device)
            if layer.A is not None:
                layer.A = layer.A[order][:, order]
            else:
                layer.A_rows = _factor(layer.A_rows, layer)[:, order]
        layer.G = sums[layer.name] / points
    flat = [f.reshape(-1) / n for f in fisher]
    return torch.cat(flat) if flat else torch.zeros(0, dtype=grad.dtype, device=grad.device)


@dataclass
class InputMoment:
    """Σ a aᵀ over a layer's input rows a `[d]`, and how many rows. While the rows are fewer
    than d, they are kept instead of summed: A then has rank < d, and its eigenvectors come
    from the rows' r × r Gram matrix (`_input_eig`) instead of a d × d eigendecomposition,
    which dominates K-FAC PEG's fit on a wide Linear (a CNN's classifier on 3,136 features sees
    the 1,280 points of 10 mini-batches of 128). Once they are not, the sum is taken in the
    order the rows came, as it always was."""

    keep_rows: bool = True  # False: always summed (recipes of version < 4 were made so)
    rows: list[Tensor] = field(default_factory=list)
    total: Tensor | None = None
    count: int = 0

    def add(self, a: Tensor, kind: str) -> None:
        """Rows `a` `[r, d]` (an Embedding's token counts `[V]`: summed, counted by tokens)."""
        if kind == "embedding":
            self.count += int(a.double().sum())  # exact: the counts are integers
            self.total = a.clone() if self.total is None else self.total.add_(a)
            return
        self.count += a.shape[0]
        if self.keep_rows and self.total is None and self.count < a.shape[1]:
            self.rows.append(a)
            return
        if self.total is None:
            self.total = a.new_zeros(a.shape[1], a.shape[1])
            for kept in self.rows:
                self.total += kept.T @ kept
            self.rows = []
        self.total += a.T @ a

    def mean(self) -> tuple[Tensor | None, Tensor | None]:
        """(A = the mean of a aᵀ, None) or, rows kept, (None, R) with Rᵀ R = A: each distinct
        row once, times √(its count) (k equal rows a add k·a aᵀ). The mini-batches are drawn
        independently, so in eval mode a point drawn by several of them gives equal rows: 10 of
        128 from 2,000 points are ~985 distinct, and the Gram matrix and eigendecomposition of
        `_input_eig` cost ~(985/1,280)² and ³ of theirs on all 1,280."""
        if self.total is not None:
            return self.total / max(self.count, 1), None
        R = torch.cat(self.rows)
        if R.device.type != "mps":  # (unique over rows may not run there: merging only saves)
            R, counts = torch.unique(R, dim=0, return_counts=True)
            R = R * counts.to(R.dtype).sqrt()[:, None]
        return None, R / math.sqrt(max(self.count, 1))


def _input_eig(lay: KFACLayer) -> tuple[Tensor, Tensor, bool]:
    """(eigenvalues ≥ 0 `[k]`, eigenvectors `[d, k]`, whether they span only A's range) of a
    layer's A: all d from A, or from R (Rᵀ R = A, r < d rows): R Rᵀ = U diag(s) Uᵀ gives A's
    nonzero eigenpairs s, Rᵀ U / √s. The eigenvalues below rounding are left out: the map is
    the identity on A's null space (λ / (g·0 + λ) = 1), so they need no vectors."""
    if lay.A_rows is None:
        a, Qa = torch.linalg.eigh(_factor(lay.A, lay))
        return a.clamp_min(0), Qa, False
    # in float64 (MPS has none): R Rᵀ squares R's condition number, and in float32 the vectors
    # of the smaller kept eigenvalues come out wrong by up to half a row's norm (measured on
    # small CNNs: docs/performance.md, "K-FAC's input factors from their rows"). Nor can the
    # small eigenvalues be left out (a truncated eigendecomposition): there, with the damping's
    # λ, even A's smallest kept one has g·a / (g·a + λ) = 0.05-0.3 for the largest g: every
    # direction of A's range matters.
    R = lay.A_rows
    R = R.double() if R.device.type != "mps" else R
    s, U = torch.linalg.eigh(R @ R.T)
    keep = s > s.max().clamp_min(0) * len(s) * torch.finfo(s.dtype).eps
    s, U = s[keep], U[:, keep]
    dtype = lay.A_rows.dtype
    return s.to(dtype), ((R.T @ U) / s.sqrt()).to(dtype), True


def _factor(t: Tensor | None, lay: KFACLayer) -> Tensor:
    """A factor `_kfac_factors` has filled."""
    if t is None:
        raise RuntimeError(f"K-FAC: layer {lay.name!r} has no factors")  # a bug, not input
    return t


def _input_dim(lay: KFACLayer) -> int:
    """d_in (+1): A's side (an Embedding's: its vocabulary)."""
    return int(lay.A_rows.shape[1] if lay.A_rows is not None else _factor(lay.A, lay).shape[0])


def _input_trace(lay: KFACLayer) -> float:
    """tr A (an Embedding's: the sum of its diagonal; kept rows: ‖R‖²)."""
    if lay.A_rows is not None:
        return float(lay.A_rows.square().sum())
    A = _factor(lay.A, lay)
    return float(A.sum() if lay.kind == "embedding" else A.trace())


def kfac(
    grad: GradientPass,
    names: list[str],
    seed: int,
    n: int,
    damping: float,
    keep_rows: bool = True,
) -> tuple[Apply, dict[str, Any]]:
    """The K-FAC preconditioner of base model `grad.r`: `apply(row)` maps a row `[P]` in place
    to λ·(F + λI)⁻¹ row, F = A ⊗ G layer by layer where factors exist and diagonal elsewhere;
    with the layout (`kfac_layers`)."""
    layers, diagonal, layout = kfac_layers(grad.work, names)
    Fd = _kfac_factors(grad, layers, diagonal, seed, n, keep_rows)
    trace = float(Fd.sum()) + sum(
        _input_trace(lay) * float(_factor(lay.G, lay).trace()) for lay in layers
    )
    size = Fd.numel() + sum(_input_dim(lay) * _factor(lay.G, lay).shape[0] for lay in layers)
    lam = damping * trace / size
    if not lam > 0:  # no curvature at all (every gradient zero): nothing to reshape
        return (lambda row: None), layout
    eig: list[tuple[Tensor, Tensor | None, Tensor, Tensor, bool]] = []
    for lay in layers:  # eigenvalues ≥ 0 (second moments; eigh may round below)
        g, Qg = torch.linalg.eigh(_factor(lay.G, lay))
        if lay.kind == "embedding":  # A diagonal: its own eigenvalues, eigenvectors I
            eig.append((_factor(lay.A, lay).clamp_min(0), None, g.clamp_min(0), Qg, False))
        else:
            a, Qa, in_range = _input_eig(lay)
            eig.append((a, Qa, g.clamp_min(0), Qg, in_range))
    scale = lam / (Fd + lam)

    def apply(row: Tensor) -> None:
        views = entry_views(row, grad.shapes)
        for layer, (a, Qa, g, Qg, in_range) in zip(layers, eig, strict=True):
            M = layer.matrix(views)
            V = Qg.T @ (M if Qa is None else M @ Qa)
            if in_range:  # Qa spans A's range only: M moves there, by V ∘ (λ/(g a + λ) − 1)
                V = V * (-(g[:, None] * a[None, :]) / (g[:, None] * a[None, :] + lam))
                layer.write(views, M + Qg @ V @ Qa.T)
                continue
            V = V * (lam / (g[:, None] * a[None, :] + lam))
            layer.write(views, Qg @ (V if Qa is None else V @ Qa.T))
        if diagonal:
            at = 0
            for j in diagonal:
                size = views[j].numel()
                views[j].mul_(scale[at : at + size].view_as(views[j]))
                at += size

    return apply, layout


def diag(grad: GradientPass, seed: int, n: int, damping: float) -> Apply:
    """The diagonal preconditioner: F the mean squared mini-batch gradient `[P]`."""
    Fd = grad.empty().zero_()
    for j in range(n):
        Fd += grad(generator(seed, VALIDATION, grad.r, j), f"curvature batch {j}").square_() / n
    lam = damping * float(Fd.mean())
    if not lam > 0:
        return lambda row: None
    scale = lam / (Fd + lam)

    def apply(row: Tensor) -> None:
        row.mul_(scale)

    return apply


def preconditioner(
    kind: str,
    grad: GradientPass,
    names: list[str],
    seed: int,
    n: int,
    damping: float,
    keep_rows: bool = True,
) -> tuple[Apply, dict[str, Any] | None]:
    """The preconditioner `kind` ("kfac" or "diag") of base model `grad.r`, and (K-FAC) which
    layer got Kronecker factors and which entries the diagonal (`kfac_layers`). `keep_rows`:
    K-FAC's input factors from their rows where they are fewer than the inputs (`InputMoment`);
    False for recipes of version < 4, whose members were made from the summed factors."""
    if kind == "kfac":
        return kfac(grad, names, seed, n, damping, keep_rows)
    return diag(grad, seed, n, damping), None
