"""VGG for 32×32 images, as in the SWA/SWAG reference code (`VGG16`, `VGG16BN`).

Source: Izmailov et al. 2018 / Maddox et al. 2019, `swag/models/vgg.py` (ported from
torchvision's VGG, Simonyan & Zisserman 2015); the PEG paper's VGG-16 results use it.

Layout (VGG-16, width w = 1):

    features    [conv3×3(c) (- BN) - ReLU] per number c, max-pool 2×2 per "M" in
                64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512, 512, 512, M
                32×32 → 1×1 after the five pools
    pool        adaptive average pool to 1×1 (identity on 32×32 inputs)
    classifier  Dropout - Linear(512, 512) - ReLU - Dropout - Linear(512, 512) - ReLU
    head        Linear(512, C)

Parameters: 15,245,130 for C = 10 (14,714,688 in the convs, 530,442 in the classifier); the
BN variant adds 2 per conv channel (15,253,578). Convs keep their bias even before BatchNorm,
as in the reference.

Initialisation (reference): convs ~ N(0, 2 / (9·out_channels)) with zero bias; linear layers
and BatchNorm keep PyTorch's defaults.

Max-pools use `ceil_mode=True`, which changes nothing for 32×32 inputs (every map is even) and
lets 28×28 inputs pass all five pools (28 → 14 → 7 → 4 → 2 → 1).
"""

from __future__ import annotations

from torch import Tensor, nn

from peg.models import _layers as L
from peg.models._packed import Packable, as_packing, packing

#: Depth -> layer configuration (channels, or "M" for a 2×2 max-pool), SWA reference `cfg`
#: for 16 and 19, torchvision's for 11 and 13.
CONFIGS: dict[int, tuple[int | str, ...]] = {
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    13: (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (
        64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
        512, 512, 512, 512, "M", 512, 512, 512, 512, "M",
    ),
}  # fmt: skip


def _conv_block(
    in_channels: int, out_channels: int, batch_norm: bool, first: bool = False
) -> list[nn.Module]:
    """conv3×3 (with bias, as in the reference) (- BN) - ReLU (`first`: reads the image)."""
    layers: list[nn.Module] = [L.conv3x3(in_channels, out_channels, bias=True, first=first)]
    if batch_norm:
        layers.append(L.batch_norm(out_channels))
    layers.append(nn.ReLU(inplace=True))
    return layers


class VGG(Packable):
    """VGG-11/13/16/19 (with or without BatchNorm) for CIFAR-sized images.

    Args:
        depth: 11, 13, 16 or 19 (the PEG paper: 16).
        batch_norm: BatchNorm after every conv ("VGG16BN").
        in_channels: image channels.
        num_classes: number of logits C.
        width: multiplier of every conv and hidden-layer width (1: the reference).
        dropout: probability of the two classifier Dropouts (reference: 0.5).
        packed: None, or Packed-Ensembles-(alpha, num_estimators, gamma) as a tuple, a dict or
            a `Packing` (see `peg.models._packed`).

    Input `[B, in_channels, H, W]` (32×32 as in the reference; 28×28 works); output logits
    `[B, num_classes]` (packed: log p̄, and `member_forward(x)` -> `[M, B, C]`).
    """

    def __init__(
        self,
        depth: int = 16,
        batch_norm: bool = False,
        in_channels: int = 3,
        num_classes: int = 10,
        width: float = 1.0,
        dropout: float = 0.5,
        packed: object = None,
    ) -> None:
        super().__init__()
        self.packing = as_packing(packed)
        self.depth = L.depth_of(depth, lambda d: d in CONFIGS, f"one of {sorted(CONFIGS)}")
        self.batch_norm = L.flag(batch_norm, "batch_norm")
        self.in_channels = L.positive_int(in_channels, "in_channels")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        width = L.positive_number(width, "width")
        dropout = L.probability(dropout, "dropout")

        with packing(self.packing):
            layers: list[nn.Module] = []
            channels = self.in_channels
            for item in CONFIGS[self.depth]:
                if item == "M":
                    layers.append(nn.MaxPool2d(2, ceil_mode=True))
                else:
                    first = not layers
                    layers += _conv_block(
                        channels, L.scaled(int(item), width), self.batch_norm, first
                    )
                    channels = L.scaled(int(item), width)
            self.features = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            hidden = L.scaled(512, width)
            self.classifier = nn.Sequential(
                L.dropout(dropout),
                L.linear(channels, hidden),
                nn.ReLU(inplace=True),
                L.dropout(dropout),
                L.linear(hidden, hidden),
                nn.ReLU(inplace=True),
            )
            self.head = L.linear(hidden, self.num_classes, last=True)
        L.init_kaiming_fan_out(self.features)

    def forward(self, x: Tensor) -> Tensor:
        """Logits `[B, num_classes]` for images `[B, in_channels, H, W]`."""
        L.check_images(x, self.in_channels)
        x = self.pool(self.features(x)).flatten(1)  # packed: member blocks stay in order
        return self._output(self.head(self.classifier(x)))
