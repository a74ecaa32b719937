"""Packed-Ensembles layers (Laurent et al. 2023, "Packed-Ensembles for efficient uncertainty
estimation", §3): M subnetworks in one grouped layer, one forward pass for all of them.

A packed layer with expansion α, M estimators and γ subgroups holds the layer j of M
subnetworks side by side. Its channels are laid out member by member: channels
`[m·c, (m+1)·c)` of every map belong to subnetwork m (c = channels per member). The weight is
grouped with `groups = M·γ`, so it is block-diagonal (the paper's mask, Eq. 4): subnetwork m
only ever reads its own channels, and its gradients never reach another subnetwork's block.

Channel counts (`packed_channels`):

- hidden side (`first=False` for inputs, `last=False` for outputs): α·C rounded *up* to a
  multiple of M, i.e. each member gets ⌈α·C / M⌉ channels (α = √M is rarely an integer; rounding
  up never makes a member narrower than asked). γ must then divide the channels per member, else
  ValueError naming `gamma` (the paper: "γ divides αCⱼ for all j"); it is not rounded away, so
  the subgroup structure is always the one asked for.
- `first=True` inputs: the plain input (C channels, not expanded): the first layer is the full
  convolution of Fig. 3c, `groups = 1` (γ does not apply). This equals Fig. 3b (input repeated M
  times, grouped conv): output block m is subnetwork m's first layer applied to the shared input.
- `last=True` outputs: M·C (each member outputs exactly C logits); `rearrange` turns the
  `[B, M·C]` result into `[M, B, C]`.

Parameters of a layer (§3.2): `M · (αCⱼ/M)(αCⱼ₊₁/M) s² / γ` weights (with the rounded widths;
a first layer has `Cⱼ · αCⱼ₊₁ · s²`), plus one bias per output channel, `M · (αCⱼ₊₁/M)`, when
`bias=True`. `PackedLinear` is the same with s = 1.

BatchNorm needs no packed variant: `nn.BatchNorm2d` over the M·c packed channels normalises
each channel on its own, and every channel belongs to exactly one subnetwork, so it is already M
independent BatchNorms of c channels each (same statistics, same affine parameters).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


# ---------------------------------------------------------------- argument checks
def check_alpha(alpha: object) -> float:
    """`alpha` as a float if it is a finite number > 0, else ValueError naming `alpha`."""
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, (int, float, np.integer, np.floating))
        or not math.isfinite(alpha)
        or alpha <= 0
    ):
        raise ValueError(f"alpha: expected a positive number (the width factor), got {alpha!r}")
    return float(alpha)


def check_count(value: object, name: str) -> int:
    """`value` as an int if it is an integer >= 1, else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def packed_channels(channels: int, alpha: float, num_estimators: int) -> int:
    """The packed width of a hidden layer of `channels`: M·⌈α·channels / M⌉ (≥ M).

    Each of the M members gets ⌈α·channels / M⌉ channels; the tiny epsilon keeps α·C that is an
    integer in exact arithmetic (e.g. √4·64) from rounding up because of float error.
    """
    channels = check_count(channels, "channels")
    alpha = check_alpha(alpha)
    num_estimators = check_count(num_estimators, "num_estimators")
    per_member = max(1, math.ceil(alpha * channels / num_estimators - 1e-9))
    return num_estimators * per_member


def _extended(
    in_size: int,
    out_size: int,
    alpha: float,
    num_estimators: int,
    gamma: int,
    first: bool,
    last: bool,
    names: tuple[str, str],
) -> tuple[int, int, int]:
    """(packed inputs, packed outputs, groups) of a packed layer, after checking arguments."""
    in_size = check_count(in_size, names[0])
    out_size = check_count(out_size, names[1])
    alpha = check_alpha(alpha)
    m = check_count(num_estimators, "num_estimators")
    gamma = check_count(gamma, "gamma")
    if not isinstance(first, bool) or not isinstance(last, bool):
        raise ValueError(f"first/last: expected True or False, got {first!r}, {last!r}")
    ext_in = in_size if first else packed_channels(in_size, alpha, m)
    ext_out = m * out_size if last else packed_channels(out_size, alpha, m)
    if first:
        return ext_in, ext_out, 1  # the full convolution of Fig. 3c: no subgroups
    groups = m * gamma
    for side, size in ((names[0], ext_in), (names[1], ext_out)):
        if size % groups:
            raise ValueError(
                f"gamma: {gamma} subgroups do not divide the {size // m} {side} of each of the "
                f"{m} subnetworks (alpha={alpha}); choose gamma dividing it"
            )
    return ext_in, ext_out, groups


