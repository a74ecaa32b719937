"""Wide residual networks (Zagoruyko & Komodakis 2016), WRN-d-k for 32×32 images.

Layout (depth d = 6n+4, widen factor k):

    stem    conv3×3(16)
    stages  n blocks each at 16k, 32k, 64k channels, stride 2 at the start of stages 2 and 3
    final   BN - ReLU - global average pool
    head    Linear(64k, C)

    block   BN-ReLU (= a) - conv3×3(stride) - BN-ReLU - Dropout - conv3×3, plus the identity,
            or a 1×1 conv (stride) of a where the shape changes

as in the authors' PyTorch code (convs without bias; dropout between the two convs, p = 0.3 in
the paper's dropout runs, 0 by default here and in the SWA/SWAG WideResNet28x10 the PEG paper
uses). WRN-28-10: 36,479,194 parameters for C = 10 (Zagoruyko & Komodakis Table 1: 36.5M).

Initialisation (authors' code): convs and the head kaiming-normal (fan-in, ReLU gain), head
bias 0, BatchNorm γ = 1, β = 0. The pooling is adaptive, so 28×28 inputs work too.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from peg.models import _layers as L


class WideBlock(nn.Module):
    """Pre-activation block with two 3×3 convs and dropout between them.

    `[B, in_channels, H, W] -> [B, channels, H / stride, W / stride]`.
    """

    def __init__(self, in_channels: int, channels: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.pre = nn.Sequential(L.batch_norm(in_channels), nn.ReLU(inplace=True))
        self.body = nn.Sequential(
            L.conv3x3(in_channels, channels, stride),
            L.batch_norm(channels),
            nn.ReLU(inplace=True),
            L.dropout(dropout),
            L.conv3x3(channels, channels),
        )
        # Where the shape changes the shortcut sees the activated input, as in the authors' code.
        self.projection = (
            L.conv1x1(in_channels, channels, stride)
            if stride != 1 or in_channels != channels
            else None
        )

    def forward(self, x: Tensor) -> Tensor:
        """The block's (not activated) output map."""
        a = self.pre(x)
        return self.body(a) + (x if self.projection is None else self.projection(a))


class WideResNet(nn.Module):
    """WRN-depth-widen_factor for CIFAR-sized images.

    Args:
        depth: 6n+4 (28: n = 4 blocks per stage).
        widen_factor: k, multiplier of the stage widths 16, 32, 64 (the stem keeps 16).
        in_channels: image channels.
        num_classes: number of logits C.
        dropout: dropout probability inside every block (0 adds no Dropout layers).

    Input `[B, in_channels, H, W]`; output logits `[B, num_classes]`.
    """

    def __init__(
        self,
        depth: int = 28,
        widen_factor: float = 10,
        in_channels: int = 3,
        num_classes: int = 10,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.depth = L.depth_of(depth, lambda d: d >= 10 and (d - 4) % 6 == 0, "6n+4 (16, 28, 40)")
        self.widen_factor = L.positive_number(widen_factor, "widen_factor")
        self.in_channels = L.positive_int(in_channels, "in_channels")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        dropout = L.probability(dropout, "dropout")
        n = (self.depth - 4) // 6
        channels = 16
        self.stem = L.conv3x3(self.in_channels, channels)
        stages = []
        for i, planes in enumerate((16, 32, 64)):
            width = L.scaled(planes, self.widen_factor)
            blocks = []
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(WideBlock(channels, width, stride, dropout))
                channels = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.final = nn.Sequential(L.batch_norm(channels), nn.ReLU(inplace=True))
        self.head = L.linear(channels, self.num_classes)
        self._init()

    def _init(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Logits `[B, num_classes]` for images `[B, in_channels, H, W]`."""
        L.check_images(x, self.in_channels)
        x = self.final(self.stages(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))
