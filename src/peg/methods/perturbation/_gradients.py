"""PEG's gradient pass and its member steps: one step function per variant, chosen once.

`GradientPass` computes ∇L(θ; B) `[P]` over the perturbed parameters on a mini-batch drawn
from a seeded stream (BatchNorm mode, loss, reduction and the non-finite checks fixed when it
is made). A step writes member i's row of displacements per unit η into a `[P]` buffer:

- `vanilla_step`: −∇L(Bᵢ) (`direction="descent"`) or +∇L(Bᵢ) ("ascent");
- `unbiased_step`: −((∇L(B¹ᵢ) − ∇L(B²ᵢ))/√2 + a·(β·buf + ∇L(V))), a ~ N(0, 1);

and `preconditioned(step, apply)` follows a step with a preconditioner
(`peg.methods.perturbation._precondition`).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn

from peg._params import (
    entry_views,
    has_contiguous_cpu_convs,
    runs_channels_last,
    to_channels_last,
)
from peg.errors import NonFiniteError
from peg.losses import cross_entropy_per_point, gaussian_nll_per_point
from peg.methods.perturbation._members import DirectionData
from peg.output import logits_of
from peg.runtime.heads import Split, candidates, find_split
from peg.source.batches import call_model
from peg.streams import generator

LossFn = Callable[[Tensor, Tensor], Tensor]
# member i and its row buffer `[P]`, written in place
Step = Callable[[int, Tensor], None]


def draw_batch(gen: torch.Generator, n: int, k: int) -> Tensor:
    """K distinct indices in [0, n), uniformly at random."""
    return torch.randperm(n, generator=gen)[:k]


def gradient_model(model: nn.Module, bn: str, probe: Any = None) -> tuple[nn.Module, bool]:
    """A private copy of `model` in the mode the gradient pass runs in, and whether it runs
    channels-last.

    The copy shares `model`'s parameters (they are only read: gradients are taken with
    `torch.autograd.grad`) and owns its buffers (bn="batch" moves them, then restores them).
    Where `peg._params.runs_channels_last` says so for inputs like `probe` (a contiguous CNN on
    the CPU: the faster kernels there), the copy owns its parameters too, laid out
    channels-last, if a forward on the probe runs so (`to_channels_last`); the gradients are
    the same entries, up to rounding.
    """
    if probe is not None and runs_channels_last(model, probe):
        work = copy.deepcopy(model).eval()
        if to_channels_last(work, probe):
            return _batch_norm_mode(work, bn), True
    work = copy.deepcopy(model, {id(p): p for p in model.parameters()}).eval()
    return _batch_norm_mode(work, bn), False


def _batch_norm_mode(work: nn.Module, bn: str) -> nn.Module:
    """bn="batch": BatchNorm layers in train mode (batch statistics), the rest in eval mode."""
    if bn == "batch":
        for m in work.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.train()
    return work


class GradientPass:
    """Mini-batch gradients of base model r over the parameters `names`, `[P]` each.

    Args:
        model: the base model (copied by `gradient_model`, parameters shared).
        r: its index (named in errors).
        names: the perturbed parameters, in row order.
        data: the points the mini-batches are drawn from.
        batch_size: K, points per mini-batch.
        loss: per-sample loss (None: cross-entropy, or Gaussian NLL for float targets).
        reduction: "mean" or "sum" of the per-sample losses.
        bn: "eval", "batch" (train-mode BatchNorm, running statistics restored) or "refresh".

    When every perturbed parameter is in a head after a fixed trunk (`peg.runtime.heads`: last-layer
    PEG) and BatchNorm runs in eval mode, each drawn point's trunk features are computed once
    and kept (`[F]` a point), and only the head runs per mini-batch: S members' batches of K
    points drawn from n cost min(n, S·K) trunk forwards instead of S·K.
    """

    def __init__(
        self,
        model: nn.Module,
        r: int,
        names: list[str],
        data: DirectionData,
        batch_size: int,
        loss: LossFn | None,
        reduction: Literal["mean", "sum"],
        bn: str,
    ) -> None:
        probe = None  # two rows read only where a channels-last pass could be chosen
        if has_contiguous_cpu_convs(model):
            probe, _ = data.rows(torch.arange(min(2, len(data))))
        self.work, self.channels_last = gradient_model(model, bn, probe)  # then inputs are too
        params = dict(self.work.named_parameters())
        self.names, self.r, self.data, self.K = names, r, data, batch_size
        self.selected = [params[n] for n in names]
        self.restore = (
            {k: v.clone() for k, v in self.work.named_buffers()} if bn == "batch" else None
        )
        self.device = self.selected[0].device
        self.dtype = functools.reduce(torch.promote_types, (p.dtype for p in self.selected))
        self.P = sum(p.numel() for p in self.selected)
        self.shapes = [p.shape for p in self.selected]
        self.loss_fn = loss or (
            gaussian_nll_per_point if data.regression else cross_entropy_per_point
        )
        self.reduction = reduction
        # the shared trunk (None: the model runs whole) and the features computed so far
        self.split = self._find_split() if bn != "batch" else None
        self.kept: dict[int, tuple[Tensor, Tensor]] = {}  # point -> (features, label)

    def losses(self, gen: torch.Generator) -> Tensor:
        """Per-sample losses `[K]` of the mini-batch drawn from `gen` (graph kept)."""
        idx = draw_batch(gen, len(self.data), self.K)
        if self.split is None:
            xb, yb = self.data.rows(idx)
            if self.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            outputs = call_model(self.work, xb)  # rows come on the model's device (`ValSource`)
        else:
            features, yb = self._features(self.split, idx)
            outputs = self.split.head(features)
        return self.loss_fn(logits_of(outputs), yb)

    def _find_split(self) -> Split | None:
        """The trunk before every perturbed parameter, checked on the first two points."""
        if not candidates(self.work, set(self.names)):  # e.g. every parameter perturbed
            return None
        xb, _ = self.data.rows(torch.arange(min(2, len(self.data))))
        state = dict(self.work.state_dict())
        return find_split(self.work, set(self.names), [state], xb)

    @torch.no_grad()
    def _features(self, split: Split, idx: Tensor) -> tuple[Tensor, Tensor]:
        """The trunk's features `[K, ...]` of points `idx`, each point's computed once, and
        their labels `[K]`."""
        points = idx.tolist()
        new = [i for i in dict.fromkeys(points) if i not in self.kept]
        if new:
            xb, yb = self.data.rows(torch.tensor(new))
            features = logits_of(call_model(split.trunk, xb))
            self.kept.update((i, (f, y)) for i, f, y in zip(new, features, yb, strict=True))
        rows = [self.kept[i] for i in points]
        return torch.stack([f for f, _ in rows]), torch.stack([y for _, y in rows])

    def restore_buffers(self) -> None:
        """bn="batch": a train-mode pass moved the running statistics; undo it."""
        if self.restore is not None:
            with torch.no_grad():
                for k, b in self.work.named_buffers():
                    b.copy_(self.restore[k])

    def __call__(self, gen: torch.Generator, what: str, out: Tensor | None = None) -> Tensor:
        """∇L on the mini-batch drawn from `gen`, `[P]` (written into `out` if given)."""
        losses = self.losses(gen)
        loss = losses.mean() if self.reduction == "mean" else losses.sum()
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteError(f"{what} (base model {self.r}): the loss is {value}")
        gs = list(torch.autograd.grad(loss, self.selected))[::-1]  # popped in order below
        self.restore_buffers()
        # each gradient copied into its slice of g and freed at once: no [P] temporaries
        g = self.empty() if out is None else out
        for part in entry_views(g, self.shapes):
            part.copy_(gs.pop())
        if not bool(torch.isfinite(g).all()):  # one check of the row, not one per entry
            raise NonFiniteError(
                f"{what} (base model {self.r}): the gradient has NaN or inf entries"
            )
        return g

    def empty(self) -> Tensor:
        return torch.empty(self.P, dtype=self.dtype, device=self.device)


def vanilla_step(grad: GradientPass, seed: int, stream: Any, descent: bool) -> Step:
    """Member i's row: ∓∇L(Bᵢ), Bᵢ drawn from the stream (seed, `stream`, r, i)."""

    def step(i: int, out: Tensor) -> None:
        grad(generator(seed, stream, grad.r, i), f"member {i}", out=out)
        if descent:
            out.neg_()

    return step


def unbiased_step(grad: GradientPass, seed: int, stream: Any, drift: Tensor) -> Step:
    """Member i's row: −((∇L(B¹ᵢ) − ∇L(B²ᵢ))/√2 + a·drift), a ~ N(0, 1) from member i's
    stream; `drift` `[P]` = β·buf + ∇L(V), shared by every member."""

    def step(i: int, out: Tensor) -> None:
        gen = generator(seed, stream, grad.r, i)
        g1, g2 = grad(gen, f"member {i}"), grad(gen, f"member {i}")
        a = torch.randn((), generator=gen).item()
        out.copy_(-((g1 - g2) / math.sqrt(2) + a * drift))

    return step


def preconditioned(step: Step, apply: Callable[[Tensor], None]) -> Step:
    """`step`, then `apply(row)` (a preconditioner, in place) on its row."""

    def run(i: int, out: Tensor) -> None:
        step(i, out)
        apply(out)

    return run