# ---------------------------------------------------------------- layers
class PackedLinear(nn.Module):
    """M fully connected subnetworks' layer as one block-diagonal (grouped) matmul.

    Args:
        in_features: input features of the original (single-model) layer.
        out_features: output features of the original layer (classes C for the last layer).
        alpha: width factor α: the packed layer has ≈ α·in_features inputs, α·out_features
            outputs, shared out among the M members (see the module docstring for rounding).
        num_estimators: number of subnetworks M.
        gamma: subgroups γ per subnetwork (groups = M·γ); 1 when `first=True`.
        first: the input is the plain `[B, in_features]` (not packed): a full layer, groups=1.
        last: outputs are the M members' `out_features` each: `[B, M·out_features]`.
        bias: add a learnable bias (one per packed output).

    Input `[..., in_packed]`, output `[..., out_packed]`; `in_packed`/`out_packed` are the
    attributes `in_features`/`out_features`. Initialisation: as `nn.Linear` for each member
    (fan-in = inputs of one group), so each member starts as a standalone layer of its width.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        alpha: float,
        num_estimators: int,
        gamma: int = 1,
        first: bool = False,
        last: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        ext_in, ext_out, groups = _extended(
            in_features,
            out_features,
            alpha,
            num_estimators,
            gamma,
            first,
            last,
            ("in_features", "out_features"),
        )
        self.alpha, self.num_estimators = float(alpha), int(num_estimators)
        self.gamma = 1 if first else int(gamma)
        self.first, self.last = first, last
        self.in_features, self.out_features, self.groups = ext_in, ext_out, groups
        # A grouped 1×1 conv's weight layout: group g owns rows [g·out/G, (g+1)·out/G).
        self.weight = nn.Parameter(torch.empty(ext_out, ext_in // groups))
        self.bias = nn.Parameter(torch.empty(ext_out)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """`nn.Linear`'s initialisation with the fan-in of one group."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.weight.shape[1])
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """`[..., in_features] -> [..., out_features]`, group g reading only its inputs."""
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"x: expected [..., {self.in_features}] packed features, got {tuple(x.shape)}"
            )
        if self.groups == 1:
            return F.linear(x, self.weight, self.bias)
        g = self.groups
        w = self.weight.view(g, self.out_features // g, self.in_features // g)
        out = torch.einsum("...gi,goi->...go", x.unflatten(-1, (g, -1)), w).flatten(-2)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"alpha={self.alpha}, num_estimators={self.num_estimators}, gamma={self.gamma}, "
            f"first={self.first}, last={self.last}, bias={self.bias is not None}"
        )


class PackedConv2d(nn.Conv2d):
    """M convolutional subnetworks' layer as one grouped `nn.Conv2d` (groups = M·γ).

    Args:
        in_channels, out_channels: channels of the original (single-model) convolution.
        kernel_size, stride, padding, dilation, bias: as `nn.Conv2d`.
        alpha, num_estimators, gamma, first, last: as `PackedLinear` (first: the plain image
            `[B, in_channels, H, W]`, full convolution; last: `M·out_channels` outputs).

    Input `[B, in_packed, H, W]`, output `[B, out_packed, H', W']` (`in_channels` /
    `out_channels` attributes hold the packed counts, as for any `nn.Conv2d`). Being an
    `nn.Conv2d`, it is initialised by whatever initialises the model's convs.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        alpha: float,
        num_estimators: int,
        gamma: int = 1,
        first: bool = False,
        last: bool = False,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
    ) -> None:
        ext_in, ext_out, groups = _extended(
            in_channels,
            out_channels,
            alpha,
            num_estimators,
            gamma,
            first,
            last,
            ("in_channels", "out_channels"),
        )
        super().__init__(
            ext_in,
            ext_out,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )
        self.alpha, self.num_estimators = float(alpha), int(num_estimators)
        self.gamma = 1 if first else int(gamma)
        self.first, self.last = first, last

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, alpha={self.alpha}, num_estimators={self.num_estimators}, "
            f"gamma={self.gamma}, first={self.first}, last={self.last}"
        )


# ---------------------------------------------------------------- outputs
def rearrange(x: Tensor, num_estimators: int) -> Tensor:
    """The last layer's `[B, M·C, *rest]` as member outputs `[M, B, C, *rest]`.

    Channel block m (`[m·C, (m+1)·C)`) is subnetwork m's output (einops: "b (m c) -> m b c").
    """
    m = check_count(num_estimators, "num_estimators")
    if x.ndim < 2 or x.shape[1] % m:
        raise ValueError(
            f"x: expected [B, M·C, ...] with M={m} dividing dim 1, got shape {tuple(x.shape)}"
        )
    return x.unflatten(1, (m, -1)).movedim(1, 0)
