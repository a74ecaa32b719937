"""K-FAC's layers: which perturbed layer has Kronecker factors (`factor_kind`, `kfac_layers`),
and one layer's factors, its input rows (a convolution's patches, `_patches`) and output
gradients (`KFACLayer`); `peg.methods.perturbation._precondition` estimates the factors from
them and inverts A ⊗ G + λI."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def factor_kind(m: nn.Module) -> str | None:
    """The Kronecker form of layer `m`: "linear", "conv2d", "embedding", "conv1d" (HuggingFace's
    `Conv1D`, y = x W + b with W `[d_in, d_out]`), or None (no factors: diagonal)."""
    if isinstance(m, nn.Linear):
        return "linear"
    if isinstance(m, nn.Conv2d) and m.groups == 1 and m.padding_mode == "zeros":
        return "conv2d"
    if isinstance(m, nn.Embedding) and m.max_norm is None:
        return "embedding"
    weight = getattr(m, "weight", None)
    if type(m).__name__ == "Conv1D" and isinstance(weight, Tensor) and weight.ndim == 2:
        return "conv1d"  # transformers.pytorch_utils.Conv1D, matched by name: no import
    return None


@dataclass
class KFACLayer:
    """One layer's Kronecker factors and where its entries sit in a row."""

    name: str
    module: nn.Module
    kind: str  # factor_kind's
    weight: int  # index of the weight among the perturbed entries
    bias: int | None = None  # index of the bias, if perturbed
    A: Tensor | None = None  # [d_in (+1), d_in (+1)]; Embedding: its diagonal [V]
    # instead of A, where fewer rows than d_in (+1) were seen: the rows R `[r, d_in (+1)]`,
    # scaled so that A = Rᵀ R (rank ≤ r: its eigenvectors come from R Rᵀ, `_input_eig`)
    A_rows: Tensor | None = None
    G: Tensor | None = None  # [d_out, d_out]
    calls: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # (input, output) a pass
    channels_inner: bool | None = None  # a convolution's patch columns (i, j, c): `input_order`

    def matrix(self, views: list[Tensor]) -> Tensor:
        """The layer's entries of a row as one matrix `[d_out, d_in (+1)]` (a copy)."""
        W = views[self.weight]
        W = W.T if self.kind in ("embedding", "conv1d") else W.reshape(W.shape[0], -1)
        return W if self.bias is None else torch.cat([W, views[self.bias][:, None]], 1)

    def write(self, views: list[Tensor], V: Tensor) -> None:
        """`matrix`'s inverse: V `[d_out, d_in (+1)]` back into the row's entries."""
        W = views[self.weight]
        d_in = W.shape[0] if self.kind in ("embedding", "conv1d") else W[0].numel()
        M = V[:, :d_in]
        W.copy_(M.T if self.kind in ("embedding", "conv1d") else M.reshape(W.shape))
        if self.bias is not None:
            views[self.bias].copy_(V[:, d_in])

    def inputs(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """The rows a `[points × positions, d_in (+1)]` of one call's inputs, whose Σ a aᵀ is A
        (for an Embedding the token counts `[V]`, A's diagonal), written in one copy: the
        patches of a convolution (`_patches`) straight into their rows, the bias's 1 beside.
        A convolution's columns come in the order `input_order` maps back to the weight's."""
        m = self.module
        if self.kind == "embedding":
            return torch.bincount(x.reshape(-1), minlength=m.num_embeddings).to(dtype)
        if self.kind == "conv2d" and not isinstance(m.padding, str):
            if self.channels_inner is None:  # fixed by the first call: every row alike
                self.channels_inner = x.is_contiguous(memory_format=torch.channels_last)
            a = _patches(x, m, self.channels_inner)  # [B, H', W', C, kh, kw] or [.., kh, kw, C]
            lead, d = a.shape[:3], math.prod(a.shape[3:])
        elif self.kind == "conv2d":  # padding "same" / "valid": as F.unfold takes it
            a = F.unfold(x, m.kernel_size, m.dilation, m.padding, m.stride).transpose(1, 2)
            lead, d = a.shape[:2], a.shape[2]
        else:
            a, lead, d = x, x.shape[:-1], x.shape[-1]
        out = torch.empty(
            math.prod(lead), d + (self.bias is not None), dtype=dtype, device=x.device
        )
        out[:, :d].view(a.shape).copy_(a)
        if self.bias is not None:
            out[:, d] = 1
        return out

    def input_order(self) -> Tensor | None:
        """The columns of `inputs`' rows in the weight's (c, i, j) order (then the bias's), where
        they came channels inner ((i, j, c): the patches of a channels-last input, copied 7 ×
        faster so); None where they are in it already."""
        if not self.channels_inner:
            return None
        C, (kh, kw) = self.module.in_channels, self.module.kernel_size
        q = torch.arange(C * kh * kw)
        order = (q % (kh * kw)) * C + q // (kh * kw)  # (c, i, j) -> (i·kw + j)·C + c
        return torch.cat([order, torch.tensor([len(q)])]) if self.bias is not None else order

    def outputs(self, g: Tensor, dtype: torch.dtype) -> Tensor:
        """Σ over points and positions of g gᵀ, g the per-point output gradients `[d_out]`."""
        g = g.permute(0, 2, 3, 1) if self.kind == "conv2d" else g  # a view if channels-last
        g = g.reshape(-1, g.shape[-1]).to(dtype)
        return g.T @ g


def _patches(x: Tensor, m: nn.Conv2d, channels_inner: bool) -> Tensor:
    """The patches of `x` `[B, C, H, W]` that `m` sees, a view of the padded input: `[B, H', W',
    C, kh, kw]` (F.unfold's rows, its (c, i, j) order) or, `channels_inner`, `[B, H', W', kh,
    kw, C]` (a channels-last input's own order, whose copy reads runs of C). Without F.unfold's
    `[B, C·kh·kw, L]` layout, whose transpose to rows was a second copy."""
    (ph, pw), (kh, kw), (dh, dw), (sh, sw) = m.padding, m.kernel_size, m.dilation, m.stride
    x = F.pad(x, (pw, pw, ph, ph))
    w = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)[..., ::dh, ::dw]
    return w.permute(0, 2, 3, 4, 5, 1) if channels_inner else w.permute(0, 2, 3, 1, 4, 5)


