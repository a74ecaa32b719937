"""Monte Carlo dropout (Gal & Ghahramani 2016): members are stochastic forward passes.

Unlike the other methods this is not an `Ensemble` of stacked weights: member s is one forward
pass of the model with only its dropout modules in train mode (a fresh mask) and everything else
in eval mode, so BatchNorm uses, and never updates, its running statistics. It has the same
`member_logits -> [S, N, C]` interface, so metrics, benchmarks and plots treat it like any other.

Reproducibility: the masks of member s on input batch j are drawn from the global RNG reseeded
from the stream (seed, s, j) inside `torch.random.fork_rng()`, so they depend on nothing else
(not on the caller's RNG state, not on which members or batches were predicted before). They do
depend on how the inputs are cut into batches: the same seed with another `batch_size` gives
other (equally valid) masks.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from peg.methods import _constraints as checks
from peg.methods.base import SampledPredictor, store_arguments
from peg.methods.calibration.composed import CalibratedModel, Scaled, base_module
from peg.source import Data, Source
from peg.source.batches import BatchFn

DROPOUT_TYPES: tuple[type[nn.Module], ...] = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)
# Where `insert=p` puts a dropout layer: before the last of these modules.
INSERT_BEFORE: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def dropout_modules(model: nn.Module) -> list[nn.Module]:
    """The dropout modules of `model` (the types in `DROPOUT_TYPES`), in `named_modules` order."""
    return [m for m in model.modules() if isinstance(m, DROPOUT_TYPES)]


def insert_dropout(model: nn.Module, p: float) -> str:
    """Put `nn.Dropout(p)` right before the last Linear/Conv module of `model`, in place.

    That module (the last one in `named_modules()` order, usually the classifier) is replaced in
    its parent by `nn.Sequential(nn.Dropout(p), module)`. Its state-dict keys therefore gain a
    `.1` (`fc.weight` becomes `fc.1.weight`). Returns the name of the wrapped module.
    """
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, INSERT_BEFORE)]
    if not targets:
        raise ValueError(
            "insert: the model has no nn.Linear or nn.Conv module to put a dropout layer before"
        )
    name, module = targets[-1]
    if name == "":
        # The model is itself the Linear/Conv layer: wrap it as a whole instead of a child.
        raise ValueError(
            "insert: the model is a single layer; wrap it yourself: "
            "nn.Sequential(nn.Dropout(p), model)"
        )
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, nn.Sequential(nn.Dropout(p), module))
    return name


class SampledDropout(nn.Dropout):
    """`nn.Dropout` whose mask on a CPU is drawn as `rand >= p`: the same distribution (each
    entry kept with probability 1 − p, kept entries scaled by 1 / (1 − p)) from vectorised
    uniform draws, about 3× cheaper than `bernoulli_`, which drew one element at a time and
    cost a sixth of each sampled forward of a small CNN (and more with several threads, the
    draw being serial). On other devices, `nn.Dropout` itself (a fused kernel)."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        if self.p == 1:
            return x * 0.0
        # drawn in float32 whatever x's dtype, so that autocast keeps the masks of float32
        mask = torch.rand(x.shape, device=x.device).ge_(self.p)  # 1.0 kept, 0.0 dropped
        if x.dtype != mask.dtype:
            return x * mask.to(x.dtype) * (1.0 / (1.0 - self.p))
        return mask.mul_(x).mul_(1.0 / (1.0 - self.p))  # in place: no bool-to-float copy


def sampled_dropout(model: nn.Module) -> None:
    """Every `nn.Dropout` (that exact type) of `model` replaced, in place, by a
    `SampledDropout` of the same probability (same names, no state: the state dict is
    unchanged)."""
    for name, m in list(model.named_modules()):
        if type(m) is nn.Dropout and name:
            model.set_submodule(name, SampledDropout(m.p))


