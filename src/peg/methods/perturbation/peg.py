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
  `peg.methods.perturbation._surrogate`), or the paper's grid (0.001, 0.01, 0.1, 1) extended past
  its edges and refined by golden section in log space (`search="golden"`). Scored by validation NLL
  of the whole ensemble (`search=peg.ScaleSearch(criterion=...)`, every option of the search
  there). The gradients are computed once and reused for every η.
  By default half of the validation set is held out for scoring η and the other half feeds the
  gradient steps (`ScaleSearch(holdout=0.5)`; 0 uses the same points for both, as the paper
  does).
  The chosen members are the ones scored (built from the gradient half).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from peg._params import ParamFilter, flatten_state
from peg.errors import NonFiniteError
from peg.methods._constraints import (
    Check,
    described,
    fraction,
    number,
    one_of,
    optional_callable,
    positive_int,
    scale,
)
from peg.methods.base import store_arguments
from peg.methods.perturbation._gradients import (
    GradientPass,
    LossFn,
    draw_batch,
    preconditioned,
    unbiased_step,
    vanilla_step,
)
from peg.methods.perturbation._members import DirectionData, RowSource
from peg.methods.perturbation._perturb import BNMode, PerturbationEnsemble
from peg.methods.perturbation._precondition import DEFAULT_DAMPING, PRECONDITIONERS, preconditioner
from peg.methods.perturbation._scale_search import ScaleSearch, refuse_moved
from peg.source.batches import BatchFn
from peg.streams import MEMBER, VALIDATION, generator
from peg.utils.progress import bar

__all__ = ["PEG", "LossFn", "Momentum", "draw_batch"]

Momentum = Literal["validation", "none"] | Mapping[str, Tensor] | Sequence[Mapping[str, Tensor]]


def _momentum(value: Any, name: str) -> None:
    if isinstance(value, str) and value not in ("validation", "none"):
        raise ValueError(
            f"{name}: expected 'validation', 'none' or a dict of tensors, got {value!r}"
        )


def _shown(value: Any) -> Any:
    """An option as the meta shows it: a callable by its name, momentum buffers as "given"."""
    if callable(value):
        return getattr(value, "__name__", "callable")
    return value if value is None or isinstance(value, (str, int, float)) else "given"


def _ascent_vanilla_only(peg: PEG) -> None:
    if peg.variant == "unbiased" and peg.direction != "descent":
        raise ValueError(
            f"direction: {peg.direction!r} applies to variant='vanilla' only; the unbiased "
            "variant's step is symmetric in sign (pass direction='descent')"
        )


