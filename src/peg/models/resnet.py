"""Post-activation ResNets (He et al. 2016, "Deep residual learning") for 32×32 images.

`CifarResNet`: the paper's CIFAR-10 family (§4.2): depth 6n+2, a 3×3 conv with 16 channels,
three stages of n basic blocks with 16, 32, 64 channels (stride 2 at the start of stages 2
and 3), global average pooling, a linear head. ResNet-20 (n = 3) has 0.27M parameters
(He et al. Table 6) with the paper's identity shortcuts ("option A": stride-2 subsampling and
zero-padded channels); `shortcut="B"` uses 1×1-conv + BN projections instead, as the Keras
"ResNet20v1" of Fort et al. does.

`ResNet`: the ImageNet ResNet-18/34/50/101/152 with the usual CIFAR stem (a 3×3 conv at
stride 1 and no max-pool; e.g. Packed-Ensembles, Laurent et al. 2023): stages of 64, 128,
256, 512 (×4 for bottleneck blocks) channels, projection shortcuts (1×1 conv + BN) where the
shape changes. ResNet-18: 11.17M, ResNet-50: 23.52M parameters for C = 10 (Packed-Ensembles
Table 1).

Initialisation (torchvision's): convs kaiming-normal (fan-out, ReLU gain), BatchNorm γ = 1,
β = 0, linear head PyTorch's default. The pooling is adaptive, so 28×28 inputs work too.

Packed-Ensembles (`packed=(alpha, num_estimators, gamma)`, see `peg.models._packed`): the stem
conv is the full first layer, the head gives M·C logits, γ subgroups apply to every conv but
the first one of each block (Packed-Ensembles appendix B) and option-A shortcuts pad each
subnetwork's channels on their own. Not reproduced: the paper's floor of 64 channels per group
(γ is used as given). ResNet-18 / -50, C = 10: PE-(2, 4, 1) 11.19M / 23.60M, PE-(2, 4, 2)
7.97M / 14.04M parameters (single: 11.17M / 23.52M).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from peg.models import _layers as L
from peg.models._packed import Packable, as_packing, packing

#: ResNet depth -> (block kind, blocks per stage), He et al. Table 1.
STAGES: dict[int, tuple[str, tuple[int, ...]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


def conv_bn(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int,
    first: bool = False,
    subgroups: bool = True,
) -> nn.Sequential:
    """conv (no bias) - BN, padding keeping H×W at stride 1 (`first`, `subgroups`: `_layers`)."""
    return nn.Sequential(
        L.conv(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=kernel_size // 2,
            first=first,
            subgroups=subgroups,
        ),
        L.batch_norm(out_channels),
    )


class PadShortcut(nn.Module):
    """He et al.'s "option A" shortcut: subsample by `stride`, zero-pad the new channels.

    `[B, in_channels, H, W] -> [B, out_channels, H / stride, W / stride]`, no parameters.
    With `groups` > 1 (packed: one group per subnetwork) each group of channels is padded on its
    own, so every subnetwork keeps its own block of channels.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, groups: int = 1) -> None:
        super().__init__()
        self.stride = stride
        self.groups = groups
        extra = (out_channels - in_channels) // groups
        self.pad = (extra // 2, extra - extra // 2)  # split evenly, as in the common port

    def forward(self, x: Tensor) -> Tensor:
        """The subsampled, zero-padded input."""
        x = x[:, :, :: self.stride, :: self.stride]
        if self.groups == 1:
            return F.pad(x, (0, 0, 0, 0, *self.pad))
        x = F.pad(x.unflatten(1, (self.groups, -1)), (0, 0, 0, 0, *self.pad))
        return x.flatten(1, 2)


def shortcut(in_channels: int, out_channels: int, stride: int, kind: str = "B") -> nn.Module:
    """Identity when shapes match, else option A (`PadShortcut`) or B (1×1 conv + BN)."""
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    if kind == "A":
        # Packed: pad the packed widths, member by member.
        return PadShortcut(
            L.channels(in_channels), L.channels(out_channels), stride, L.num_estimators()
        )
    return conv_bn(in_channels, out_channels, 1, stride)


class BasicBlock(nn.Module):
    """conv3×3 - BN - ReLU - conv3×3 - BN, plus the shortcut, then ReLU.

    `[B, in_channels, H, W] -> [B, channels, H / stride, W / stride]`.
    """

    expansion = 1

    def __init__(
        self, in_channels: int, channels: int, stride: int = 1, shortcut_kind: str = "B"
    ) -> None:
        super().__init__()
        self.body = nn.Sequential(
            # Packed-Ensembles (appendix B): no subgroups on the first layer of a block.
            conv_bn(in_channels, channels, 3, stride, subgroups=False),
            nn.ReLU(inplace=True),
            conv_bn(channels, channels, 3, 1),
        )
        self.shortcut = shortcut(in_channels, channels, stride, shortcut_kind)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        """The block's output map."""
        return self.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """conv1×1 - BN - ReLU - conv3×3 (stride) - BN - ReLU - conv1×1 (×4) - BN, + shortcut, ReLU.

    `[B, in_channels, H, W] -> [B, 4·channels, H / stride, W / stride]` (stride on the 3×3
    conv, as in torchvision's "ResNet v1.5").
    """

    expansion = 4

    def __init__(
        self, in_channels: int, channels: int, stride: int = 1, shortcut_kind: str = "B"
    ) -> None:
        super().__init__()
        out_channels = channels * self.expansion
        self.body = nn.Sequential(
            conv_bn(in_channels, channels, 1, 1, subgroups=False),  # as in BasicBlock
            nn.ReLU(inplace=True),
            conv_bn(channels, channels, 3, stride),
            nn.ReLU(inplace=True),
            conv_bn(channels, out_channels, 1, 1),
        )
        self.shortcut = shortcut(in_channels, out_channels, stride, shortcut_kind)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        """The block's output map."""
        return self.relu(self.body(x) + self.shortcut(x))


def make_stage(
    block: type[BasicBlock] | type[Bottleneck],
    in_channels: int,
    channels: int,
    blocks: int,
    stride: int,
    shortcut_kind: str = "B",
) -> tuple[nn.Sequential, int]:
    """`blocks` blocks, the first with `stride`; returns the stage and its output channels."""
    layers = []
    for i in range(blocks):
        layers.append(block(in_channels, channels, stride if i == 0 else 1, shortcut_kind))
        in_channels = channels * block.expansion
    return nn.Sequential(*layers), in_channels


class _ResNetBase(Packable):
    """stem → stages → global average pool → linear head; subclasses build the parts."""

    in_channels: int
    stem: nn.Module
    stages: nn.Sequential
    head: nn.Module

    def forward(self, x: Tensor) -> Tensor:
        """Logits `[B, num_classes]` for images `[B, in_channels, H, W]` (packed: log p̄ with
        `.member_logits` `[M, B, C]`; `member_forward(x)` gives those directly)."""
        L.check_images(x, self.in_channels)
        x = self.stages(self.stem(x))
        return self._output(self.head(F.adaptive_avg_pool2d(x, 1).flatten(1)))


class CifarResNet(_ResNetBase):
    """He et al.'s CIFAR ResNet-(6n+2): ResNet-20, -32, -44, -56, -110.

    Args:
        depth: 6n+2 (ResNet-20: n = 3).
        in_channels: image channels.
        num_classes: number of logits C.
        width: multiplier of the stage widths 16, 32, 64.
        shortcut: "A" (He et al. CIFAR: parameter-free zero-padding) or "B" (1×1 conv + BN
            projections, as Keras' ResNet20v1).
        packed: None, or Packed-Ensembles-(alpha, num_estimators, gamma) as a tuple, a dict or
            a `Packing` (see `peg.models._packed`).

    Input `[B, in_channels, H, W]`; output logits `[B, num_classes]` (packed: log p̄, and
    `member_forward(x)` -> `[M, B, C]`).
    """

    def __init__(
        self,
        depth: int = 20,
        in_channels: int = 3,
        num_classes: int = 10,
        width: float = 1.0,
        shortcut: str = "A",
        packed: object = None,
    ) -> None:
        super().__init__()
        self.packing = as_packing(packed)
        self.depth = L.depth_of(depth, lambda d: d >= 8 and (d - 2) % 6 == 0, "6n+2 (20, 32, 56)")
        self.in_channels = L.positive_int(in_channels, "in_channels")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        width = L.positive_number(width, "width")
        if shortcut not in ("A", "B"):
            raise ValueError(f"shortcut: expected 'A' or 'B', got {shortcut!r}")
        n = (self.depth - 2) // 6
        with packing(self.packing):
            channels = L.scaled(16, width)
            self.stem = nn.Sequential(
                conv_bn(self.in_channels, channels, 3, 1, first=True), nn.ReLU(inplace=True)
            )
            stages = []
            for i, planes in enumerate((16, 32, 64)):
                stage, channels = make_stage(
                    BasicBlock, channels, L.scaled(planes, width), n, 1 if i == 0 else 2, shortcut
                )
                stages.append(stage)
            self.stages = nn.Sequential(*stages)
            self.head = L.linear(channels, self.num_classes, last=True)
        L.init_kaiming_fan_out(self)


class ResNet(_ResNetBase):
    """ResNet-18/34/50/101/152 with a CIFAR stem (3×3 conv, stride 1, no max-pool).

    Args:
        depth: 18, 34 (basic blocks), 50, 101 or 152 (bottleneck blocks).
        in_channels: image channels.
        num_classes: number of logits C.
        width: multiplier of the stage widths 64, 128, 256, 512 (and of the stem).
        packed: None, or Packed-Ensembles-(alpha, num_estimators, gamma) as a tuple, a dict or
            a `Packing` (see `peg.models._packed`).

    Input `[B, in_channels, H, W]`; output logits `[B, num_classes]` (packed: log p̄, and
    `member_forward(x)` -> `[M, B, C]`).
    """

    def __init__(
        self,
        depth: int = 18,
        in_channels: int = 3,
        num_classes: int = 10,
        width: float = 1.0,
        packed: object = None,
    ) -> None:
        super().__init__()
        self.packing = as_packing(packed)
        self.depth = L.depth_of(depth, lambda d: d in STAGES, f"one of {sorted(STAGES)}")
        self.in_channels = L.positive_int(in_channels, "in_channels")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        width = L.positive_number(width, "width")
        kind, counts = STAGES[self.depth]
        block = BasicBlock if kind == "basic" else Bottleneck
        with packing(self.packing):
            channels = L.scaled(64, width)
            self.stem = nn.Sequential(
                conv_bn(self.in_channels, channels, 3, 1, first=True), nn.ReLU(inplace=True)
            )
            stages = []
            for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), counts, strict=True)):
                stage, channels = make_stage(
                    block, channels, L.scaled(planes, width), blocks, 1 if i == 0 else 2
                )
                stages.append(stage)
            self.stages = nn.Sequential(*stages)
            self.head = L.linear(channels, self.num_classes, last=True)
        L.init_kaiming_fan_out(self)
