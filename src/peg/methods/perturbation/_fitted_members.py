"""A fitted PEG/PEP's members at the scale `fit` chose, answering as an `Ensemble` does.

`FittedMembers` is what `PerturbationEnsemble._held` gives `FittedEnsemble`'s verbs
(`member_logits`, `iter_member_logits`, `len`, `meta_`): whatever holds the members (stacked or
lazy, `peg.methods.perturbation._members`), predicting knows nothing of how they were made.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import Tensor

from peg.ensemble import Ensemble
from peg.methods.perturbation._lazy import RegeneratedMembers
from peg.methods.perturbation._members import StackedMembers
from peg.source import Data


class FittedMembers:
    """`members` (stacked or lazy) at `scale`, with the fitted `meta`."""

    def __init__(
        self, members: StackedMembers | RegeneratedMembers, scale: float, meta: dict[str, Any]
    ) -> None:
        self.members, self.scale, self.meta = members, scale, meta

    def __len__(self) -> int:
        return len(self.members)

    def ensemble(self) -> Ensemble:
        """The `Ensemble` of the members; a lazy holder builds every one of them for it."""
        ensemble = self.members.ensemble(self.scale)
        ensemble.meta = dict(self.meta)
        return ensemble

    def member_logits(self, X: Data, batch_size: int, **options: Any) -> Tensor:
        """`[M, N, C]`; a lazy holder loops over chunks of members outside and batches inside
        (`chunk_size`, see `peg.methods.perturbation._lazy.RegeneratedMembers`)."""
        return self.members.member_logits(X, self.scale, batch_size, **options)

    def iter_member_logits(self, X: Data, batch_size: int, **options: Any) -> Iterator[Tensor]:
        """`[M, B_j, C]` batch by batch: stacked members only (a lazy holder raises
        `NotStreamable`; `peg.evaluate` falls back to `member_logits`)."""
        return self.members.iter_member_logits(X, self.scale, batch_size, **options)