class PEG(PerturbationEnsemble):
    """Perturbed Ensemble via Gradient updates: member i is θᵢ = θ − η·∇L(θ; Bᵢ), one gradient
    step from the trained θ on a random validation mini-batch Bᵢ, η chosen on validation NLL
    (the PEG paper, §3, Algorithm 1; docs/peg.md).

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
            perturbed parameters form a head after a fixed trunk (see `peg.runtime.heads`), the
            trunk runs once per batch, in the η search and in prediction.
        val_batches: unbiased variant: mini-batches averaged to estimate ∇L(V).
        beta: unbiased variant: momentum weight β (paper: 0.9).
        momentum: unbiased variant: where v comes from: "validation" (default), "none", or
            momentum buffers keyed by parameter name (one mapping, or one per base model).
        batch_size: rows per forward pass (scoring η, predicting).
        progress: show progress bars (None: only on a terminal).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for validation batches (or items) that are
            neither `(x, y, ...)` tuples nor mappings with "labels"/"label" (`peg.source.batches`).
        on_nonfinite: a member whose loss or gradient is NaN/inf: "raise" (default,
            NonFiniteError naming it) or "drop" (left out; its index in `dropped_`).
        search: how η is chosen when searched or given as a list: a `peg.ScaleSearch` (its
            method, criterion, held-out fraction, scoring points, racing, grid), or its method's
            name: "surrogate" (default: at most 3 exact scorings, on 1024 held-out points
            first, more only while the η are undecided or the next one is within noise) or
            "golden" (the grid, extended, then golden section, raced; 12–15 scorings). By
            default η minimises the validation NLL on the half of the validation set held out
            from the gradient steps.
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
        precondition: None (default: plain PEG), "kfac" or "diag": each member's gradient row g
            becomes λ·(F + λ)⁻¹·g, F the Fisher of the perturbed parameters estimated from
            `val_batches` mini-batches of the gradient part: Kronecker-factored per Linear /
            Conv2d layer ("kfac"; another layer type among the perturbed ones is an error
            naming it) or its diagonal, as Adam's second moment ("diag"). The members then
            spread less in the sharpest directions, more like a Laplace posterior
            (`peg.methods.perturbation._precondition`, docs/peg.md#preconditioned-steps).
        damping: λ relative to F's mean eigenvalue (> 0, default 0.1): large → plain PEG's
            members at the same η; small → a stronger reshaping. η is searched as without.

    Examples:
        >>> import torch, peg
        >>> from torch import nn
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.randn(600, 2, generator=g)
        >>> y = (X[:, 0] > 0).long()
        >>> model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
        >>> optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
        >>> for _ in range(50):  # a trained classifier
        ...     optimiser.zero_grad()
        ...     nn.functional.cross_entropy(model(X[:100]), y[:100]).backward()
        ...     optimiser.step()
        >>> model = model.eval()
        >>> ensemble = peg.PEG(n_members=5, progress=False).fit(model, (X[100:400], y[100:400]))
        >>> ensemble.member_logits(X[400:]).shape  # [M, N, C]
        torch.Size([5, 200, 2])
        >>> ensemble.predict_proba(X[400:]).shape  # the members' softmax averaged
        torch.Size([200, 2])

    See Also:
        peg.PEP: members by random perturbations instead of gradient steps.
        peg.TemperatureScaling: a map on the logits, to compose with PEG ("PEG + TS").
        peg.compare: PEG next to TS, PEP and the others on one model.
        docs/peg.md: how PEG builds its members, η's search, and its options.
    """

    method = "PEG"
    scale_name = "eta"
    default_grid = (1e-3, 1e-2, 1e-1, 1.0)

    # peg 0.1's PEG called the gradient mini-batch `batch_size` (now `grad_batch_size`) and
    # the prediction batch `eval_batch_size` (now `batch_size`): version-1 recipes only
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
        val_batches: int = 10,
        beta: float = 0.9,
        momentum: Momentum = "validation",
        batch_size: int = 512,
        progress: bool | None = None,
        on_nonfinite: Literal["raise", "drop"] = "raise",
        lazy: bool | Literal["auto"] = False,
        lazy_store: Literal["full", "bfloat16", "float16", "regenerate"] = "full",
        memory_budget: float | None = None,
        batch_fn: BatchFn | None = None,
        search: ScaleSearch | Literal["surrogate", "golden"] = "surrogate",
        direction: Literal["descent", "ascent"] = "descent",
        precondition: Literal["diag", "kfac"] | None = None,
        damping: float = DEFAULT_DAMPING,
        **moved: Any,
    ) -> None:
        refuse_moved(moved)
        store_arguments(self, locals())

    parameter_constraints: ClassVar[dict[str, Check]] = {
        "eta": scale,
        **PerturbationEnsemble.parameter_constraints,
        "grad_batch_size": positive_int(),
        "variant": one_of("vanilla", "unbiased"),
        "direction": one_of("descent", "ascent"),
        "reduction": one_of("mean", "sum"),
        "loss": optional_callable("a callable (outputs, y) -> per-sample losses"),
        "val_batches": positive_int(),
        "beta": fraction(what="a momentum weight"),
        "momentum": described(
            _momentum, "'validation', 'none' or momentum buffers (a dict of tensors per base)"
        ),
        "precondition": one_of(*PRECONDITIONERS),
        "damping": number(),
    }
    parameter_rules: ClassVar[tuple[Callable[[Any], None], ...]] = (_ascent_vanilla_only,)

    recorded_options: ClassVar[tuple[str, ...]] = (
        *PerturbationEnsemble.recorded_options,
        "grad_batch_size",
        "variant",
        "direction",
        "reduction",
        "loss",
        "val_batches",
        "beta",
        "momentum",
        "precondition",
        "damping",
    )

    @property
    def _holdout(self) -> float:
        return float(self._search().holdout)

    def _min_direction_points(self) -> int:
        return self.grad_batch_size

    def _expressible(self) -> bool:
        return super()._expressible() and self.loss is None and isinstance(self.momentum, str)

    def _hyperparameters(self) -> dict[str, Any]:
        """PEG's own options as the meta shows them (a callable by its name, given momentum
        buffers as "given"), and with "kfac" which layer got which curvature."""
        shown = {
            name: _shown(getattr(self, name))
            for name in self.recorded_options
            if name not in PerturbationEnsemble.recorded_options
        }
        if shown["loss"] is None:
            shown["loss"] = "default"
        if self.precondition == "kfac" and getattr(self, "_curvature", None):
            shown["curvature"] = self._curvature
        return shown

    # ---------------------------------------------------------------- gradients
    def _row_source(
        self, model: nn.Module, r: int, names: list[str], data: DirectionData
    ) -> RowSource:
        """Displacements per unit η of base model r's members, on demand: member i is θ + η·D[i].

        Returns `rows(members) -> [k, P]`, row j computed for member `members[j]` alone from its
        stream (seed, MEMBER, r, i) (`peg.streams`) by the variant's step
        (`peg.methods.perturbation._gradients`), chosen here once. What all members share (the
        unbiased variant's ∇L(V) and momentum buffer, `[P]` each) is computed here, once.
        """
        grad = GradientPass(
            model, r, names, data, self.grad_batch_size, self.loss, self.reduction, self.bn
        )
        if self.variant == "vanilla":
            step = vanilla_step(grad, self.seed, MEMBER, self.direction == "descent")
            label = "PEG gradients"
        else:
            step = unbiased_step(grad, self.seed, MEMBER, self._drift(grad, r, names))
            label = "PEG unbiased steps"
        if self.precondition is not None:  # the curvature, from `val_batches` mini-batches
            apply, layout = preconditioner(
                self.precondition,
                grad,
                names,
                self.seed,
                self.val_batches,
                self.damping,
                self.__dict__.get("_kfac_rows", True),  # False: a recipe of version < 4
            )
            self._curvature = layout  # meta_["curvature"]: which layer got which
            step = preconditioned(step, apply)

        def rows(members: Sequence[int]) -> Tensor:
            D = torch.empty(len(members), grad.P, dtype=grad.dtype, device=grad.device)
            for j, i in enumerate(bar(members, f"{label} (base {r})", enabled=self.progress)):
                try:
                    step(i, D[j])
                except NonFiniteError:  # with on_nonfinite="drop", a NaN row marks it
                    if self.on_nonfinite == "raise":
                        raise
                    D[j] = math.nan
            return D

        return rows

    def _drift(self, grad: GradientPass, r: int, names: list[str]) -> Tensor:
        """The unbiased variant's shared term β·buf + ∇L(V), `[P]`: ∇L(V) the mean of
        `val_batches` mini-batch gradients, buf their heavy-ball momentum (or the given one)."""
        buf = grad.empty().zero_()
        g_val = torch.zeros_like(buf)
        for j in bar(range(self.val_batches), f"PEG ∇L(V) (base {r})", enabled=self.progress):
            g = grad(generator(self.seed, VALIDATION, r, j), f"validation batch {j}")
            buf = self.beta * buf + g
            g_val += g / self.val_batches
        buf = self._given_momentum(r, names, grad.selected, buf)
        return self.beta * buf + g_val

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
