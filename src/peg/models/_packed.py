"""The `packed=` flag of the architectures: Packed-Ensembles-(α, M, γ) variants of the same classes.

`MLP(..., packed=(2, 4, 1))`, `ResNet(depth=18, packed={"alpha": 2, "num_estimators": 4})` or
`build("vgg16", packed=Packing(2, 4, 2))` builds the network inside `packing(spec)`, where the
`_layers` factories (`conv`, `linear`, `batch_norm`) return `PackedConv2d`, `PackedLinear` and
BatchNorms over the packed channels instead of the plain layers. The model marks its first layer
(`first=True`: the full convolution of Fig. 3c on the plain input, so no input repetition is
needed) and its head (`last=True`: M·C logits).

Outputs (`Packable`), so that a packed model is still an ordinary classifier:

- `member_forward(x)` -> member logits `[M, B, C]` (`[1, B, C]` for an unpacked model);
- `forward(x)` -> `[B, C]` log of the averaged member probabilities, log p̄ = logsumexp_m
  log softmax(zₘ) − log M, computed in log space. They are normalised log-probabilities, so
  cross-entropy, argmax, softmax (= p̄) and `Ensemble`/metrics treat them as logits. The member
  logits `[M, B, C]` ride along as the attribute `output.member_logits` (the same tensor object
  train() hands to its loss), which is how `peg.losses.packed_loss` trains each member
  on its own cross-entropy through the unchanged `train(model, data, loss=packed_loss)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from peg.layers.packed import check_alpha, check_count, packed_channels, rearrange


@dataclass(frozen=True)
class Packing:
    """Packed-Ensembles-(alpha, num_estimators, gamma) hyper-parameters (checked on creation)."""

    alpha: float
    num_estimators: int
    gamma: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", check_alpha(self.alpha))
        object.__setattr__(
            self, "num_estimators", check_count(self.num_estimators, "num_estimators")
        )
        object.__setattr__(self, "gamma", check_count(self.gamma, "gamma"))

    def channels(self, channels: int) -> int:
        """Packed width of a hidden layer of `channels` (see `peg.layers.packed`)."""
        return packed_channels(channels, self.alpha, self.num_estimators)

    def __str__(self) -> str:
        return f"Packed-Ensembles-({self.alpha:g}, {self.num_estimators}, {self.gamma})"


def as_packing(packed: object) -> Packing | None:
    """`packed=` argument -> `Packing` or None.

    Accepts None (a plain model), a `Packing`, a tuple `(alpha, num_estimators[, gamma])` or a
    mapping with keys "alpha", "num_estimators" and optionally "gamma".
    """
    if packed is None or isinstance(packed, Packing):
        return packed
    if isinstance(packed, Mapping):
        unknown = sorted(set(packed) - {"alpha", "num_estimators", "gamma"})
        if unknown or not {"alpha", "num_estimators"} <= set(packed):
            raise ValueError(
                "packed: expected keys 'alpha', 'num_estimators' (and optionally 'gamma'), "
                f"got {sorted(packed)}"
            )
        return Packing(**packed)
    if isinstance(packed, (tuple, list)) and len(packed) in (2, 3):
        return Packing(*packed)
    raise ValueError(
        "packed: expected None, (alpha, num_estimators, gamma), a dict with those keys or a "
        f"Packing, got {packed!r}"
    )


_CURRENT: ContextVar[Packing | None] = ContextVar("peg_packing", default=None)


@contextmanager
def packing(spec: Packing | None) -> Iterator[None]:
    """Inside this block the `_layers` factories build packed layers for `spec` (None: plain)."""
    token = _CURRENT.set(spec)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> Packing | None:
    """The packing the factories are building for right now (None outside `packing`)."""
    return _CURRENT.get()


def averaged_log_probs(member_logits: Tensor) -> Tensor:
    """log p̄ `[B, C]` from member logits `[M, B, C]`, in log space (no log of a saturated mean)."""
    return torch.logsumexp(member_logits.log_softmax(-1), 0) - math.log(member_logits.shape[0])


class Packable(nn.Module):
    """Base of the architectures with a `packed=` flag: member outputs and the `[B, C]` output.

    Subclasses set `self.packing` (a `Packing` or None) and end `forward` with
    `return self._output(head_output)`.
    """

    packing: Packing | None = None

    @property
    def num_estimators(self) -> int:
        """Number of members M (1 for an unpacked model)."""
        return 1 if self.packing is None else self.packing.num_estimators

    def _output(self, logits: Tensor) -> Tensor:
        """Unpacked: `logits` `[B, C]` as they are. Packed: the head's `[B, M·C]` as log p̄
        `[B, C]` carrying `.member_logits` `[M, B, C]`."""
        if self.packing is None:
            return logits
        members = rearrange(logits, self.packing.num_estimators)
        out = averaged_log_probs(members)
        out.member_logits = members  # type: ignore[attr-defined]  # read by packed_loss
        return out

    def member_forward(self, x: Tensor) -> Tensor:
        """Member logits `[M, B, C]` for a batch `x` (`[1, B, C]` when unpacked)."""
        out = self(x)
        members: Any = getattr(out, "member_logits", None)
        return out.unsqueeze(0) if members is None else members
