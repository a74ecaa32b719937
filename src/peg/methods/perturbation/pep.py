"""PEP: Parameter Ensembling by Perturbation (Mehrtash et al. 2020; the PEG paper's baseline).

Member i of base model θ is θ + σ·εᵢ with εᵢ ~ N(0, I) over the perturbed parameters. σ is
chosen on validation NLL around the bracket (5e-4, 5e-3) of the PEG paper's experiments. By
default (`search="surrogate"`, as PEG's η) the bracket's low end is scored first and at most
two more σ, chosen on the members' logits interpolated along σ, over the bracket widened by
three of its half-widths in log space on either side. `search="golden"` scores the bracket's
ends and their geometric mean, then `scipy.optimize.minimize_scalar(method="golden")` refines
σ in log space (walking outside the bracket when the best point is at one of its ends). The
noise εᵢ is drawn once, so every σ is scored with the same noise (common random numbers) and
a σ costs forward passes only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from peg._params import ParamFilter
from peg.methods._constraints import Check, one_of, scale
from peg.methods.base import store_arguments
from peg.methods.perturbation._members import DirectionData, RowSource
from peg.methods.perturbation._perturb import PerturbationEnsemble
from peg.methods.perturbation._scale_search import ScaleSearch, refuse_moved
from peg.source.batches import BatchFn
from peg.streams import MEMBER, generator


class PEP(PerturbationEnsemble):
    """Parameter Ensembling by Perturbation: Gaussian noise of scale σ around each base model,
    θᵢ = θ + σ·εᵢ with εᵢ ~ N(0, I), σ chosen on validation NLL (Mehrtash et al. 2020, "PEP:
    Parameter Ensembling by Perturbation", NeurIPS).

    Args (all keyword-only):
        n_members: members per base model.
        sigma: a number > 0, a list of candidates, or "search" (see `search`).
        seed: seeds the noise.
        params: "all" trainable parameters (default), "weights" (conv/linear weights only, as
            the original PEP code), "last_layer", a list of module names or a callable
            (name, parameter) -> bool (as PEG's).
        bn: "eval" (default) or "refresh" (re-estimate BatchNorm statistics per member on
            `fit(..., bn_data=...)`).
        batch_size: rows per forward pass (scoring σ, predicting).
        progress: show progress bars (None: only on a terminal).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for validation batches of another shape
            (`peg.source.batches`).
        on_nonfinite: "raise" (default) or "drop" members whose weights are NaN/inf.
        search: how σ is chosen when searched or given as a list: a `peg.ScaleSearch` or its
            method's name, "surrogate" (default, at most 3 exact scorings, see `PEG`) or
            "golden" (the grid extended and refined by golden section, raced). Its default grid
            is (5e-4, 1.58e-3, 5e-3), the PEG paper's σ bracket and its geometric mean.
        lazy: keep no stacked members after `fit`, build them a chunk at a time at each
            predict call from what `lazy_store` keeps of the noise ("full": as drawn, the
            eager members bit for bit; "bfloat16" / "float16": rounded; "regenerate": redrawn
            at every call, cheap next to predicting); "auto": lazy when the eager ensemble would
            exceed `memory_budget` (see `PEG`).
        lazy_store: see `lazy` and `PEG`.
        memory_budget: `lazy="auto"`: bytes the eager ensemble may take (see `PEG`).

    PEP has no gradient step: σ is scored on as many points as PEG holds out for η (the
    search's `holdout`, default half: the same points; up to its `max_points`), so that its
    search costs what PEG's does; `search=ScaleSearch(holdout=0)` scores on every point (the
    default before). It may be an IterableDataset (read once in order: checks, fingerprint,
    and the first `max_points` points kept for scoring).
    """

    method = "PEP"
    scale_name = "sigma"
    uses_direction_data = False

    def __init__(
        self,
        *,
        n_members: int = 15,
        sigma: float | Sequence[float] | str = "search",
        seed: int = 0,
        params: ParamFilter = "all",
        bn: Literal["eval", "refresh"] = "eval",
        batch_size: int = 512,
        progress: bool | None = None,
        on_nonfinite: Literal["raise", "drop"] = "raise",
        lazy: bool | Literal["auto"] = False,
        lazy_store: Literal["full", "bfloat16", "float16", "regenerate"] = "full",
        memory_budget: float | None = None,
        batch_fn: BatchFn | None = None,
        search: ScaleSearch | Literal["surrogate", "golden"] = "surrogate",
        **moved: Any,
    ) -> None:
        refuse_moved(moved)
        store_arguments(self, locals())

    parameter_constraints: ClassVar[dict[str, Check]] = {
        "sigma": scale,
        **PerturbationEnsemble.parameter_constraints,
        "bn": one_of("eval", "refresh"),  # no gradient pass: no batch statistics to use
    }

    # the PEG paper's σ bracket (5e-4, 5e-3) and its geometric mean
    default_grid = (5e-4, math.sqrt(5e-4 * 5e-3), 5e-3)

    def _score_cap(self, n: int, cap: int | None) -> int | None:
        """σ is scored on the round(holdout·n) points PEG holds out for η (the first of the same
        seeded permutation, up to `cap`), so that PEP's search costs what PEG's does (PEP-15's
        fit was 1.5-2 × PEG-15's on 512 points, docs/performance.md); `holdout=0`: on every
        point, as before."""
        share = self._search().holdout
        if share <= 0:
            return cap
        k = max(1, round(share * n))
        return k if cap is None else min(cap, k)

    def _row_source(
        self, model: nn.Module, r: int, names: list[str], data: DirectionData
    ) -> RowSource:
        """Standard normal noise, `rows(members) -> [k, P]`: one seeded stream per member."""
        params = dict(model.named_parameters())
        P = sum(params[n].numel() for n in names)
        device = params[names[0]].device

        def rows(members: Sequence[int]) -> Tensor:
            D = torch.empty(len(members), P)
            for j, i in enumerate(members):
                D[j] = torch.randn(P, generator=generator(self.seed, MEMBER, r, i))
            return D.to(device)

        return rows
