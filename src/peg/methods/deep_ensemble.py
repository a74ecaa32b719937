"""Deep Ensembles (Lakshminarayanan et al. 2017): M independent trainings, resumable per member.

Member i is trained from its own initialisation and data order, both drawn from the seed
`member_seed(seed, i)` (an independent stream per member, so member i does not depend on M).
With `checkpoint_dir`, each finished member is saved there (safetensors + JSON, atomically) and
the member in progress is checkpointed every epoch; running the same fit again after an
interruption loads the finished members, resumes the unfinished one where it stopped, and gives
the same members as an uninterrupted run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from peg._inputs import Data, as_xy, check_positive_int, weights_device
from peg._io import save_tree
from peg.ensemble import Ensemble
from peg.methods.base import FittedEnsemble
from peg.train import ModelSource, Recipe, instantiate, load_checked, train

MEMBER_FORMAT = "peg-deep-ensemble-member"


def member_seed(seed: int, i: int) -> int:
    """The seed of member i: an independent stream of (seed, i) (numpy SeedSequence)."""
    return int(np.random.SeedSequence(entropy=seed, spawn_key=(i,)).generate_state(1)[0])


class DeepEnsemble(FittedEnsemble):
    """M models trained independently from different seeds.

    Args:
        size: M, the number of members.
        recipe: how each member is trained (`peg.train.Recipe`; default `Recipe()`).
        seed: the ensemble's seed; member i uses `member_seed(seed, i)`.
        reinit: when `fit` gets a module rather than a factory, re-initialise each member's copy
            (`reset_parameters()` on every submodule that has one) under its own seed. With
            False every member starts from the module's weights and differs only by data
            order and dropout.
        checkpoint_dir: folder for per-member files; makes an interrupted fit resumable.
        progress: progress bars.
        loss: the training loss `loss(outputs, y)` (e.g. a Gaussian NLL for regression heads).

    Fitted: `ensemble_` (M members), `histories_`, `seeds_`.
    """

    method = "deep-ensemble"

    def __init__(
        self,
        size: int = 5,
        recipe: Recipe | None = None,
        *,
        seed: int = 0,
        reinit: bool = True,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: bool | None = None,
        loss: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
    ) -> None:
        self.size = check_positive_int(size, "size")
        self.recipe = recipe if recipe is not None else Recipe()
        if not isinstance(self.recipe, Recipe):
            raise TypeError(f"recipe: expected a peg.train.Recipe, got {type(recipe).__name__}")
        self.seed = check_positive_int(seed, "seed", minimum=0)
        self.reinit = reinit
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.progress = progress
        self.loss = loss

    def _identity(self, i: int) -> dict[str, Any]:
        return {
            "format": MEMBER_FORMAT,
            "recipe": self.recipe.to_dict(),
            "seed": self.seed,
            "member": i,
            "member_seed": member_seed(self.seed, i),
        }

    def _load_member(self, path: Path, i: int, model: nn.Module) -> list[dict[str, float]] | None:
        if not path.exists():
            return None
        saved = load_checked(path, self._identity(i), "checkpoint_dir")
        model.load_state_dict(saved["state"])
        return list(saved["history"])

    def fit(self, model: ModelSource, train_data: Data) -> DeepEnsemble:
        """Train `size` members on `train_data` from `model` (a module or a factory)."""
        device = weights_device(model) if isinstance(model, nn.Module) else None
        X, y = as_xy(train_data, "train_data", device=device)
        if y is None:
            raise ValueError("train_data: training needs labels, got inputs only")
        if self.checkpoint_dir is not None and self.checkpoint_dir.is_file():
            raise ValueError(
                f"checkpoint_dir: {self.checkpoint_dir} is a file; expected a folder (it is "
                "created if missing)"
            )
        members, self.histories_, self.seeds_ = [], [], []
        for i in range(self.size):
            s = member_seed(self.seed, i)
            net = instantiate(model, s, reinit=self.reinit)
            done = partial = None
            if self.checkpoint_dir is not None:
                done = self.checkpoint_dir / f"member-{i}.safetensors"
                partial = self.checkpoint_dir / f"member-{i}.partial.safetensors"
                history = self._load_member(done, i, net)
                if history is not None:
                    members.append(net.eval())
                    self.histories_.append(history)
                    self.seeds_.append(s)
                    continue
            _, history = train(
                net,
                (X, y),
                self.recipe,
                seed=s,
                loss=self.loss,
                checkpoint=partial,
                progress=self.progress,
            )
            if done is not None and partial is not None:
                save_tree(
                    done, {**self._identity(i), "state": net.state_dict(), "history": history}
                )
                partial.unlink(missing_ok=True)
            members.append(net)
            self.histories_.append(history)
            self.seeds_.append(s)
        meta = {
            "method": self.method,
            "size": self.size,
            "recipe": self.recipe.to_dict(),
            "seed": self.seed,
            "reinit": self.reinit,
        }
        self.ensemble_ = Ensemble.from_models(members, meta=meta)
        return self
