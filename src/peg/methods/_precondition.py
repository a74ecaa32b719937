"""Preconditioned PEG steps: each member's gradient row g mapped to λ·(F + λ)⁻¹·g.

Over random mini-batches, plain PEG's steps spread with the covariance of the mini-batch
gradient (≈ F / K): most where the loss is sharpest, the directions a Laplace posterior keeps
narrowest. A preconditioner reshapes the step at no extra forward cost per member:

- "kfac": F ≈ A ⊗ G per Linear / Conv2d layer (Kronecker factors: A the second moment of the
  layer's inputs, with a 1 appended when its bias is perturbed; G that of the per-point
  gradients of the loss with respect to its outputs; Conv2d: inputs unfolded into patches, A
  averaged and G summed over positions, K-FAC's "expand" form). The inverse of A ⊗ G + λI is
  exact through the eigenvectors of A and G (`KFACLayer.apply`).
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

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._params import entry_views
from peg.methods._gradients import GradientPass
from peg.streams import VALIDATION, generator

PRECONDITIONERS = (None, "diag", "kfac")
# λ relative to the mean eigenvalue of F (see the module doc)
DEFAULT_DAMPING = 0.1
Apply = Callable[[Tensor], None]


@dataclass
class KFACLayer:
    """One Linear / Conv2d layer's Kronecker factors and where its entries sit in a row."""

    name: str
    module: nn.Module
    weight: int  # index of the weight among the perturbed entries
    bias: int | None  # index of the bias, if perturbed
    A: Tensor | None = None  # [d_in (+1), d_in (+1)]
    G: Tensor | None = None  # [d_out, d_out]

    def matrix(self, views: list[Tensor]) -> Tensor:
        """The layer's entries of a row as one matrix `[d_out, d_in (+1)]` (a copy)."""
        W = views[self.weight].reshape(views[self.weight].shape[0], -1)
        return W if self.bias is None else torch.cat([W, views[self.bias][:, None]], 1)

    def patches(self, x: Tensor) -> Tensor:
        """The layer's inputs `[B, T, d_in (+1)]` (T positions: conv patches, or sequence)."""
        m = self.module
        if isinstance(m, nn.Conv2d):
            a = F.unfold(x, m.kernel_size, m.dilation, m.padding, m.stride).transpose(1, 2)
        else:
            a = x.reshape(x.shape[0], -1, x.shape[-1])
        if self.bias is not None:
            a = torch.cat([a, a.new_ones(*a.shape[:2], 1)], 2)
        return a

    @staticmethod
    def outputs(g: Tensor, module: nn.Module) -> Tensor:
        """Per-point output gradients `[B, T, d_out]`."""
        if isinstance(module, nn.Conv2d):
            return g.flatten(2).transpose(1, 2)
        return g.reshape(g.shape[0], -1, g.shape[-1])


def kfac_layers(model: nn.Module, names: list[str]) -> list[KFACLayer]:
    """The Linear / Conv2d layers owning the perturbed entries `names`; a clear error naming
    any entry of another layer type (no Kronecker factors for it)."""
    modules = dict(model.named_modules())
    layers: dict[str, KFACLayer] = {}
    biases: dict[str, int] = {}
    for j, name in enumerate(names):
        owner, _, kind = name.rpartition(".")
        m = modules[owner]
        conv_ok = isinstance(m, nn.Conv2d) and m.groups == 1 and m.padding_mode == "zeros"
        if not (isinstance(m, nn.Linear) or conv_ok) or kind not in ("weight", "bias"):
            what = type(m).__name__
            if isinstance(m, nn.Conv2d):
                what += ", grouped or with non-zero padding"
            raise ValueError(
                f"precondition: 'kfac' has Kronecker factors for Linear and Conv2d layers only; "
                f"parameter {name!r} belongs to layer {owner or '(the model)'!r} ({what}); "
                "pass precondition='diag', or params= selecting Linear/Conv2d layers only "
                "(e.g. 'weights' or 'last_layer')"
            )
        if kind == "weight":
            layers[owner] = KFACLayer(owner, m, j, None)
        else:
            biases[owner] = j
    for owner, j in biases.items():
        if owner not in layers:
            raise ValueError(
                f"precondition: 'kfac' needs layer {owner!r}'s weight perturbed with its bias "
                f"({names[j]!r}); select both, or use precondition='diag'"
            )
        layers[owner].bias = j
    return list(layers.values())


