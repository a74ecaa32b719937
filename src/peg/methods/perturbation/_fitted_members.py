"""The verbs of a fitted PEG/PEP (`PerturbationEnsemble`), whatever holds its members.

`FittedMembers` is mixed into `PerturbationEnsemble`: it answers through `members_` (stacked or
lazy, `peg.methods.perturbation._members`) at the scale `fit` chose (`<scale>_`), so predicting
knows nothing of how the members were made.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from peg._inputs import Data
from peg.batches import BatchFn
from peg.ensemble import Ensemble, Strategy
from peg.methods.perturbation._members import StackedMembers


class FittedMembers:
    """`ensemble`, `member_logits`, `ensemble_at`, `meta_`, ... of a fitted PEG/PEP."""

    scale_name = "scale"

    @property
    def _scale(self) -> float:
        """The scale chosen by `fit` (`eta_` / `sigma_`)."""
        return float(getattr(self, f"{self.scale_name}_"))

    @property
    def directions_(self) -> list[Tensor]:
        """The direction rows, `[S, P]` per base (not kept by a lazy ensemble)."""
        members = self.members_
        if not isinstance(members, StackedMembers):
            raise AttributeError(f"{type(self).__name__}: a lazy ensemble keeps no directions_")
        return members.directions

    @property
    def meta_(self) -> dict[str, Any]:
        """What was fitted: method, scale, hyper-parameters, search, ... (saved with it)."""
        self._check_fitted("reading meta_")  # type: ignore[attr-defined]
        return self._fitted_meta

    def __len__(self) -> int:
        return len(self.members_)

    def ensemble(self) -> Ensemble:
        """The fitted `Ensemble`.

        A lazy ensemble holds no members: this builds every one of them (S·R × member size of
        memory), each time it is called; prefer `member_logits` / `predict_proba`, which hold
        one chunk of members at a time.
        """
        self._check_fitted()  # type: ignore[attr-defined]
        ensemble = self.members_.ensemble(self._scale)
        ensemble.meta = dict(self._fitted_meta)
        return ensemble

    def member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        *,
        batch_fn: BatchFn | None = None,
        progress: bool | None = None,
        autocast: str | torch.dtype | None = None,
        strategy: Strategy = "auto",
        chunk_size: int | None = None,
    ) -> Tensor:
        """Logits of every member, `[M, N, C]` (M = S·R less `dropped_`, base-major).

        The predictor protocol (`peg.methods.base`; `batch_size` and `batch_fn` default to the
        constructor's); the rest as `Ensemble.member_logits`. A lazy ensemble loops over chunks
        of `chunk_size` members (default `LAZY_CHUNK_SIZE`) outside and batches inside (see
        `peg.methods.perturbation._lazy.RegeneratedMembers`).
        """
        self._check_fitted()  # type: ignore[attr-defined]
        size, split = self._reading(batch_size, batch_fn, X)  # type: ignore[attr-defined]
        options = dict(strategy=strategy, progress=progress, chunk_size=chunk_size)
        return self.members_.member_logits(
            X, self._scale, size, autocast=autocast, batch_fn=split, **options
        )

    def iter_member_logits(
        self, X: Data, batch_size: int | None = None, *, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Iterator[Tensor]:  # fmt: skip
        """`member_logits` batch by batch, `[M, B_j, C]`: stacked members only (a lazy ensemble
        has chunks of members outside its batches: `NotStreamable`; `peg.evaluate` falls back)."""
        size, split = self._reading(batch_size, batch_fn, X)  # type: ignore[attr-defined]
        return self.members_.iter_member_logits(X, self._scale, size, batch_fn=split, **options)

    def ensemble_at(self, scale: float) -> Ensemble:
        """The members at another scale, from the stored directions (no gradient is recomputed).

        Members are θ_r + scale·D_r[i] for every base r and member i, base-major; scale 0 gives
        copies of the base models. Used by the scale search, and to plot a metric against it.
        A lazy ensemble regenerates its directions for this (and builds every member).
        """
        self._check_fitted("ensemble_at(...)")  # type: ignore[attr-defined]
        return self.members_.ensemble_at(scale)
