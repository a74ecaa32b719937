"""MC inference for Ensemble Model Patching (EMP/ECMP, Chang et al. §3.2, App. B.3).

A model patched with `peg.layers.patching.patch` and trained (e.g. `peg.train.train` with
`loss=emp_loss(model, weight)`) is an implicit ensemble: member s is one forward pass with a
fresh draw of the components of every patched layer (one per layer for EMP, one per element
for ECMP). The predictive distribution is the average of the S member softmax outputs (the
paper uses S = 20 to 200, App. D.6).

As with `MCDropout`, the model runs in eval mode (BatchNorm uses, and never updates, its
running statistics) with only the patched layers sampling, and the draws of member s on input
batch j come from the global RNG reseeded from the stream (seed, s, j) inside
`torch.random.fork_rng()`: they depend on nothing else, but do depend on the batching.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from peg.layers.patching import overhead, patched_modules, set_sampling
from peg.methods.base import SampledPredictor, store_arguments
from peg.source import Data, Source
from peg.source.batches import BatchFn


class MCPatched(SampledPredictor):
    """Monte Carlo inference of an EMP/ECMP-patched model: `n_members` stochastic passes.

    Args:
        n_members: number of members S (forward passes per input; the paper: up to 200).
        seed: seed of the component draws; member s on batch j depends only on (seed, s, j).
        batch_size: rows per forward pass when predicting a tensor.
        progress: show a progress bar over batches (None: only on a terminal).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches that are neither
            `(x, y, ...)` nor a mapping with "labels" (`peg.source.batches`); None: those
            conventions.

    After `fit(model)`: `model_` (a deep copy; the caller's model is never changed), `meta_`
    (method, hyper-parameters, parameter overhead), `member_logits(X) -> [S, N, C]`,
    `predict_proba(X) -> [N, C]`, `predict(X) -> [N]`, `len(self) == n_members`.
    """

    method = "mc_patched"
    label = "MC patching"

    def __init__(
        self,
        *,
        n_members: int = 20,
        seed: int = 0,
        batch_size: int = 512,
        progress: bool | None = None,
        batch_fn: BatchFn | None = None,
    ) -> None:
        store_arguments(self, locals())

    # ---------------------------------------------------------------- fitting
    def fit(
        self, model: nn.Module, val: Data | None = None, *, bn_data: Data | None = None
    ) -> MCPatched:
        """Copy a patched (and trained) `model` and get it ready to sample.

        Args:
            model: an nn.Module returning logits `[B, C]`, converted by
                `peg.layers.patching.patch`.
            val: optional inputs; only used to check, with one forward pass on two rows, that
                the model accepts them and returns `[B, C]`.
            bn_data: unused (accepted as by every post-hoc method): BatchNorm keeps the
                model's running statistics.
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        layers = patched_modules(model)
        if not layers:
            raise ValueError(
                f"model: {type(model).__name__} has no patched layers; convert it with "
                "peg.layers.patching.patch(model, k=5, mode='emp') and train it first"
            )
        self.model_ = copy.deepcopy(model)
        self._prepare()
        if val is not None:
            self._probe(Source(val, self.batch_fn, "val").probe(self._device()), "val")
        modes = sorted({m.mode for m in layers.values()})
        ks = sorted({m.k for m in layers.values()})
        self.meta_: dict[str, Any] = {
            "method": self.method,
            "mode": modes[0] if len(modes) == 1 else modes,
            "k": ks[0] if len(ks) == 1 else ks,
            "n_members": int(self.n_members),
            "seed": int(self.seed),
            "patched_layers": len(layers),
            "overhead": overhead(model)["total"],
        }
        return self

    def _prepare(self) -> None:
        """Eval mode everywhere (BatchNorm frozen, dropout off); patched layers sample."""
        self.model_.eval()
        set_sampling(self.model_, True)


__all__ = ["MCPatched"]
