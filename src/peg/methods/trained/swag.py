"""SWA (Izmailov et al. 2018) and SWAG / SWAG-Diag (Maddox et al. 2019): training-time methods.

Both train a model with the SWA schedule (`peg.train.Recipe(schedule="swa")`) and collect the
weights once per epoch after `swa_start` (epochs swa_start+1, ..., epochs, as the reference code
does). SWA averages them with `torch.optim.swa_utils.AveragedModel` and re-estimates BatchNorm
statistics with `update_bn`. SWAG keeps, besides that running mean θ̄, the running mean of the
squared weights and the last K ≤ `max_num_models` deviations Dₖ = θₖ − θ̄ₖ (θ̄ₖ the mean after
collecting θₖ, as in the reference), and samples

    θ = θ̄ + √scale · (√var ⊙ z₁ + Dᵀ z₂ / √(K − 1)),   z₁ ~ N(0, I_P), z₂ ~ N(0, I_K)

with var = max(E[θ²] − θ̄², 1e-30), so Cov θ = scale · (diag(var) + DᵀD / (K − 1)). SWAG-Diag
(`diag=True`) drops the low-rank term. Default scales follow the reference experiments: 0.5 for
SWAG, 1.0 for SWAG-Diag.

Departure from the reference code: it divides the low-rank term by √(max_num_models − 1) even
when fewer deviations were collected; we divide by √(K − 1) with K the number actually
collected, which is the sample covariance the paper defines (they agree once K = max_num_models).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._bn import update_bn
from peg._params import parameter_vector, refresh_bn, unflatten_state
from peg._progress import bar
from peg._scalars import check_number, check_positive_int
from peg.ensemble import Ensemble
from peg.methods import _constraints as checks
from peg.methods.base import FittedEnsemble, store_arguments
from peg.methods.trained._checkpoints import collect, refuse_training_arguments
from peg.methods.trained._swa_callbacks import Averager, Moments
from peg.source import Data, Source
from peg.source._devices import weights_device
from peg.source.batches import BatchFn
from peg.streams import SWAG_SAMPLE, generator
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


def _two_collected(swag: SWAG) -> None:
    """SWAG's variance (and its low-rank term) need two collected epochs."""
    if swag.collected < 2:
        recipe, what = swag._recipe(), "a variance" if swag.diag else "SWAG's low-rank term"
        raise ValueError(
            f"swa_start: {what} needs at least 2 collected epochs, this recipe collects "
            f"{swag.collected} (epochs={recipe.epochs}, swa_start={recipe.swa_start})"
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
        cls, model: nn.Module, checkpoints: Sequence[Any], *, bn_data: Data | None = None,
        **params: Any,
    ) -> Any:  # fmt: skip
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
        variance = issubclass(cls, SWAG)  # SWAG's variance needs two snapshots
        why = f"{cls.__name__} ({'a variance' if variance else 'an average'})"
        collect(method, model, checkpoints, bn_data, 2 if variance else 1, why)
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


