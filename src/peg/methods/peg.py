"""PEG: Perturbed Ensemble via Gradient updates (the PEG paper, §3, Algorithms 1 and 2).

Member i of base model θ is one gradient step from θ on a random validation mini-batch Bᵢ:

    θᵢ = θ − η · ∇L(θ; Bᵢ)          (vanilla, Algorithm 1; every step restarts from θ;
                                     `direction="ascent"`: θ + η · ∇L(θ; Bᵢ), see below)

and, for the unbiased variant (§3, Claim 1: E[θᵢ − θ] = 0),

    θᵢ = θ − (η/√2)(∇L(B¹ᵢ) − ∇L(B²ᵢ)) − a·(β·v + η·∇L(V)),   a ~ N(0, 1).

Given a list of models (or an `Ensemble`), PEG runs on each (Algorithm 2): Q·R members.

Choices the paper leaves open (each an option, recorded in the saved ensemble):
- L is the **mean cross-entropy** of the mini-batch (`reduction="sum"` sums instead; a custom
  per-sample `loss` allows e.g. Gaussian NLL for regression).
- The sign of the step. Algorithm 1 writes θᵢ ← θ − η·∇θ p_θ(Bᵢ) with p_θ(B) the mean
  **log-likelihood** (§2): read literally, a step *up* the loss, away from fitting Bᵢ. It is not
  the same step as descending the loss: it is its opposite. We take the descent step
  (`direction="descent"`, the default, DESIGN.md's choice: each member is one SGD step on its
  mini-batch, which is what the paper's text describes); `direction="ascent"` takes the literal
  reading, θᵢ = θ + η·∇L(θ; Bᵢ). The unbiased variant's step is symmetric in sign (a and the
  two mini-batch gradients enter with either sign alike), so it takes the default only.
- The gradient pass runs with BatchNorm in **eval mode** (`bn="eval"`); `bn="batch"` uses
  batch statistics for the gradient pass (running statistics are left untouched);
  `bn="refresh"` re-estimates every member's running statistics on training data (`bn_data`),
  as SWAG does.
- Mini-batches are drawn without replacement within a batch, independently per member, from a
  stream seeded by (seed, base index, member index): an ensemble is reproducible from
  (base weights, validation data, seed, η, K, S). `save(path)` stores exactly that, a recipe
  (`peg.load(path, model, val=val)` rebuilds and checks the members); `save(path,
  materialize=True)` stores the members, loaded by `peg.load(path, model)` without data.
- Unbiased variant: ∇L(V) is the mean of `val_batches` mini-batch gradients, and v is the
  heavy-ball momentum accumulated over those same gradients (buf ← β·buf + g), scaled by η so
  it is a displacement like the other terms: v = η·buf. The paper does not say where v comes
  from; `momentum="none"` sets v = 0, and a dict of tensors (e.g. the training optimizer's
  `momentum_buffer`s, in gradient units) uses those instead.
- η: a number; a list (grid, every η scored); or "search": at most 3 exact scorings over
  1e-6…1e3, guided by the members' outputs interpolated along η (`search="surrogate"`,
  `peg.methods._surrogate`), or the paper's grid (0.001, 0.01, 0.1, 1) extended past its edges
  and refined by golden section in log space (`search="golden"`). Scored by validation NLL of
  the whole ensemble (`criterion`). The gradients are computed once and reused for every η.
  By default half of the validation set is held out for scoring η and the other half feeds the
  gradient steps (`eta_holdout=0.5`; 0 uses the same points for both, as the paper does).
  The chosen members are the ones scored (built from the gradient half).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from peg._params import ParamFilter, entry_views, flatten_state
from peg._progress import bar
from peg._scalars import check_positive_int
from peg.batches import BatchFn, call_model, move
from peg.errors import NonFiniteError
from peg.losses import cross_entropy_per_point, gaussian_nll_per_point
from peg.methods._criteria import Criterion
from peg.methods._members import DirectionData, RowSource
from peg.methods._perturb import MAX_SCORE_POINTS, BNMode, PerturbationEnsemble
from peg.methods.base import store_arguments
from peg.output import logits_of
from peg.streams import MEMBER, VALIDATION, generator

LossFn = Callable[[Tensor, Tensor], Tensor]
Momentum = Literal["validation", "none"] | Mapping[str, Tensor] | Sequence[Mapping[str, Tensor]]


def draw_batch(gen: torch.Generator, n: int, k: int) -> Tensor:
    """K distinct indices in [0, n), uniformly at random."""
    return torch.randperm(n, generator=gen)[:k]


class PEG(PerturbationEnsemble):
    """Perturbed Ensemble via Gradient updates.

    Args (all keyword-only):
        n_members: S, members per base model (the paper: 15 or 30; 5 per member of DeepEns-3).
        grad_batch_size: K, points per validation mini-batch of a gradient step (paper: 128).
        eta: step length η: a number > 0, a list of candidates, or "search" (see module doc).
        seed: seeds every mini-batch draw (and `a` in the unbiased variant).
        variant: "vanilla" (Algorithm 1) or "unbiased" (§3, Claim 1).
        direction: the vanilla step's sign: "descent" (default: θ − η·∇L, one SGD step on the
            mini-batch) or "ascent" (θ + η·∇L: Algorithm 1 read literally, its p_θ being the
            log-likelihood; see the module docstring). The unbiased variant is symmetric in
            sign and takes "descent" only.
        reduction: "mean" (default) or "sum" of the per-sample losses in a mini-batch.
        bn: "eval" (default), "batch" or "refresh" (needs `fit(..., bn_data=...)`).
        loss: per-sample loss `loss(outputs [B, C], y [B]) -> [B]`; default
            `peg.losses.cross_entropy_per_point` (`gaussian_nll_per_point` for float targets).
        params: which parameters to perturb: "all" trainable ones (default), "weights" (tensors
            with ndim ≥ 2, i.e. conv/linear weights), "last_layer" (the last Linear/Conv module
            with trainable parameters, in `named_modules()` order), a list of module names
            (their trainable parameters) or a callable (name, parameter) -> bool. When the
            perturbed parameters form a head after a fixed trunk (see `peg._heads`), the trunk
            runs once per batch, in the η search and in prediction.
        criterion: what η minimises on held-out validation data: "nll", "ece", "brier" or a
            callable (member_logits [M, N, C], y [N]) -> float.
        eta_holdout: fraction of the validation set held out for scoring η (when η is
            searched); 0 scores on the same points that feed the gradient steps.
        val_batches: unbiased variant: mini-batches averaged to estimate ∇L(V).
        beta: unbiased variant: momentum weight β (paper: 0.9).
        momentum: unbiased variant: where v comes from: "validation" (default), "none", or
            momentum buffers keyed by parameter name (one mapping, or one per base model).
        batch_size: rows per forward pass (scoring η, predicting).
        progress: show progress bars (None: only on a terminal).
        max_score_points: score η on a seeded random subset of at most this many held-out
            points (default 10,000, so a large validation set does not multiply the search's
            cost, nor its memory: the scoring points are gathered; None: all of them); the
            gradient steps still draw from the whole gradient part.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for validation batches (or items) that are
            neither `(x, y, ...)` tuples nor mappings with "labels"/"label" (`peg.batches`).
        on_nonfinite: a member whose loss or gradient is NaN/inf: "raise" (default,
            NonFiniteError naming it) or "drop" (left out; its index in `dropped_`).
        search: how η="search" is searched: "surrogate" (default): the grid's lowest η is
            scored exactly, the members' outputs are interpolated along η through the exactly
            scored ones (and the base's own, at η = 0), the criterion is minimised on that
            interpolant, and its minimiser is scored exactly, at most 3 exact scorings in all,
            fewer once the predicted gain is under half a standard error; the choice is the
            best η scored exactly (`peg.methods._surrogate`). "golden": the grid, extended
            past its edges, then golden section, raced (`race`, `early_stop`, `search_tol`);
            12–15 scorings. A list of η is always scored η by η.
        race: "golden" search or a list of η: with criterion "nll" or "brier" (means of
            per-point losses), score each new η
            against the best so far on the same points, a growing prefix of them (1024, then
            doubling), and stop once the mean paired difference is more than `race` standard
            errors from 0 (`peg.methods._search.PairedRace`): most comparisons are settled on
            a fraction of the points, and the choice is the one scoring every point would make
            unless a comparison is settled wrongly by chance (at the default z = 3, < 0.14% per
            look when the two η tie, less otherwise; the PEG-creation benchmark checks it).
            0 turns racing off: every η is scored on every point, with `early_stop`.
        early_stop: "golden" search or a list of η: with `race=0` and criterion "nll" or
            "brier" (means of non-negative
            per-point losses), stop scoring an η as soon as its partial sum over the scoring
            points already exceeds the best score so far; exact: the chosen η is the one an
            exhaustive search picks (`peg.methods._search`), only cheaper. False (with
            `race=0`) scores every η on every point.
        search_tol: "golden" search: when the best η lies on an edge of the grid, the grid is
            extended (at most
            3 steps) only while a step improves the criterion by more than this (default 1e-4:
            a flat curve, e.g. a well-calibrated base whose score keeps falling by 1e-5 nats
            as η → 0, stops after one step); 0 extends while the score improves at all.
        lazy: keep no stacked members after `fit`: each predict call builds them `chunk_size`
            at a time from their rows, kept as `lazy_store` says, and frees each chunk.
            "auto": lazy when the eager ensemble (its rows and stacked members, 2·S·R·P
            entries) would exceed `memory_budget`; `lazy_store_` says what was chosen (None:
            eager). `save()` writes the eager ensemble's recipe (docs/peg.md, Memory).
        lazy_store: what a lazy ensemble keeps of its rows: "full" (default: the eager members
            bit for bit, at the eager ensemble's predicting cost, in half its memory),
            "bfloat16" / "float16" (8 / 11 significant bits, a quarter; the displacements
            from the base rounded) or "regenerate" (nothing: every call recomputes the S
            gradients; the validation tensors are kept by reference, not to be modified).
        memory_budget: `lazy="auto"`: bytes the eager ensemble may take (default: half the
            memory available on the model's device when `fit` starts).
    """

    method = "PEG"
    scale_name = "eta"
    default_grid = (1e-3, 1e-2, 1e-1, 1.0)

    RENAMED_OPTIONS: ClassVar[dict[str, str]] = {
        **PerturbationEnsemble.RENAMED_OPTIONS,
        "batch_size": "grad_batch_size",
    }

    def __init__(
        self,
        *,
        n_members: int = 15,
        grad_batch_size: int = 128,
        eta: float | Sequence[float] | str = "search",
        seed: int = 0,
        variant: Literal["vanilla", "unbiased"] = "vanilla",
        reduction: Literal["mean", "sum"] = "mean",
        bn: BNMode = "eval",
        loss: LossFn | None = None,
        params: ParamFilter = "all",
        criterion: Criterion = "nll",
        eta_holdout: float = 0.5,
        val_batches: int = 10,
        beta: float = 0.9,
        momentum: Momentum = "validation",
        batch_size: int = 512,
        progress: bool | None = None,
        max_score_points: int | None = MAX_SCORE_POINTS,
        on_nonfinite: Literal["raise", "drop"] = "raise",
        early_stop: bool = True,
        search_tol: float = 1e-4,
        lazy: bool | Literal["auto"] = False,
        lazy_store: Literal["full", "bfloat16", "float16", "regenerate"] = "full",
        memory_budget: float | None = None,
        race: float = 3.0,
        batch_fn: BatchFn | None = None,
        search: Literal["surrogate", "golden"] = "surrogate",
        direction: Literal["descent", "ascent"] = "descent",
    ) -> None:
        store_arguments(self, locals())

    def _check_params(self) -> None:
        super()._check_params()
        check_positive_int(self.grad_batch_size, "grad_batch_size")
        if self.variant not in ("vanilla", "unbiased"):
            raise ValueError(f"variant: expected 'vanilla' or 'unbiased', got {self.variant!r}")
        if self.direction not in ("descent", "ascent"):
            raise ValueError(f"direction: expected 'descent' or 'ascent', got {self.direction!r}")
        if self.variant == "unbiased" and self.direction != "descent":
            raise ValueError(
                f"direction: {self.direction!r} applies to variant='vanilla' only; the unbiased "
                "variant's step is symmetric in sign (pass direction='descent')"
            )
        if self.reduction not in ("mean", "sum"):
            raise ValueError(f"reduction: expected 'mean' or 'sum', got {self.reduction!r}")
        if self.loss is not None and not callable(self.loss):
            raise ValueError(
                f"loss: expected a callable (outputs, y) -> per-sample losses, got {self.loss!r}"
            )
        holdout = self.eta_holdout
        if not (isinstance(holdout, (int, float)) and 0 <= holdout < 1):
            raise ValueError(f"eta_holdout: expected a fraction in [0, 1), got {holdout!r}")
        check_positive_int(self.val_batches, "val_batches")
        if not (isinstance(self.beta, (int, float)) and 0 <= self.beta < 1):
            raise ValueError(f"beta: expected a momentum weight in [0, 1), got {self.beta!r}")
        if isinstance(self.momentum, str) and self.momentum not in ("validation", "none"):
            raise ValueError(
                "momentum: expected 'validation', 'none' or a dict of tensors, "
                f"got {self.momentum!r}"
            )

    @property
    def _holdout(self) -> float:
        return float(self.eta_holdout)

    def _min_direction_points(self) -> int:
        return self.grad_batch_size

    def _recipe_options(self) -> dict[str, Any] | None:
        options = super()._recipe_options()
        if options is None or self.loss is not None or not isinstance(self.momentum, str):
            return None
        return {
            **options,
            "grad_batch_size": self.grad_batch_size,
            "variant": self.variant,
            "direction": self.direction,
            "reduction": self.reduction,
            "eta_holdout": self._holdout,
            "val_batches": self.val_batches,
            "beta": self.beta,
            "momentum": self.momentum,
        }

    def _hyperparameters(self) -> dict[str, Any]:
        return {
            "grad_batch_size": self.grad_batch_size,
            "variant": self.variant,
            "direction": self.direction,
            "reduction": self.reduction,
            "loss": getattr(self.loss, "__name__", "callable") if self.loss else "default",
            **(
                {
                    "val_batches": self.val_batches,
                    "beta": self.beta,
                    "momentum": self.momentum if isinstance(self.momentum, str) else "given",
                }
                if self.variant == "unbiased"
                else {}
            ),
        }

    # ---------------------------------------------------------------- gradients
    def _gradient_model(self, model: nn.Module) -> nn.Module:
        """A private copy of `model` in the mode the gradient pass runs in.

        The copy shares `model`'s parameters (they are only read: gradients are taken with
        `torch.autograd.grad`) and owns its buffers (bn="batch" moves them, then restores them).
        """
        work = copy.deepcopy(model, {id(p): p for p in model.parameters()}).eval()
        if self.bn == "batch":
            for m in work.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.train()
        return work

    def _row_source(
        self, model: nn.Module, r: int, names: list[str], data: DirectionData
    ) -> RowSource:
        """Displacements per unit η of base model r's members, on demand: member i is θ + η·D[i].

        Returns `rows(members) -> [k, P]`, row j computed for member `members[j]` alone from its
        stream (seed, MEMBER, r, i) (`peg.streams`). What all members share (the unbiased
        variant's ∇L(V) and momentum buffer, `[P]` each) is computed here, once.
        """
        work = self._gradient_model(model)
        params = dict(work.named_parameters())
        selected = [params[n] for n in names]
        buffers = {k: v.clone() for k, v in work.named_buffers()}
        device = selected[0].device
        dtype = functools.reduce(torch.promote_types, (p.dtype for p in selected))
        P = sum(p.numel() for p in selected)
        shapes = [p.shape for p in selected]
        K = self.grad_batch_size
        loss_fn = self.loss or (
            gaussian_nll_per_point if data.regression else cross_entropy_per_point
        )

        def grad(gen: torch.Generator, what: str, out: Tensor | None = None) -> Tensor:
            """∇L on the mini-batch drawn from `gen`, `[P]` (written into `out` if given)."""
            xb, yb = data.rows(draw_batch(gen, len(data), K))
            outputs = call_model(work, move(xb, device, "val"))
            losses = loss_fn(logits_of(outputs), yb.to(device))
            loss = losses.mean() if self.reduction == "mean" else losses.sum()
            if not torch.isfinite(loss):
                raise NonFiniteError(f"{what} (base model {r}): the loss is {loss.item()}")
            gs = list(torch.autograd.grad(loss, selected))
            if self.bn == "batch":  # the train-mode pass moved the running statistics: undo it
                with torch.no_grad():
                    for k, b in work.named_buffers():
                        b.copy_(buffers[k])
            # each gradient copied into its slice of g and freed at once: no [P] temporaries
            g = torch.empty(P, dtype=dtype, device=device) if out is None else out
            finite = True
            for j, part in enumerate(entry_views(g, shapes)):
                part.copy_(gs[j])
                gs[j] = None  # type: ignore[call-overload]
                finite = finite and bool(torch.isfinite(part).all())
            if not finite:
                raise NonFiniteError(
                    f"{what} (base model {r}): the gradient has NaN or inf entries"
                )
            return g

        buf = g_val = torch.zeros(0)
        if self.variant == "unbiased":  # ∇L(V) and the momentum buffer from `val_batches`
            buf = torch.zeros(P, dtype=dtype, device=device)
            g_val = torch.zeros_like(buf)
            for j in bar(range(self.val_batches), f"PEG ∇L(V) (base {r})", enabled=self.progress):
                g = grad(generator(self.seed, VALIDATION, r, j), f"validation batch {j}")
                buf = self.beta * buf + g
                g_val += g / self.val_batches
            buf = self._given_momentum(r, names, selected, buf)

        def step(i: int, out: Tensor) -> None:
            """Member i's row, written into `out` `[P]`."""
            gen = generator(self.seed, MEMBER, r, i)
            if self.variant == "vanilla":
                g = grad(gen, f"member {i}", out=out)
                if self.direction == "descent":
                    g.neg_()
                return
            g1, g2 = grad(gen, f"member {i}"), grad(gen, f"member {i}")
            a = torch.randn((), generator=gen).item()
            out.copy_(-((g1 - g2) / math.sqrt(2) + a * (self.beta * buf + g_val)))

        label = "PEG gradients" if self.variant == "vanilla" else "PEG unbiased steps"

        def rows(members: Sequence[int]) -> Tensor:
            D = torch.empty(len(members), P, dtype=dtype, device=device)
            for j, i in enumerate(bar(members, f"{label} (base {r})", enabled=self.progress)):
                try:
                    step(i, D[j])
                except NonFiniteError:  # with on_nonfinite="drop", a NaN row marks it
                    if self.on_nonfinite == "raise":
                        raise
                    D[j] = math.nan
            return D

        return rows

    def _given_momentum(
        self, r: int, names: list[str], selected: list[Tensor], buf: Tensor
    ) -> Tensor:
        """The momentum buffer v/η: estimated on validation data, zero, or supplied."""
        if self.momentum == "validation":
            return buf
        if self.momentum == "none":
            return torch.zeros_like(buf)
        given = self.momentum
        if not isinstance(given, Mapping):
            if r >= len(given):
                raise ValueError(f"momentum: {len(given)} buffers given, base model {r} has none")
            given = given[r]
        missing = [n for n in names if n not in given]
        if missing:
            raise ValueError(f"momentum: no buffer for parameters {missing[:5]}")
        for n, p in zip(names, selected, strict=True):
            if tuple(given[n].shape) != tuple(p.shape):
                raise ValueError(
                    f"momentum: buffer {n!r} has shape {tuple(given[n].shape)}, "
                    f"expected {tuple(p.shape)}"
                )
        return flatten_state(given, names, dtype=buf.dtype).to(buf.device)
