"""A small, fast CNN for 28×28 images (Fashion-MNIST, MNIST) that also runs on 8×8 and 32×32.

Layout (28×28 input, width w):

    stem   conv3×3(w, stride 2) - BN - ReLU      28 → 14
    pool   max-pool 2×2                          14 → 7   (only where the map is >= 8 wide)
    block  conv3×3(2w) - BN - ReLU               7 × 7
    squeeze adaptive average pool to 7×7         (skipped for 28×28 inputs: already 7×7)
    dropout, linear(2w·49 → C)

The stride-2 stem keeps every activation map small: a forward pass over 10,000 Fashion-MNIST
images takes a few tenths of a second on two CPU cores, against about three seconds for the
textbook conv-pool-conv-pool layout at full resolution, at the same test accuracy in a short
training run (~87% after 3 epochs on 20k images). `stem_stride=1` gives that textbook layout.

`SmallCNN` is this library's own fast model, *not* the SmallCNN of Fort et al. 2019 ("Deep
ensembles: a loss landscape perspective"); that one and its MediumCNN are `LandscapeCNN` and
`MediumCNN` below.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from peg.models import _layers as L
from peg.models._packed import Packable, as_packing, packing

_SQUEEZE = 7


class SmallCNN(Packable):
    """Two conv blocks and a linear classifier; see the module docstring for the layout.

    Args:
        in_channels: image channels (1 for the MNIST family, 3 for CIFAR-style images).
        num_classes: number of logits C.
        width: channels of the first conv (the second has 2·width).
        batch_norm: BatchNorm after each conv (convs then have no bias); False: convs with
            bias and no normalisation.
        dropout: dropout probability before the classifier (0 adds no Dropout layer).
        stem_stride: stride of the first conv (2: fast; 1: full-resolution first layer).
        packed: None, or Packed-Ensembles-(alpha, num_estimators, gamma) (see
            `peg.models._packed`): the stem reads the plain input (Fig. 3c), every later layer
            is grouped per member, and `forward` returns log p̄ (`member_forward`: `[M, B, C]`).

    Input `[B, in_channels, H, W]`, any H, W >= 1 (28×28, 32×32 and 8×8 all work); output
    logits `[B, num_classes]`. The 2×2 max-pool is applied only when the map after the stem
    is at least 8 pixels high and wide, so small inputs (8×8 digits → 4×4) are not pooled away.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        width: int = 32,
        batch_norm: bool = True,
        dropout: float = 0.0,
        stem_stride: int = 2,
        packed: object = None,
    ) -> None:
        super().__init__()
        self.packing = as_packing(packed)
        self.in_channels = L.positive_int(in_channels, "in_channels")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        width = L.positive_int(width, "width")
        dropout = L.probability(dropout, "dropout")
        if stem_stride not in (1, 2) or isinstance(stem_stride, bool):
            raise ValueError(f"stem_stride: expected 1 or 2, got {stem_stride!r}")
        if not isinstance(batch_norm, bool):
            raise ValueError(f"batch_norm: expected True or False, got {batch_norm!r}")

        def conv_bn_relu(cin: int, cout: int, stride: int, first: bool) -> nn.Sequential:
            conv = L.conv(cin, cout, 3, stride, 1, bias=not batch_norm, first=first)
            layers: list[nn.Module] = [conv]
            if batch_norm:
                layers.append(L.batch_norm(cout))
            layers.append(nn.ReLU(inplace=True))
            return nn.Sequential(*layers)

        with packing(self.packing):
            self.stem = conv_bn_relu(self.in_channels, width, stem_stride, first=True)
            self.pool = nn.MaxPool2d(2)
            self.block = conv_bn_relu(width, 2 * width, 1, first=False)
            self.squeeze = nn.AdaptiveAvgPool2d(_SQUEEZE)
            self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            # flattening keeps each member's channels contiguous, so a grouped head sees
            # exactly its own member's features
            self.classifier = L.linear(2 * width * _SQUEEZE * _SQUEEZE, self.num_classes, last=True)

    def forward(self, x: Tensor) -> Tensor:
        """Logits `[B, num_classes]` for images `[B, in_channels, H, W]`."""
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"x: expected images [B, {self.in_channels}, H, W], got shape {tuple(x.shape)}"
            )
        x = self.stem(x)
        if min(x.shape[-2:]) >= 8:
            x = self.pool(x)
        x = self.block(x)
        if tuple(x.shape[-2:]) != (_SQUEEZE, _SQUEEZE):  # 28×28 inputs skip the (identity) pool
            x = self.squeeze(x)
        return self._output(self.classifier(self.dropout(x.flatten(1))))