class SWAG(SWA):
    """SWA-Gaussian (`diag=False`) and SWAG-Diag (`diag=True`), Maddox et al. 2019.

    Args:
        recipe, seed, batch_size, checkpoint, progress, loss, batch_fn: as for `SWA`
            (`batch_size` is also that of the per-sample BatchNorm refresh).
        diag: keep only the diagonal covariance (SWAG-Diag).
        max_num_models: the most deviation columns kept (K ≤ this; oldest dropped), ≥ 2.
        scale: covariance scale of the samples; None: 0.5 for SWAG, 1.0 for SWAG-Diag.
        n_members: members of the fitted ensemble (the paper's experiments: 15).
        bn: "refresh" (default) re-estimates BatchNorm statistics on the training data for
            every sample, as the reference does; "eval" keeps the SWA statistics.

    Fitted: everything `SWA` has (`swa_model_` is θ̄ with its own BatchNorm statistics), plus
    `mean_`, `var_` `[P]`, `deviations_` `[K, P]` (parameters flattened in `parameters()`
    order), and an `Ensemble` of `n_members` members. `ensemble(n=..., scale=..., diag=...)`
    draws a new one; `sample_vectors(n)` gives raw parameter samples `[n, P]`.
    """

    method = "swag"

    def __init__(
        self,
        *,
        recipe: Recipe | None = None,
        diag: bool = False,
        max_num_models: int = 20,
        scale: float | None = None,
        n_members: int = 15,
        bn: Literal["refresh", "eval"] = "refresh",
        seed: int = 0,
        batch_size: int = 256,
        checkpoint: str | os.PathLike[str] | None = None,
        progress: bool | None = None,
        loss: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        **SWA.parameter_constraints,
        "diag": checks.boolean(),
        "max_num_models": checks.positive_int(minimum=2),
        "scale": checks.number(optional=True),
        "n_members": checks.positive_int(),
        "bn": checks.one_of("refresh", "eval"),
    }
    parameter_rules: ClassVar[tuple[checks.Rule, ...]] = (_swa_schedule, _two_collected)

    def _scale(self) -> float:
        """The covariance scale used: `scale`, or 1.0 (SWAG-Diag) / 0.5 (SWAG) for None."""
        if self.scale is not None:
            return float(self.scale)
        return 1.0 if self.diag else 0.5

    @property
    def method_name(self) -> str:
        return "swag-diag" if self.diag else "swag"

    def _callbacks(self, model: nn.Module, swa_start: int) -> list[Callback]:
        averager = super()._callbacks(model, swa_start)[0]
        self._moments = Moments(self._averager, self.max_num_models, bool(self.diag))
        return [averager, self._moments]

    def _meta(self) -> dict[str, Any]:
        return {
            **super()._meta(),
            "method": self.method_name,
            "diag": bool(self.diag),
            "scale": self._scale(),
            "max_num_models": int(self.max_num_models),
            "deviations": len(self._moments.deviations),
            "bn": self.bn if self._bn_batches is not None else "eval",
        }

    def _finish(self, net: nn.Module) -> None:
        self._skeleton = self.swa_model_
        self.mean_ = parameter_vector(self.swa_model_).clone()
        self.var_ = (self._moments.sq_mean - self.mean_**2).clamp_min(1e-30)
        self.deviations_ = (
            torch.stack(list(self._moments.deviations))
            if self._moments.deviations
            else self.mean_.new_zeros(0, self.mean_.numel())
        )
        self.ensemble_ = self._draw(self.n_members)  # last: `fitted_attribute`

    def sample_vectors(
        self, n: int, scale: float | None = None, diag: bool | None = None, seed: int | None = None
    ) -> Tensor:
        """`n` parameter vectors `[n, P]` drawn from the SWAG Gaussian (no BatchNorm refresh).

        Sample i uses the random stream (seed, SWAG_SAMPLE, i), so the first n samples do not
        depend on how many are drawn. Draws are made on the CPU (the same numbers on every
        device) and moved to the moments' device.
        """
        self._check_fitted("sampling")
        return self._vectors(n, scale, diag, seed)

    def _vectors(self, n: int, scale: float | None, diag: bool | None, seed: int | None) -> Tensor:
        """`sample_vectors`, unchecked: `fit` draws the members before it is fitted."""
        n = check_positive_int(n, "n")
        scale = self._scale() if scale is None else check_number(scale, "scale")
        diag = bool(self.diag) if diag is None else bool(diag)
        if not diag and self.diag:
            raise ValueError("diag: this SWAG-Diag fit collected no deviations; use diag=True")
        seed = int(self.seed) if seed is None else seed
        K, P = self.deviations_.shape
        std = self.var_.sqrt()
        out = []
        for i in range(n):
            gen = generator(seed, SWAG_SAMPLE, i)
            z1 = torch.randn(P, generator=gen).to(std.device)
            step = std * z1
            if not diag:
                z2 = torch.randn(K, generator=gen).to(std.device)
                step = step + self.deviations_.T @ z2 / math.sqrt(K - 1)
            out.append(self.mean_ + math.sqrt(scale) * step)
        return torch.stack(out)

    # adds (n, scale, seed): SWAG samples its members, FittedEnsemble.ensemble() takes none
    def ensemble(  # type: ignore[override]
        self,
        n: int | None = None,
        scale: float | None = None,
        diag: bool | None = None,
        seed: int | None = None,
    ) -> Ensemble:
        """The fitted ensemble (no arguments), or `n` new samples as an `Ensemble`.

        Each sample's BatchNorm statistics are re-estimated on the training data (bn="refresh"),
        read again batch by batch for every sample.
        """
        if n is None and scale is None and diag is None and seed is None:
            return super().ensemble()
        self._check_fitted("sampling")
        return self._draw(self.n_members if n is None else n, scale, diag, seed)

    def _draw(
        self, n: int, scale: float | None = None, diag: bool | None = None, seed: int | None = None
    ) -> Ensemble:
        """`ensemble(n, ...)`, unchecked: `fit` draws the members before it is fitted."""
        vectors = self._vectors(n, scale, diag, seed)
        model = self._skeleton
        # from_checkpoints without bn_data: nothing to refresh on
        refresh = self.bn == "refresh" and has_batchnorm(model) and self._bn_batches is not None
        batches = self._bn_batches if refresh else []
        base = {k: v.detach().clone() for k, v in model.state_dict().items()}
        names = [name for name, _ in model.named_parameters()]
        states = []
        for v in bar(vectors, "SWAG samples", len(vectors), self.progress):
            state = unflatten_state(v, base, names)
            states.append(refresh_bn(model, state, batches) if refresh else state)
        meta = {**self._meta(), "n_members": n}
        if scale is not None:
            meta["scale"] = scale
        if diag is not None:
            meta["diag"] = diag
            meta["method"] = "swag-diag" if diag else "swag"
        return Ensemble.from_state_dicts(model, states, meta=meta)
