"""What every subspace sampler shares (`Sampler`): the checks of `n_members`, `seed` and `bn`,
the metadata its `Ensemble` carries, and the BatchNorm refresh per sample (bn="refresh")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from peg._params import refresh_bn
from peg.methods import _constraints as checks
from peg.methods.base import FittedEnsemble
from peg.source import Data, InputBatches, Source
from peg.streams import SUBSPACE_BN, generator

SubspaceBN = Literal["eval", "refresh"]
BN_BATCH_SIZE = 256  # rows per batch when bn_data is a tensor (a loader keeps its own batches)


class Sampler(FittedEnsemble):
    """What every subspace sampler shares: validation, BatchNorm handling, the `Ensemble`.

    Subclasses take (keyword-only) at least `n_members`, `seed`, `bn` and `progress`.
    """

    method = "subspace"
    n_members: int
    seed: int
    bn: SubspaceBN
    progress: bool | None

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "n_members": checks.positive_int(),
        "seed": checks.positive_int(minimum=0),
        "bn": checks.one_of("eval", "refresh"),
        "progress": checks.boolean(optional=True),
    }

    def _hyperparameters(self) -> dict[str, Any]:
        return {}

    def _meta(self, **extra: Any) -> dict[str, Any]:
        return {
            "method": self.method,
            "n_members": int(self.n_members),
            "seed": self.seed,
            "bn": self.bn,
            **self._hyperparameters(),
            **extra,
        }

    def _bn_batches(self, bn_data: Data | None) -> InputBatches | None:
        """Input batches for bn='refresh' (None for bn='eval'), a stream read anew for every
        sample (never gathered); its first batch is read before any sampling (not empty)."""
        if self.bn != "refresh":
            return None
        if bn_data is None:
            raise ValueError(
                "bn_data: bn='refresh' re-estimates BatchNorm statistics per sample and needs "
                "training inputs: fit(..., bn_data=train_loader)"
            )
        batches = Source(bn_data, name="bn_data").replay(BN_BATCH_SIZE)
        batches.check_not_empty()
        return batches

    def _refresh(
        self,
        skeleton: nn.Module,
        state: dict[str, Tensor],
        batches: InputBatches | None,
        d: int,
    ) -> dict[str, Tensor]:
        """`state` with re-estimated BatchNorm statistics when bn='refresh', else unchanged."""
        if batches is None:
            return state
        # update_bn runs in train mode: seed any dropout in that pass from (seed, SUBSPACE_BN, d).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(generator(self.seed, SUBSPACE_BN, d).initial_seed()))
            return refresh_bn(skeleton, state, batches)