class LandscapeCNN(nn.Module):
    """The plain CNNs of Fort et al. 2019 (§3): SmallCNN and (as `MediumCNN`) MediumCNN.

    The paper gives only the channels (SmallCNN [16, 32, 32], MediumCNN [64, 128, 256, 256])
    and dropout 0.1; the layers follow the SmallCNN of the reproduction in
    `papers/loss-landscape-report.txt` (Keras code; its MediumCNN uses other channels),
    applied to either channel list:

        per channel count c   conv3×3(c, same padding, bias) (- BN) - ReLU - max-pool 2×2
        pool                  global average pool
        classifier            Linear(c_last, hidden) - ReLU - Dropout(0.1)
        head                  Linear(hidden, C)

    Initialisation: Keras' defaults, as in the reproduction: Glorot-uniform weights, zero
    biases. Max-pools use `ceil_mode=True` so 28×28 (and smaller) inputs never pool to 0×0.

    Args:
        in_channels: image channels (3 for CIFAR-10 as in the paper, 1 for the MNIST family).
        num_classes: number of logits C.
        channels: conv widths, one conv per entry (SmallCNN: (16, 32, 32)).
        hidden: width of the hidden dense layer (None: the last conv width, 32 for SmallCNN as
            in the reproduction).
        dropout: dropout probability after the hidden dense layer (paper: 0.1).
        batch_norm: BatchNorm after every conv (not in the paper).
        width: multiplier of every conv width and of `hidden`.

    Input `[B, in_channels, H, W]`; output logits `[B, num_classes]`. 15,722 parameters for
    SmallCNN and 1,029,258 for MediumCNN on CIFAR-10.
    """

    default_channels: tuple[int, ...] = (16, 32, 32)

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        channels: Sequence[int] | None = None,
        hidden: int | None = None,
        dropout: float = 0.1,
        batch_norm: bool = False,
        width: float = 1.0,
    ) -> None:
        super().__init__()
        self.in_channels = L.positive_int(in_channels, "in_channels")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        channels = self.default_channels if channels is None else channels
        if not isinstance(channels, Sequence) or isinstance(channels, str) or not channels:
            raise ValueError(f"channels: expected a non-empty sequence of widths, got {channels!r}")
        width = L.positive_number(width, "width")
        sizes = [L.scaled(L.positive_int(c, "channels"), width) for c in channels]
        hidden = sizes[-1] if hidden is None else L.scaled(L.positive_int(hidden, "hidden"), width)
        dropout = L.probability(dropout, "dropout")
        batch_norm = L.flag(batch_norm, "batch_norm")

        layers: list[nn.Module] = []
        cin = self.in_channels
        for cout in sizes:
            layers.append(L.conv3x3(cin, cout, bias=True))
            if batch_norm:
                layers.append(L.batch_norm(cout))
            layers += [nn.ReLU(inplace=True), nn.MaxPool2d(2, ceil_mode=True)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            L.linear(cin, hidden), nn.ReLU(inplace=True), L.dropout(dropout)
        )
        self.head = L.linear(hidden, self.num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Logits `[B, num_classes]` for images `[B, in_channels, H, W]`."""
        L.check_images(x, self.in_channels)
        return self.head(self.classifier(self.pool(self.features(x)).flatten(1)))


class MediumCNN(LandscapeCNN):
    """Fort et al.'s MediumCNN: `LandscapeCNN` with channels (64, 128, 256, 256)."""

    default_channels = (64, 128, 256, 256)
