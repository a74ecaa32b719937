"""Pre-activation ResNets (He et al. 2016, "Identity mappings") as in the SWA/SWAG reference.

Source: Maddox et al. 2019, `swag/models/preresnet.py` (ported from bearpaw's
pytorch-classification); the PEG paper's PreResNet-164 results use it.

Layout (width w = 1, expansion e = 1 for basic, 4 for bottleneck blocks):

    stem    conv3×3(16), no BN/ReLU (the first block pre-activates it)
    stages  n blocks each at 16, 32, 64 channels (output 16e, 32e, 64e), stride 2 at the
            start of stages 2 and 3
    final   BN - ReLU - global average pool
    head    Linear(64e, C)

    basic block       BN-ReLU-conv3×3(stride) - BN-ReLU-conv3×3                 depth 6n+2
    bottleneck block  BN-ReLU-conv1×1 - BN-ReLU-conv3×3(stride) - BN-ReLU-conv1×1(4×)  9n+2

The shortcut is the identity, or a 1×1 conv (no BN, stride) on the block's *input* when the
shape changes, as in the reference. The reference picks the block from the depth: bottleneck
for depth >= 44 (PreResNet-56, -110, -164), basic below (PreResNet-20); `block=` overrides it
(He et al.'s basic-block PreResNet-110 is `PreResNet(110, block="basic")`).

Parameters for C = 10: PreResNet-164 1,703,258 (He et al. 2016b Table 3: 1.7M); PreResNet-20
272,282 (0.27M).

Initialisation (reference): convs ~ N(0, 2 / (k·k·out_channels)), BatchNorm γ = 1, β = 0,
linear head PyTorch's default. The pooling is adaptive, so 28×28 inputs work too.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from peg.models import _layers as L

#: Depth at which the reference switches from basic to bottleneck blocks.
BOTTLENECK_FROM_DEPTH = 44


def bn_relu(channels: int) -> nn.Sequential:
    """The pre-activation BN - ReLU."""
    return nn.Sequential(L.batch_norm(channels), nn.ReLU(inplace=True))


def projection(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    """Identity, or the reference's 1×1 conv (no BN) where the shape changes."""
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return L.conv1x1(in_channels, out_channels, stride)


class PreBasicBlock(nn.Module):
    """BN-ReLU-conv3×3(stride) - BN-ReLU-conv3×3, plus the shortcut of the raw input.

    `[B, in_channels, H, W] -> [B, channels, H / stride, W / stride]`.
    """

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            bn_relu(in_channels),
            L.conv3x3(in_channels, channels, stride),
            bn_relu(channels),
            L.conv3x3(channels, channels),
        )
        self.shortcut = projection(in_channels, channels, stride)

    def forward(self, x: Tensor) -> Tensor:
        """The block's (not activated) output map."""
        return self.body(x) + self.shortcut(x)


class PreBottleneck(nn.Module):
    """BN-ReLU-conv1×1 - BN-ReLU-conv3×3(stride) - BN-ReLU-conv1×1(4×), plus the shortcut.

    `[B, in_channels, H, W] -> [B, 4·channels, H / stride, W / stride]`.
    """

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = channels * self.expansion
        self.body = nn.Sequential(
            bn_relu(in_channels),
            L.conv1x1(in_channels, channels),
            bn_relu(channels),
            L.conv3x3(channels, channels, stride),
            bn_relu(channels),
            L.conv1x1(channels, out_channels),
        )
        self.shortcut = projection(in_channels, out_channels, stride)

    def forward(self, x: Tensor) -> Tensor:
        """The block's (not activated) output map."""
        return self.body(x) + self.shortcut(x)


def _block_and_count(depth: object, block: str) -> tuple[int, type[nn.Module], int]:
    """(depth, block class, blocks per stage) for `depth` and `block` ("auto" = reference)."""
    if block not in ("auto", "basic", "bottleneck"):
        raise ValueError(f"block: expected 'auto', 'basic' or 'bottleneck', got {block!r}")
    d = L.positive_int(depth, "depth")
    kind = block if block != "auto" else "bottleneck" if d >= BOTTLENECK_FROM_DEPTH else "basic"
    note = f" (block='auto': bottleneck from depth {BOTTLENECK_FROM_DEPTH})" * (block == "auto")
    if kind == "bottleneck":
        allowed = f"9n+2 for bottleneck blocks, e.g. 56, 110, 164{note}"
        d = L.depth_of(depth, lambda v: v >= 11 and (v - 2) % 9 == 0, allowed)
        return d, PreBottleneck, (d - 2) // 9
    allowed = f"6n+2 for basic blocks, e.g. 20, 32{note}"
    d = L.depth_of(depth, lambda v: v >= 8 and (v - 2) % 6 == 0, allowed)
    return d, PreBasicBlock, (d - 2) // 6


class PreResNet(nn.Module):
    """Pre-activation ResNet for CIFAR-sized images (SWA/SWAG reference `PreResNet`).

    Args:
        depth: 9n+2 with bottleneck blocks (164: n = 18), 6n+2 with basic blocks (20: n = 3).
        in_channels: image channels.
        num_classes: number of logits C.
        width: multiplier of the stage widths 16, 32, 64.
        block: "auto" (the reference: bottleneck from depth 44 on, basic below), "basic" or
            "bottleneck".

    Input `[B, in_channels, H, W]`; output logits `[B, num_classes]`.
    """

    def __init__(
        self,
        depth: int = 164,
        in_channels: int = 3,
        num_classes: int = 10,
        width: float = 1.0,
        block: str = "auto",
    ) -> None:
        super().__init__()
        self.depth, block_cls, n = _block_and_count(depth, block)
        self.in_channels = L.positive_int(in_channels, "in_channels")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        width = L.positive_number(width, "width")
        channels = L.scaled(16, width)
        self.stem = L.conv3x3(self.in_channels, channels)
        stages = []
        for i, planes in enumerate((16, 32, 64)):
            blocks = []
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(block_cls(channels, L.scaled(planes, width), stride))
                channels = L.scaled(planes, width) * block_cls.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.final = bn_relu(channels)
        self.head = L.linear(channels, self.num_classes)
        L.init_kaiming_fan_out(self)

    def forward(self, x: Tensor) -> Tensor:
        """Logits `[B, num_classes]` for images `[B, in_channels, H, W]`."""
        L.check_images(x, self.in_channels)
        x = self.final(self.stages(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))
