"""`Site`: what a method builder of `peg.apps.registry` may draw on where it is built."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from peg.losses import packed_loss

Loss = Callable[[Tensor, Tensor], Tensor]


@dataclass
class Site:
    """What a builder may draw on where a method is built (fields left None: not available).

    Attributes:
        seed: the seed of the method (and of the model it trains).
        progress: progress bars (None: only on a terminal).
        base: the trained base, built on first use: an nn.Module or an Ensemble.
        val: validation data `(X, y)`, which post-hoc methods are fitted on.
        train: training data `(X, y)`.
        score_points: validation points that score a searched scale (PEG's η, PEP's σ) when
            the options do not say (None: all).
        model: a fresh, untrained model under `seed`; keywords `packed=` (a `Packing`) and
            `dropout=` (a probability) ask for those variants.
        fit_model: trains a method's own model with the application's recipe (checkpointed),
            `fit_model(net, loss) -> net`.
        loss: the task's loss (cross-entropy; a Gaussian NLL for regression).
        packed_loss: the loss of a packed model (each member on its own `loss`).
        iterates: state dicts of the last checkpoints of one trajectory.
        skeleton: the architecture of `iterates`.
    """

    seed: int = 0
    progress: bool | None = None
    base: Callable[[], Any] | None = None
    val: tuple[Tensor, Tensor] | None = None
    train: tuple[Tensor, Tensor] | None = None
    score_points: int | None = None
    model: Callable[..., nn.Module] | None = None
    fit_model: Callable[[nn.Module, Loss], nn.Module] | None = None
    loss: Loss = F.cross_entropy
    packed_loss: Loss = packed_loss
    iterates: Sequence[Mapping[str, Tensor]] | None = None
    skeleton: nn.Module | None = None

    def need(self, name: str) -> Any:
        """The field `name`; a ValueError when this site does not have it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{name}: the method needs a {name}, and this application has none")
        return value
