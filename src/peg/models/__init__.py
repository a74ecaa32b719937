"""Models: the PEG paper's toy MLP and a small, fast CNN.

from peg import models
net = models.build("small-cnn", in_channels=1, num_classes=10)   # logits [B, 10]
"""

from __future__ import annotations

from typing import Any

from torch import nn

from peg.models.cnn import SmallCNN
from peg.models.mlp import MLP

#: Model name -> class; `build(name, **kwargs)` calls `REGISTRY[name](**kwargs)`.
REGISTRY: dict[str, type[nn.Module]] = {"mlp": MLP, "small-cnn": SmallCNN}


def build(name: str, **kwargs: Any) -> nn.Module:
    """A model by name with constructor arguments `kwargs`.

    Args:
        name: "mlp" (`MLP(in_features, num_classes, hidden, activation, dropout)`) or
            "small-cnn" (`SmallCNN(in_channels, num_classes, width, batch_norm, dropout,
            stem_stride)`); case and "_" vs "-" are ignored.
        **kwargs: passed to the constructor.

    Returns:
        The model (in training mode, freshly initialised from torch's global generator).
    """
    key = name.strip().lower().replace("_", "-") if isinstance(name, str) else None
    if key not in REGISTRY:
        raise ValueError(f"name: unknown model {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[key](**kwargs)


__all__ = ["MLP", "REGISTRY", "SmallCNN", "build"]
