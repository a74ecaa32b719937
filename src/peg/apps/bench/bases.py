"""The base solutions a benchmark builds methods on, trained lazily and checkpointed.

`single` is the first member of the deep ensemble (member i's seed does not depend on the
ensemble's size, so DeepEns-1 ⊂ DeepEns-3 and nothing is trained twice). `swa`, `swag` and
`swag-diag` come from one SWAG run: its running mean is SWA (`AveragedModel`, BatchNorm
re-estimated), SWAG and SWAG-Diag sample from its moments (the paper trains them separately;
the moments would be those of the same trajectory).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from peg.ensemble import Ensemble
from peg.methods.trained.deep_ensemble import DeepEnsemble
from peg.methods.trained.swag import SWAG
from peg.train import Recipe


class Bases:
    """Lazily trained base solutions of one seed; everything checkpointed under `cache`.

    Args:
        factory: builds an untrained model (called under each member's seed).
        train: `(X, y)` training data.
        recipe: the SGD recipe of the deep-ensemble members.
        swa: the SWA/SWAG recipe (None: no SWA-family base).
        seed: the run's seed.
        deep_ensemble_size: members to train (≥ every DeepEns-N asked for).
        swag_samples: samples of SWAG and SWAG-Diag.
        cache: folder for checkpoints.
        val: validation data `(X, y)`: the deep-ensemble members stop early on it when
            `recipe.patience` is set.
    """

    def __init__(
        self,
        factory: Callable[[], nn.Module],
        train: tuple[Tensor, Tensor],
        recipe: Recipe,
        swa: Recipe | None,
        seed: int,
        deep_ensemble_size: int,
        swag_samples: int,
        cache: Path,
        progress: bool | None = None,
        val: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        self.factory, self.train, self.recipe, self.swa = factory, train, recipe, swa
        self.val = val if recipe.patience is not None else None
        self.seed, self.size, self.swag_samples = seed, deep_ensemble_size, swag_samples
        self.cache, self.progress = cache, progress

    @functools.cached_property
    def deep_ensemble(self) -> DeepEnsemble:
        return DeepEnsemble(
            n_members=self.size,
            recipe=self.recipe,
            seed=self.seed,
            checkpoint_dir=self.cache / "deep-ensemble",
            progress=self.progress,
        ).fit(self.factory, self.train, val_data=self.val)

    def training(self) -> dict[str, list[float]]:
        """How the deep-ensemble members trained: epochs run and, with early stopping, the
        best epoch (whose weights were kept)."""
        histories = self.deep_ensemble.histories_
        out: dict[str, list[float]] = {"epochs": [float(len(h)) for h in histories]}
        if all(h and "val_nll" in h[0] for h in histories):
            out["best_epoch"] = [
                float(min(h, key=lambda e: e["val_nll"])["epoch"]) for h in histories
            ]
        return out

    @functools.cached_property
    def swag(self) -> SWAG:
        if self.swa is None:
            raise ValueError("swa: this benchmark has no SWA recipe")
        return SWAG(
            recipe=self.swa,
            n_members=self.swag_samples,
            seed=self.seed,
            checkpoint=str(self.cache / "swag.safetensors"),
            progress=self.progress,
        ).fit(self.factory, self.train)

    def _deep_ensemble(self, n: int) -> Ensemble:
        if n > self.size:
            raise ValueError(f"base: deepens-{n} needs {n} members, this run trains {self.size}")
        full = self.deep_ensemble.ensemble()
        return Ensemble.from_models([full.member_model(i) for i in range(n)], full.meta)

    def get(self, name: str) -> Any:
        """A base by name: single, swa, swag, swag-diag, deepens-N (nn.Module or Ensemble)."""
        if m := re.fullmatch(r"deepens-(\d+)", name):
            return self._deep_ensemble(int(m[1]))
        bases: dict[str, Callable[[], Any]] = {
            "single": lambda: self.deep_ensemble.ensemble().member_model(0),
            "swa": lambda: self.swag.swa_model_,
            "swag": lambda: self.swag.ensemble(),
            "swag-diag": lambda: self.swag.ensemble(n=self.swag_samples, diag=True, scale=1.0),
        }
        if name not in bases:
            raise ValueError(
                f"base: unknown {name!r}; known: single, swa, swag, swag-diag, deepens-N"
            )
        return bases[name]()
