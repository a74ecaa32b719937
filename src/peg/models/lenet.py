"""LeNet-5 (LeCun et al. 1998) in its common modern form (ReLU, max-pool, full C3 connections).

Layout (28×28 input, width w = 1):

    conv5×5(6, padding 2) - ReLU - max-pool 2×2        28 → 28 → 14
    conv5×5(16)           - ReLU - max-pool 2×2        14 → 10 → 5
    squeeze adaptive average pool to 5×5                (identity for 28×28 inputs)
    Linear(400, 120) - ReLU - Linear(120, 84) - ReLU
    head Linear(84, C)

The padding of 2 reproduces the paper's 32×32 input geometry for 28×28 MNIST digits;
32×32 inputs give 6×6 maps that the adaptive pool squeezes to 5×5. The paper's sigmoid-like
squashing, sub-sampling layers with trainable coefficients, sparse C3 table and RBF output are
not reproduced. 61,706 parameters for C = 10 (the paper: about 60,000). Initialisation:
PyTorch's defaults.
"""

from __future__ import annotations

from torch import Tensor, nn

from peg.models import _layers as L

_SQUEEZE = 5


class LeNet(nn.Module):
    """LeNet-5 for 28×28 (and 32×32) images.

    Args:
        in_channels: image channels (1 for the MNIST family).
        num_classes: number of logits C.
        width: multiplier of every conv and hidden width (6, 16, 120, 84).

    Input `[B, in_channels, H, W]` with H, W >= 12; output logits `[B, num_classes]`.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: float = 1.0) -> None:
        super().__init__()
        self.in_channels = L.positive_int(in_channels, "in_channels")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        width = L.positive_number(width, "width")
        c1, c2, h1, h2 = (L.scaled(c, width) for c in (6, 16, 120, 84))
        self.features = nn.Sequential(
            L.conv(self.in_channels, c1, 5, padding=2, bias=True),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            L.conv(c1, c2, 5, bias=True),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.squeeze = nn.AdaptiveAvgPool2d(_SQUEEZE)
        self.classifier = nn.Sequential(
            L.linear(c2 * _SQUEEZE * _SQUEEZE, h1),
            nn.ReLU(inplace=True),
            L.linear(h1, h2),
            nn.ReLU(inplace=True),
        )
        self.head = L.linear(h2, self.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits `[B, num_classes]` for images `[B, in_channels, H, W]`."""
        L.check_images(x, self.in_channels)
        return self.head(self.classifier(self.squeeze(self.features(x)).flatten(1)))
