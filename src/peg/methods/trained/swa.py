"""SWA (Izmailov et al. 2018), a training-time method: the weights averaged along training.

It trains a model with the SWA schedule (`peg.train.Recipe(schedule="swa")`), collects the
weights once per epoch after `swa_start` (epochs swa_start+1, ..., epochs, as the reference code
does), averages them with `torch.optim.swa_utils.AveragedModel` and re-estimates BatchNorm
statistics with `update_bn`. SWAG (`peg.methods.trained.swag`) is SWA that also keeps the
weights' moments, and samples its members from them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from peg._bn import update_bn
from peg.ensemble import Ensemble
from peg.methods import _constraints as checks
from peg.methods.base import FittedEnsemble, store_arguments
from peg.methods.trained._checkpoints import collect, refuse_training_arguments
from peg.methods.trained._swa_callbacks import Averager
from peg.source import Data, Source
from peg.source._devices import weights_device
from peg.source.batches import BatchFn
from peg.train import Callback, ModelSource, Recipe, instantiate, train
from peg.train._data import check_labelled

BN_TYPES = (nn.modules.batchnorm._BatchNorm,)


def default_recipe() -> Recipe:
    """The reference schedule scaled to 20 epochs: SWA from epoch 11 (161/300 in the paper)."""
    return Recipe(epochs=20, lr=0.05, schedule="swa", swa_start=11, swa_lr=0.01)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, BN_TYPES) for m in model.modules())


def _swa_schedule(swa: SWA) -> None:
    """The recipe (or the default one) sets swa_start and swa_lr and trains after swa_start."""
    recipe = swa._recipe()
    if recipe.swa_start is None or recipe.swa_lr is None:
        raise ValueError("recipe: SWA needs swa_start and swa_lr (e.g. schedule='swa')")
    if recipe.swa_start >= recipe.epochs:
        raise ValueError(
            f"swa_start: {recipe.swa_start} leaves no epoch to collect "
            f"(epochs={recipe.epochs}); weights are collected after swa_start"
        )


class SWA(FittedEnsemble):
    """Stochastic Weight Averaging with `torch.optim.swa_utils` (AveragedModel, SWALR, update_bn):
    θ_SWA = (1/n) Σ θ_epoch over the epochs after `swa_start` (Izmailov et al. 2018, "Averaging
    Weights Leads to Wider Optima and Better Generalization", UAI).

    Args:
        recipe: how to train; must carry `swa_start` (collect after this epoch; 0 collects
            from the first epoch, e.g. when fine-tuning an already-trained model) and `swa_lr`.
            None: `default_recipe()`, 20 epochs, SGD lr 0.05, SWA from epoch 11 at rate 0.01.
        seed: data order, dropout, and the initialisation when a factory is given.
        batch_size: rows per batch of the `update_bn` pass over the training data.
        checkpoint: a file to save the run after every epoch and resume from.
        progress: progress bars.
        loss: the training loss `loss(outputs, y)` (e.g. a Gaussian NLL for regression heads).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for training and `bn_data` batches of
            another shape (`peg.source.batches`).

    `train_data` and `bn_data` are read batch by batch (tensors, a Dataset, a DataLoader or an
    IterableDataset; `peg.train.train`), never gathered; the fitted object keeps a reference
    to the BatchNorm data (not a copy) for SWAG's later samples.

    `fit(model, train_data)` takes an untrained (or pre-trained) module, which is copied and
    never modified, or a zero-argument factory. Fitted: `swa_model_` (the averaged module, eval
    mode), `history_`, `meta_`, and an `Ensemble` of one member for the common verbs.
    """

    method = "swa"
    # the snapshots `from_checkpoints` needs at the least, and what for (SWAG: a variance)
    _snapshots_needed: ClassVar[tuple[int, str]] = (1, "an average")

    def __init__(
        self,
        *,
        recipe: Recipe | None = None,
        seed: int = 0,
        batch_size: int = 256,
        checkpoint: str | os.PathLike[str] | None = None,
        progress: bool | None = None,
        loss: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "recipe": checks.instance_of(Recipe, "a peg.train.Recipe", optional=True),
        "seed": checks.positive_int(minimum=0),
        "batch_size": checks.positive_int(),
        "checkpoint": checks.instance_of((str, os.PathLike), "a file path", optional=True),
        "progress": checks.boolean(optional=True),
        "loss": checks.function("a callable loss(outputs, y)"),
        "batch_fn": checks.batch_fn,
    }
    parameter_rules: ClassVar[tuple[checks.Rule, ...]] = (_swa_schedule,)

    def _recipe(self) -> Recipe:
        """The recipe used: `recipe`, or `default_recipe()` for None."""
        return self.recipe if self.recipe is not None else default_recipe()

    @property
    def collected(self) -> int:
        """Number of weight snapshots collected (epochs after swa_start; the checkpoints given
        to `from_checkpoints`)."""
        given = self.__dict__.get("_checkpoints")
        if given is not None:
            return int(given)
        recipe = self._recipe()
        assert recipe.swa_start is not None
        return recipe.epochs - recipe.swa_start

    def _callbacks(self, model: nn.Module, swa_start: int) -> list[Callback]:
        self._averager = Averager(model, swa_start)
        return [self._averager]

    @classmethod
    def from_checkpoints(
        cls,
        model: nn.Module,
        checkpoints: Sequence[Any],
        *,
        bn_data: Data | None = None,
        **params: Any,
    ) -> Any:
        """SWA (SWAG for `SWAG.from_checkpoints`) of weights saved by your own training.

        Args:
            model: the module the checkpoints were saved from (copied, never modified).
            checkpoints: the snapshots in the order taken: state dicts, or paths of
                `.safetensors` or torch weights files (`.pt`, `.pth`, `.bin`: read with
                `torch.load(weights_only=True)` only), each holding exactly the model's entries
                and shapes (`peg.methods.trained._checkpoints`); read one at a time.
            bn_data: data to re-estimate BatchNorm statistics on, as `fit`'s; None: the last
                checkpoint's are kept (a warning with BatchNorm; SWAG's samples keep them too).
            params: the method's other arguments (`seed`, `batch_size`, `batch_fn`, SWAG's
                `diag`, `max_num_models`, `scale`, `n_members`, `bn`, ...); none of training's.

        Returns the fitted method, equal to `fit`'s on the weights `fit` collects, with the
        same verbs and archives; `history_` is empty.
        """
        refuse_training_arguments(cls, params)
        method = cls(**params)
        least, what = cls._snapshots_needed
        collect(method, model, checkpoints, bn_data, least, f"{cls.__name__} ({what})")
        return method

    def _average(self, net: nn.Module) -> None:
        """The collected average as `swa_model_` (BatchNorm statistics re-estimated), then the
        fitted state (`_finish`)."""
        averaged = self._averager.averaged
        if has_batchnorm(averaged.module) and self._bn_batches is not None:
            update_bn(self._bn_batches, averaged)
        elif has_batchnorm(averaged.module):
            warnings.warn(
                "bn_data: not given, so the averaged weights keep the last checkpoint's "
                "BatchNorm statistics, which were not computed with them; pass bn_data (e.g. "
                "the training data) to re-estimate them",
                stacklevel=4,
            )
        self.swa_model_ = averaged.module.eval()
        self._finish(net)

    def fit(
        self,
        model: ModelSource,
        train_data: Data,
        *,
        bn_data: Data | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> SWA:
        """Train a copy of `model` (or `model()`) on `train_data` and average its weights.

        `bn_data` (default: the training data) re-estimates BatchNorm statistics, read batch by
        batch (`batch_size` rows for tensors and Datasets, a loader's own batches); extra
        `callbacks(epoch, model)` run after the method's own, every epoch.
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        device = weights_device(model) if isinstance(model, nn.Module) else None
        check_labelled(train_data, "train_data", device)
        name, source = ("train_data", train_data) if bn_data is None else ("bn_data", bn_data)
        self._bn_batches = Source(source, self.batch_fn, name).replay(int(self.batch_size))
        seed = int(self.seed)
        net = instantiate(model, seed)
        swa_start = self._recipe().swa_start
        assert swa_start is not None
        own = self._callbacks(net, swa_start)
        _, self.history_ = train(
            net,
            train_data,
            self._recipe(),
            seed=seed,
            loss=self.loss,
            callbacks=[*own, *callbacks],
            checkpoint=self.checkpoint,
            progress=self.progress,
            batch_fn=self.batch_fn,
        )
        self._average(net)
        return self

    def _meta(self) -> dict[str, Any]:
        if "_checkpoints" in self.__dict__:  # no recipe was run: the snapshots were given
            made: dict[str, Any] = {"from": "checkpoints"}
        else:
            made = {"recipe": self._recipe().to_dict()}
        return {
            "method": self.method,
            **made,
            "seed": int(self.seed),
            "collected": self._averager.count,
        }

    def _finish(self, net: nn.Module) -> None:
        self.ensemble_ = Ensemble.from_models([self.swa_model_], meta=self._meta())
