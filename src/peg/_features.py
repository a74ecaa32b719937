"""Features of a predictor's inputs for what reads them after deployment: the domain classifier
of weighted conformal prediction and the Mahalanobis / k-NN OOD detectors.

`Features(predictor, kind)` turns a batch of inputs (and the predictor's member logits of it)
into a float64 matrix `[B, D]`:

- `"penultimate"`: the output of the model's trunk, the model with its last layer
  (`_params.last_layer`) removed, found and checked by `_heads.find_split` (the same machinery
  that runs a last-layer ensemble's trunk once); for a fitted method, calibrator or ensemble
  the model is the one it wraps (an ensemble's first member: `source_` says so). A model with
  no separable trunk (a skip connection around its last layer, no parameters, saved logits)
  falls back to `"logits"`, with a warning and `kind_` saying so;
- `"logits"`: log p̄ `[B, C]`, the log of the predictor's averaged probabilities;
- `"inputs"`: the inputs flattened (tensor inputs only).

The trunk is found on the first batch, so a `Features` is built lazily by `__call__`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg._params import select_parameters
from peg.ensemble import Ensemble
from peg.metrics._inputs import ensemble_log_probs
from peg.output import logits_of
from peg.runtime.heads import Split, find_split
from peg.source import Data, is_pair
from peg.source._devices import move, weights_device
from peg.source.batches import call_model

FEATURES = ("penultimate", "logits", "inputs")


def check_features(features: Any, name: str = "features") -> None:
    if features not in FEATURES:
        raise ValueError(f"{name}: expected one of {list(FEATURES)}, got {features!r}")


def module_of(predictor: Any) -> tuple[nn.Module | None, str]:
    """The `nn.Module` whose features describe `predictor`'s inputs, and what it is: the
    predictor itself, the model a calibrator / fitted method wraps, an ensemble's first member;
    None (and why) for a predictor without one (saved logits, a foreign object)."""
    seen = type(predictor).__name__
    for _ in range(8):  # calibrators over calibrators over methods: a few levels at most
        if isinstance(predictor, Ensemble):
            if len(predictor) == 1:
                return predictor.member_model(0), "the ensemble's one member"
            return predictor.member_model(0), f"member 0 of {len(predictor)}"
        if isinstance(predictor, nn.Module) and not hasattr(predictor, "member_logits"):
            return predictor, "the model"
        if hasattr(predictor, "predictor_"):
            predictor = predictor.predictor_
        elif callable(getattr(predictor, "ensemble", None)):
            predictor = predictor.ensemble()
        elif isinstance(getattr(predictor, "model_", None), nn.Module):
            return predictor.model_, "the method's model"
        else:
            break
    return None, f"{seen} has no model to read features from"


class Features:
    """`features(inputs, logits) -> [B, D]` float64 (see the module doc)."""

    def __init__(
        self, predictor: Any, kind: str, outputs: Callable[[Tensor], Tensor] | None = None
    ) -> None:
        check_features(kind)
        self.predictor, self.requested = predictor, kind
        # "logits": log p̄ of a classifier; a regressor passes its own (the mean outputs)
        self.outputs = outputs or (lambda logits: ensemble_log_probs(logits).clamp_min(-1e4))
        self.kind_: str | None = None if kind == "penultimate" else kind
        self.trunk: nn.Module | None = None
        self.note = ""

    def _find_trunk(self, inputs: Any) -> None:
        model, what = module_of(self.predictor)
        split: Split | None = None
        reason = what
        if model is not None and isinstance(inputs, (Tensor, dict)):
            x = move(inputs, weights_device(model))
            try:
                head = set(select_parameters(model, "last_layer", x))
                split = find_split(model, head, [dict(model.state_dict())], x)
                reason = f"{what}: no trunk separable from its last layer"
            except ValueError as e:  # no Linear/Conv layer with parameters
                reason = f"{what}: {e}"
        if split is None:
            self.kind_, self.note = "logits", f"penultimate features unavailable ({reason})"
            warnings.warn(f"features: {self.note}; using the logits (log p̄) instead", stacklevel=4)
            return
        self.trunk, self.kind_, self.note = split.trunk.eval(), "penultimate", what

    @torch.no_grad()
    def __call__(self, inputs: Any, logits: Tensor) -> Tensor:
        if self.kind_ is None:
            self._find_trunk(inputs)
        if self.kind_ == "logits":
            return self.outputs(logits).double()
        if self.kind_ == "inputs":
            if not isinstance(inputs, Tensor):
                raise TypeError(
                    f"features: 'inputs' needs tensor inputs, got {type(inputs).__name__}; "
                    "use features='penultimate' or 'logits'"
                )
            return inputs.flatten(1).double()
        assert self.trunk is not None
        x = move(inputs, weights_device(self.trunk))
        return logits_of(call_model(self.trunk, x)).flatten(1).double()


def check_target_shape(val: Data, target: Data) -> None:
    """A clear error when in-memory target inputs have other features than val's."""
    if not is_pair(val) or not isinstance(target, (Tensor, np.ndarray)):
        return
    want, got = tuple(val[0].shape[1:]), tuple(target.shape[1:])
    if want != got:
        raise ValueError(
            f"target: expected inputs of shape [N, {', '.join(map(str, want))}] like val's, "
            f"got {tuple(target.shape)}"
        )