class MCDropout(SampledPredictor):
    """Monte Carlo dropout: `n_members` stochastic forward passes of one model, p̄(x) =
    (1/S) Σₛ softmax(f(x; maskₛ)) (Gal & Ghahramani 2016, "Dropout as a Bayesian
    Approximation", ICML).

    Args:
        n_members: number of members S (forward passes per input).
        seed: seed of the dropout masks; the mask of member s on batch j depends only on
            (seed, s, j).
        insert: a dropout probability in (0, 1) used only when the model has no dropout layer:
            `nn.Dropout(insert)` is then put right before its last Linear/Conv module (see
            `insert_dropout`; the copy's state-dict keys change). None: a model without dropout
            is an error. Ignored, with a warning, when the model already has dropout.
        batch_size: rows per forward pass when predicting a tensor.
        progress: show a progress bar over batches (None: only on a terminal).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches that are neither
            `(x, y, ...)` nor a mapping with "labels" (`peg.source.batches`); None: those
            conventions.

    After `fit(model)`: `model_` (the deep copy used; the caller's model is never changed),
    `meta_` (method and hyper-parameters), `member_logits(X) -> [S, N, C]`,
    `predict_proba(X) -> [N, C]`, `predict(X) -> [N]`, `len(self) == n_members`.
    """

    method = "mc_dropout"
    label = "MC dropout"

    def __init__(
        self,
        *,
        n_members: int = 15,
        seed: int = 0,
        insert: float | None = None,
        batch_size: int = 512,
        progress: bool | None = None,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        **SampledPredictor.parameter_constraints,
        "insert": checks.interval(0, 1, "a dropout probability", optional=True),
    }

    def _insert(self) -> float | None:
        return None if self.insert is None else float(self.insert)

    # ---------------------------------------------------------------- fitting
    def fit(
        self, model: nn.Module, val: Data | None = None, *, bn_data: Data | None = None
    ) -> MCDropout:
        """Copy `model` (adding a dropout layer if `insert` says so) and get it ready to sample.

        Args:
            model: a trained nn.Module returning logits `[B, C]`, or a temperature, vector or
                matrix scaling or Dirichlet calibration fitted on one (its calibrated module,
                `peg.methods.calibration.composed`; `insert` puts the dropout inside the model,
                before the calibration map).
            val: optional inputs ((X, y), a tensor or a loader); only used to check, with one
                forward pass on two rows, that the model accepts them and returns `[B, C]`.
            bn_data: unused (accepted as by every post-hoc method): BatchNorm keeps the
                model's running statistics.
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        model = base_module(model)  # a fitted TS / Dirichlet: the calibrated module
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        insert = self._insert()
        copied = copy.deepcopy(model)
        inserted_at = None
        if not dropout_modules(copied):
            if insert is None:
                raise ValueError(
                    f"model: {type(model).__name__} has no dropout layer "
                    f"({', '.join(t.__name__ for t in DROPOUT_TYPES)}); pass insert=p to put "
                    "nn.Dropout(p) before its last Linear/Conv layer, e.g. MCDropout(insert=0.2)"
                )
            # a calibrated module: before the model's last layer, not before the map
            inner = isinstance(copied, (CalibratedModel, Scaled))
            inserted_at = insert_dropout(copied.model if inner else copied, insert)
            inserted_at = f"model.{inserted_at}" if inner else inserted_at
        elif insert is not None:
            warnings.warn(
                f"insert={insert} ignored: the model already has dropout layers",
                UserWarning,
                stacklevel=2,
            )
        sampled_dropout(copied)  # masks drawn at the cost of a forward's small part
        self.model_ = copied
        self._prepare()
        if val is not None:
            self._probe(Source(val, self.batch_fn, "val").probe(self._device()), "val")
        self.meta_: dict[str, Any] = {
            "method": self.method,
            "n_members": int(self.n_members),
            "seed": int(self.seed),
            "insert": insert,
            "inserted_before": inserted_at,
            "dropout_layers": len(dropout_modules(copied)),
        }
        return self

    def _prepare(self) -> None:
        """Eval mode everywhere (BatchNorm frozen), train mode on dropout modules only."""
        self.model_.eval()
        for m in dropout_modules(self.model_):
            m.train()