@torch.enable_grad()
def _kfac_factors(grad: GradientPass, layers: list[KFACLayer], seed: int, n: int) -> None:
    """Fill each layer's A and G from `n` mini-batches (per-point loss gradients)."""
    seen: dict[str, tuple[Tensor, Tensor]] = {}
    hooks = [
        layer.module.register_forward_hook(
            lambda mod, inp, out, key=layer.name: seen.__setitem__(key, (inp[0].detach(), out))
        )
        for layer in layers
    ]
    sums: dict[str, list[Tensor]] = {}
    rows = points = 0
    try:
        for j in range(n):
            seen.clear()
            losses = grad.losses(generator(seed, VALIDATION, grad.r, j))
            outs = [seen[layer.name][1] for layer in layers]
            gouts = torch.autograd.grad(losses.sum(), outs)  # per point: ∇ of its own loss
            grad.restore_buffers()
            for layer, gout in zip(layers, gouts, strict=True):
                a = layer.patches(seen[layer.name][0]).to(grad.dtype)
                g = KFACLayer.outputs(gout, layer.module).to(grad.dtype)
                a, g = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
                A, G = a.T @ a, g.T @ g
                if layer.name in sums:
                    sums[layer.name][0] += A
                    sums[layer.name][1] += G
                else:
                    sums[layer.name] = [A, G]
            rows += a.shape[0]
            points += len(losses)
    finally:
        for h in hooks:
            h.remove()
    for layer in layers:  # A: mean over points and positions; G: summed over positions
        layer.A, layer.G = sums[layer.name][0] / rows, sums[layer.name][1] / points


def kfac(grad: GradientPass, names: list[str], seed: int, n: int, damping: float) -> Apply:
    """The K-FAC preconditioner of base model `grad.r`: `apply(row)` maps a row `[P]` in place
    to λ·(A ⊗ G + λI)⁻¹ row, layer by layer (every perturbed entry belongs to one)."""
    layers = kfac_layers(grad.work, names)
    _kfac_factors(grad, layers, seed, n)
    trace = sum(float(lay.A.trace() * lay.G.trace()) for lay in layers)  # type: ignore[union-attr]
    size = sum(lay.A.shape[0] * lay.G.shape[0] for lay in layers)  # type: ignore[union-attr]
    lam = damping * trace / size
    if not lam > 0:  # no curvature at all (every gradient zero): nothing to reshape
        return lambda row: None
    eig = []
    for lay in layers:  # eigenvalues ≥ 0 (A, G are second moments; eigh may round below)
        (a, Qa), (g, Qg) = torch.linalg.eigh(lay.A), torch.linalg.eigh(lay.G)  # type: ignore[arg-type]
        eig.append((a.clamp_min(0), Qa, g.clamp_min(0), Qg))

    def apply(row: Tensor) -> None:
        views = entry_views(row, grad.shapes)
        for layer, (a, Qa, g, Qg) in zip(layers, eig, strict=True):
            V = Qg.T @ layer.matrix(views) @ Qa
            V = Qg @ (V * (lam / (g[:, None] * a[None, :] + lam))) @ Qa.T
            W = views[layer.weight]
            d_in = W[0].numel()
            W.copy_(V[:, :d_in].reshape(W.shape))
            if layer.bias is not None:
                views[layer.bias].copy_(V[:, d_in])

    return apply


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
    kind: str, grad: GradientPass, names: list[str], seed: int, n: int, damping: float
) -> Apply:
    """The preconditioner `kind` ("kfac" or "diag") of base model `grad.r`."""
    if kind == "kfac":
        return kfac(grad, names, seed, n, damping)
    return diag(grad, seed, n, damping)
