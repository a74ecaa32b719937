"""SWAG / SWAG-Diag (Maddox et al. 2019): SWA (`peg.methods.trained.swa`, re-exported here) that
samples its members around the average.

SWAG trains and collects the weights as SWA does, and keeps, besides their running mean θ̄, the
running mean of the squared weights and the last K ≤ `max_num_models` deviations Dₖ = θₖ − θ̄ₖ
(θ̄ₖ the mean after collecting θₖ, as in the reference), and samples

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
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._params import parameter_vector, refresh_bn, unflatten_state
from peg.ensemble import Ensemble
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.trained._swa_callbacks import Moments
from peg.methods.trained.swa import BN_TYPES, SWA, _swa_schedule, default_recipe, has_batchnorm
from peg.source.batches import BatchFn
from peg.streams import SWAG_SAMPLE, generator
from peg.train import Callback, Recipe
from peg.utils.progress import bar
from peg.utils.scalars import check_number, check_positive_int

__all__ = ["BN_TYPES", "SWA", "SWAG", "default_recipe", "has_batchnorm"]


def _two_collected(swag: SWAG) -> None:
    """SWAG's variance (and its low-rank term) need two collected epochs."""
    if swag.collected < 2:
        recipe, what = swag._recipe(), "a variance" if swag.diag else "SWAG's low-rank term"
        raise ValueError(
            f"swa_start: {what} needs at least 2 collected epochs, this recipe collects "
            f"{swag.collected} (epochs={recipe.epochs}, swa_start={recipe.swa_start})"
        )


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
    _snapshots_needed: ClassVar[tuple[int, str]] = (2, "a variance")

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
        """The method as the meta records it: "swag", or "swag-diag" with `diag=True`."""
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
