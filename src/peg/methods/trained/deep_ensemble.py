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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg.ensemble import Ensemble
from peg.errors import InvalidParameterError
from peg.methods import _constraints as checks
from peg.methods.base import FittedEnsemble, store_arguments
from peg.methods.trained._checkpoints import (
    check_checkpoints,
    check_model,
    refuse_training_arguments,
    snapshots,
)
from peg.source import Data
from peg.source._devices import weights_device
from peg.source.batches import BatchFn
from peg.train import Callback, ModelSource, Recipe, instantiate, load_checked, train
from peg.train._data import check_labelled
from peg.utils.io import save_tree

MEMBER_FORMAT = "peg-deep-ensemble-member"


def member_seed(seed: int, i: int) -> int:
    """The seed of member i: an independent stream of (seed, i) (numpy SeedSequence)."""
    return int(np.random.SeedSequence(entropy=seed, spawn_key=(i,)).generate_state(1)[0])


def _counted(params: dict[str, Any], n: int) -> dict[str, Any]:
    """`params` with `n_members` = `n`, the number of models or checkpoints given."""
    if "n_members" in params and params["n_members"] != n:
        raise InvalidParameterError(
            f"n_members: {params['n_members']!r}, but {n} members were given; leave it out"
        )
    return {**params, "n_members": n}


