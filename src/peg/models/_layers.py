"""Layer factories, initialisers and argument checks shared by the architectures.

Every model builds its convolutions, linear layers and BatchNorms through `conv`, `linear` and
`batch_norm` below, never through `nn.Conv2d`/`nn.Linear` directly: packed (grouped) variants
of the same classes can then swap these factories for `PackedConv2d`/`PackedLinear` without
touching the layouts.

Inside `_packed.packing(spec)` (a model built with `packed=...`) they do exactly that: `conv` and
`linear` return `PackedConv2d`/`PackedLinear` for Packed-Ensembles-(α, M, γ), `batch_norm` a
BatchNorm over the packed channels (per-channel, hence per-subnetwork). The keyword-only `first`
(the layer reading the plain input), `last` (the head: M·C outputs) and `subgroups` (False: no γ
subgroups in this layer) say where a layer sits; they change nothing in a plain model.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from torch import Tensor, nn

from peg.layers.packed import PackedConv2d, PackedLinear
from peg.models._packed import current


def _gamma(first: bool, last: bool, subgroups: bool) -> int:
    """γ of a packed layer: none on the first layer, the head, or where `subgroups=False`."""
    spec = current()
    assert spec is not None
    return spec.gamma if subgroups and not (first or last) else 1


def conv(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    padding: int = 0,
    bias: bool = False,
    *,
    first: bool = False,
    last: bool = False,
    subgroups: bool = True,
) -> nn.Conv2d:
    """A 2-D convolution `[B, in, H, W] -> [B, out, H', W']` (the one place convs are made).

    Packed (inside `packing`): a `PackedConv2d` over the packed channels; see the module doc.
    """
    spec = current()
    if spec is None:
        return nn.Conv2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=bias
        )
    return PackedConv2d(
        in_channels,
        out_channels,
        kernel_size,
        spec.alpha,
        spec.num_estimators,
        gamma=_gamma(first, last, subgroups),
        first=first,
        last=last,
        stride=stride,
        padding=padding,
        bias=bias,
    )


def conv3x3(
    in_channels: int, out_channels: int, stride: int = 1, bias: bool = False, **where: bool
) -> nn.Conv2d:
    """3×3 convolution with padding 1 (keeps H×W at stride 1, halves it at stride 2)."""
    return conv(in_channels, out_channels, 3, stride=stride, padding=1, bias=bias, **where)


def conv1x1(
    in_channels: int, out_channels: int, stride: int = 1, bias: bool = False, **where: bool
) -> nn.Conv2d:
    """1×1 convolution (projection shortcuts, bottleneck reductions)."""
    return conv(in_channels, out_channels, 1, stride=stride, bias=bias, **where)


def linear(
    in_features: int,
    out_features: int,
    bias: bool = True,
    *,
    first: bool = False,
    last: bool = False,
    subgroups: bool = True,
) -> nn.Linear | PackedLinear:
    """A fully connected layer `[B, in] -> [B, out]` (the one place linear layers are made).

    Packed (inside `packing`): a `PackedLinear` `[B, in_packed] -> [B, out_packed]`.
    """
    spec = current()
    if spec is None:
        return nn.Linear(in_features, out_features, bias=bias)
    return PackedLinear(
        in_features,
        out_features,
        spec.alpha,
        spec.num_estimators,
        gamma=_gamma(first, last, subgroups),
        first=first,
        last=last,
        bias=bias,
    )


def channels(count: int) -> int:
    """The channels a layer of `count` channels really has: packed width inside `packing`."""
    spec = current()
    return count if spec is None else spec.channels(count)


def num_estimators() -> int:
    """Number of subnetworks M being built (1 outside `packing`)."""
    spec = current()
    return 1 if spec is None else spec.num_estimators


def batch_norm(count: int) -> nn.BatchNorm2d:
    """BatchNorm over the channels of `[B, count, H, W]` maps (packed: over the packed ones)."""
    return nn.BatchNorm2d(channels(count))


def dropout(p: float) -> nn.Module:
    """Dropout with probability `p`, or an Identity when `p == 0` (no module to switch off)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


def init_kaiming_fan_out(model: nn.Module, zero_conv_bias: bool = True) -> None:
    """Convs ~ N(0, 2 / (k·k·out_channels)), BatchNorm γ = 1, β = 0; linear layers untouched.

    This is the initialisation of the SWA/SWAG reference VGG and PreResNet
    (`normal_(0, sqrt(2 / n))`, `n = k·k·out_channels`) and of torchvision's ResNets
    (`kaiming_normal_(mode="fan_out", nonlinearity="relu")`): the same distribution.
    Grouped (packed) convs count the fan-out of one group, `k·k·out_channels / groups`, so each
    subnetwork starts as the standalone network of its width would.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and m.groups > 1:
            fan_out = m.weight[0, 0].numel() * m.out_channels // m.groups
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            if m.bias is not None and zero_conv_bias:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None and zero_conv_bias:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def positive_int(value: object, name: str) -> int:
    """`value` as an int if it is an integer >= 1, else ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def probability(value: object, name: str) -> float:
    """`value` as a float if it is a number in [0, 1), else ValueError naming `name`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not 0 <= value < 1
    ):
        raise ValueError(f"{name}: expected a probability in [0, 1), got {value!r}")
    return float(value)


def scaled(channels: int, width: float) -> int:
    """`channels · width`, rounded, at least 1 (the width multiplier of every architecture)."""
    return max(1, round(channels * width))


def positive_number(value: object, name: str) -> float:
    """`value` as a float if it is a finite number > 0, else ValueError naming `name`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    return float(value)


def flag(value: object, name: str) -> bool:
    """`value` if it is a bool, else ValueError naming `name`."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return value


def depth_of(value: object, valid: Callable[[int], bool], allowed: str) -> int:
    """`value` as a network depth if `valid(depth)`, else ValueError describing `allowed`."""
    depth = positive_int(value, "depth")
    if not valid(depth):
        raise ValueError(f"depth: expected {allowed}, got {value!r}")
    return depth


def check_images(x: Tensor, in_channels: int) -> None:
    """ValueError unless `x` is a batch of images `[B, in_channels, H, W]`."""
    if x.ndim != 4 or x.shape[1] != in_channels:
        raise ValueError(f"x: expected images [B, {in_channels}, H, W], got shape {tuple(x.shape)}")