def kfac_layers(
    model: nn.Module, names: list[str]
) -> tuple[list[KFACLayer], list[int], dict[str, Any]]:
    """(The layers with Kronecker factors owning perturbed entries, the indices of the other
    entries (diagonal), and what got which: {"kfac": {layer: type}, "diagonal": {entry: type of
    its layer}})."""
    modules = dict(model.named_modules())
    layers: dict[str, KFACLayer] = {}
    biases: dict[str, int] = {}
    for j, name in enumerate(names):
        owner, _, attr = name.rpartition(".")
        kind = factor_kind(modules[owner]) if attr in ("weight", "bias") else None
        if kind is not None and attr == "weight":
            layers[owner] = KFACLayer(owner, modules[owner], kind, j)
        elif kind is not None and kind != "embedding":
            biases[owner] = j
    for owner, j in biases.items():
        if owner in layers:
            layers[owner].bias = j
    in_kfac = {lay.weight for lay in layers.values()} | {
        lay.bias for lay in layers.values() if lay.bias is not None
    }
    diagonal = [j for j in range(len(names)) if j not in in_kfac]
    layout = {
        "kfac": {lay.name: type(lay.module).__name__ for lay in layers.values()},
        "diagonal": {
            names[j]: type(modules[names[j].rpartition(".")[0]]).__name__ for j in diagonal
        },
    }
    return list(layers.values()), diagonal, layout