class DeepEnsemble(FittedEnsemble):
    """M models trained independently from different seeds, p̄(x) = (1/M) Σᵢ softmax(fᵢ(x))
    (Lakshminarayanan et al. 2017, "Simple and Scalable Predictive Uncertainty Estimation using
    Deep Ensembles", NeurIPS).

    Args:
        n_members: M, the number of members.
        recipe: how each member is trained (`peg.train.Recipe`; None: `Recipe()`).
        seed: the ensemble's seed; member i uses `member_seed(seed, i)`.
        reinit: when `fit` gets a module rather than a factory, re-initialise each member's copy
            (`reset_parameters()` on every submodule that has one) under its own seed. With
            False every member starts from the module's weights and differs only by data
            order and dropout.
        checkpoint_dir: folder for per-member files; makes an interrupted fit resumable.
        progress: progress bars.
        loss: the training loss `loss(outputs, y)` (e.g. a Gaussian NLL for regression heads).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for training batches of another shape
            (`peg.source.batches`); for predictions pass `batch_fn` to `member_logits` and the rest.

    `train_data` is read batch by batch by every member (`peg.train.train`): tensors, a
    Dataset, a DataLoader or an IterableDataset, never gathered.

    Fitted: `ensemble_` (M members), `histories_`, `seeds_`, `meta_`.
    """

    method = "deep-ensemble"

    def __init__(
        self,
        *,
        n_members: int = 5,
        recipe: Recipe | None = None,
        seed: int = 0,
        reinit: bool = True,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: bool | None = None,
        loss: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "n_members": checks.positive_int(),
        "recipe": checks.instance_of(Recipe, "a peg.train.Recipe", optional=True),
        "seed": checks.positive_int(minimum=0),
        "reinit": checks.boolean(),
        "checkpoint_dir": checks.instance_of((str, os.PathLike), "a folder path", optional=True),
        "progress": checks.boolean(optional=True),
        "loss": checks.function("a callable loss(outputs, y)"),
        "batch_fn": checks.batch_fn,
    }

    @classmethod
    def from_models(cls, models: Sequence[nn.Module], **params: Any) -> DeepEnsemble:
        """A fitted Deep Ensemble of models you trained (one architecture, any number >= 1):
        their weights are copied and stacked (`peg.Ensemble.from_models`), the models left as
        they are. The same verbs and archives as a trained one (`member_logits`,
        `predict_proba`, `save` / `peg.load`); `params`: `batch_size`... none of training's
        (`recipe`, `checkpoint_dir`, `loss`, `reinit`). `histories_` and `seeds_` are empty:
        no training was seen."""
        refuse_training_arguments(cls, params)
        if isinstance(models, nn.Module) or not isinstance(models, Sequence):
            raise TypeError(
                f"models: expected a list of trained nn.Modules, got {type(models).__name__}"
            )
        method = cls(**_counted(params, max(len(models), 1)))
        meta = {"method": cls.method, "n_members": len(models), "from": "models"}
        method.histories_, method.seeds_ = [], []
        method.ensemble_ = Ensemble.from_models(list(models), meta=meta)
        return method

    @classmethod
    def from_checkpoints(
        cls, model: nn.Module, checkpoints: Sequence[Any], **params: Any
    ) -> DeepEnsemble:
        """A fitted Deep Ensemble of saved members: `checkpoints` as `SWA.from_checkpoints`
        takes them (state dicts, `.safetensors` or torch weights-only files, each checked
        against `model`'s entries and shapes), one member each, on `model`'s architecture."""
        refuse_training_arguments(cls, params)
        entries = check_checkpoints(checkpoints, 1, "a Deep Ensemble (a member each)")
        states = [
            {k: v.detach().clone() for k, v in net.state_dict().items()}
            for net in snapshots(check_model(model), entries)
        ]
        method = cls(**_counted(params, len(states)))
        meta = {"method": cls.method, "n_members": len(states), "from": "checkpoints"}
        method.histories_, method.seeds_ = [], []
        method.ensemble_ = Ensemble.from_state_dicts(model, states, meta=meta)
        return method

    @staticmethod
    def _device(model: ModelSource) -> torch.device | None:
        return weights_device(model) if isinstance(model, nn.Module) else None

    def _recipe(self) -> Recipe:
        """The recipe used: `recipe`, or `Recipe()` for None."""
        return self.recipe if self.recipe is not None else Recipe()

    def _checkpoint_dir(self) -> Path | None:
        return Path(self.checkpoint_dir) if self.checkpoint_dir is not None else None

    def _identity(self, i: int) -> dict[str, Any]:
        seed = int(self.seed)
        return {
            "format": MEMBER_FORMAT,
            "recipe": self._recipe().to_dict(),
            "seed": seed,
            "member": i,
            "member_seed": member_seed(seed, i),
        }

    def _load_member(self, path: Path, i: int, model: nn.Module) -> list[dict[str, float]] | None:
        if not path.exists():
            return None
        saved = load_checked(path, self._identity(i), "checkpoint_dir")
        model.load_state_dict(saved["state"])
        return list(saved["history"])

    def fit(
        self,
        model: ModelSource,
        train_data: Data,
        *,
        bn_data: Data | None = None,
        callbacks: Sequence[Callback] = (),
        val_data: tuple[Any, Tensor] | None = None,
    ) -> DeepEnsemble:
        """Train `n_members` members on `train_data` from `model` (a module or a factory).

        `bn_data` is accepted for the shape every training-time method shares and unused: each
        member keeps the BatchNorm statistics of its own training. Extra `callbacks(epoch,
        model)` run after every epoch of every member. `val_data` `(X, y)`: validation data
        for early stopping (`recipe.patience`; each member stops on its own, `peg.train.train`).
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        check_labelled(train_data, "train_data", self._device(model))
        folder = self._checkpoint_dir()
        if folder is not None and folder.is_file():
            raise ValueError(
                f"checkpoint_dir: {folder} is a file; expected a folder (it is created if missing)"
            )
        recipe, seed = self._recipe(), int(self.seed)
        members, histories, seeds = [], [], []
        for i in range(self.n_members):
            s = member_seed(seed, i)
            net = instantiate(model, s, reinit=self.reinit)
            done = partial = None
            if folder is not None:
                done = folder / f"member-{i}.safetensors"
                partial = folder / f"member-{i}.partial.safetensors"
                history = self._load_member(done, i, net)
                if history is not None:
                    members.append(net.eval())
                    histories.append(history)
                    seeds.append(s)
                    continue
            _, history = train(
                net,
                train_data,
                recipe,
                seed=s,
                loss=self.loss,
                callbacks=callbacks,
                checkpoint=partial,
                val=val_data,
                progress=self.progress,
                batch_fn=self.batch_fn,
            )
            if done is not None and partial is not None:
                save_tree(
                    done, {**self._identity(i), "state": net.state_dict(), "history": history}
                )
                partial.unlink(missing_ok=True)
            members.append(net)
            histories.append(history)
            seeds.append(s)
        meta = {
            "method": self.method,
            "n_members": int(self.n_members),
            "recipe": recipe.to_dict(),
            "seed": seed,
            "reinit": self.reinit,
        }
        self.histories_, self.seeds_ = histories, seeds
        self.ensemble_ = Ensemble.from_models(members, meta=meta)
        return self
