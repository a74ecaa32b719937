"""A multi-layer perceptron: the PEG paper's §5.6 toy model (one hidden layer of 20 units)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor, nn

from peg.models import _layers as L
from peg.models._packed import Packable, as_packing, packing

#: Activation name -> module class.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "elu": nn.ELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
    "sigmoid": nn.Sigmoid,
}


class MLP(Packable):
    """Fully connected classifier; inputs `[B, ...]` are flattened to `[B, in_features]`.

    Layout: `body` = Flatten, then per hidden layer Linear → activation (→ Dropout when
    `dropout > 0`); `head` = the output Linear (the "last layer" for methods that treat it
    specially).

    Args:
        in_features: input size after flattening (2 for the toy sets, 784 for 28×28 images).
        num_classes: number of logits C.
        hidden: sizes of the hidden layers, or one int; () gives a linear (softmax regression)
            model. The paper's toy model: (20,).
        activation: one of "relu", "tanh", "gelu", "elu", "silu", "leaky_relu", "sigmoid".
        dropout: dropout probability after each hidden activation (0 adds no Dropout layers).
        packed: None, or Packed-Ensembles-(alpha, num_estimators, gamma) as a tuple, a dict or
            a `Packing` (see `peg.models._packed`): every layer packed, the first one reading
            the plain input.

    Input `[B, ...]` with `prod(...) == in_features`; output logits `[B, num_classes]`
    (packed: log p̄, and `member_forward(x)` -> `[M, B, C]`).
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        hidden: Sequence[int] | int = (20,),
        activation: str = "relu",
        dropout: float = 0.0,
        packed: object = None,
    ) -> None:
        super().__init__()
        self.packing = as_packing(packed)
        self.in_features = L.positive_int(in_features, "in_features")
        self.num_classes = L.positive_int(num_classes, "num_classes")
        if isinstance(hidden, (int, np.integer)) and not isinstance(hidden, bool):
            hidden = (int(hidden),)
        if not isinstance(hidden, Sequence) or isinstance(hidden, str):
            raise ValueError(f"hidden: expected a sequence of layer sizes, got {hidden!r}")
        sizes = [L.positive_int(h, "hidden") for h in hidden]
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}"
            )
        dropout = L.probability(dropout, "dropout")
        with packing(self.packing):
            layers: list[nn.Module] = [nn.Flatten()]
            width = self.in_features
            for i, size in enumerate(sizes):
                layers += [L.linear(width, size, first=i == 0), ACTIVATIONS[activation]()]
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
                width = size
            self.body = nn.Sequential(*layers)
            self.head = L.linear(width, self.num_classes, first=not sizes, last=True)

    def forward(self, x: Tensor) -> Tensor:
        """Logits `[B, num_classes]` for inputs `[B, ...]` (flattened)."""
        if x.ndim < 2 or x.shape[1:].numel() != self.in_features:
            raise ValueError(
                f"x: expected [B, ...] with {self.in_features} features per sample, "
                f"got shape {tuple(x.shape)}"
            )
        return self._output(self.head(self.body(x)))
