"""Ensemble Model Patching (Chang et al., "Ensemble Model Patching"): EMP and ECMP layers.

A *patched* layer keeps K components of its parameters (for BatchNorm: γ and β; for a
Linear/Conv layer: weight and bias). Each component k is the variational Gaussian
N(M_k, σ²I) of Eq. (1), mixed with probabilities p_k. A forward pass that samples draws the
assignment Z of Eq. (1):

- EMP, Eq. (4): one component z ~ Categorical(p) for the whole layer per forward pass, shared
  by its weight and bias ("EMP samples each patch layer jointly", Fig. 2);
- ECMP, Eq. (5): an independent component for every element of the weight and of the bias.

`patch(model, k, mode, layers)` converts BatchNorm and input/output layers in place;
`patch_regularizer` is the L2 term of Eq. (6) and `emp_loss` adds it to the cross-entropy for
`peg.train.train`; `overhead` counts the added parameters (§3.3); `unpatch` converts back.

This module converts models and gathers the public names; the layers are in
`peg.layers.patched_module` (`PatchedModule`, the components and their sampling, with how they
read the points the paper leaves open) and `peg.layers.patched_layers` (BatchNorm, Linear,
Conv); the regulariser, the loss and the overhead in `peg.layers.patch_cost`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from peg.layers.patch_cost import emp_loss, overhead, patch_regularizer
from peg.layers.patched_layers import BN_TYPES, PatchedBatchNorm, PatchedConv, PatchedLinear
from peg.layers.patched_module import MODES as MODES
from peg.layers.patched_module import Mode, PatchedModule, _check_k, _check_mode, patched_modules
from peg.utils.scalars import check_number

#: The parts of `layers=` in `patch`, joined by "+" (e.g. "bn+output").
LAYER_PARTS: tuple[str, ...] = ("bn", "input", "output")
LINEAR_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def parse_layers(layers: Any) -> frozenset[str]:
    """The parts of a `layers=` string such as "bn", "bn+output" or "bn+input+output"."""
    parts = layers.split("+") if isinstance(layers, str) else None
    if not parts or any(p not in LAYER_PARTS for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(
            f"layers: expected parts of {LAYER_PARTS} joined by '+' (e.g. 'bn', 'bn+output', "
            f"'bn+input+output'), got {layers!r}"
        )
    return frozenset(parts)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _targets(model: nn.Module, parts: frozenset[str]) -> list[str]:
    """Names of the modules `layers` selects, in `named_modules` order."""
    names: list[str] = []
    if "bn" in parts:
        bns = [n for n, m in model.named_modules() if type(m) in BN_TYPES and m.affine]
        if not bns:
            raise ValueError(
                "layers: 'bn' selects affine nn.BatchNorm1d/2d/3d layers, the model has none"
            )
        names += bns
    io = [n for n, m in model.named_modules() if isinstance(m, LINEAR_TYPES)]
    for part, index in (("input", 0), ("output", -1)):
        if part not in parts:
            continue
        if not io:
            raise ValueError(f"layers: '{part}' needs an nn.Linear or nn.Conv layer, found none")
        name = io[index]
        if name == "":
            raise ValueError(
                "layers: the model is a single layer; wrap it, e.g. nn.Sequential(model)"
            )
        kind = type(model.get_submodule(name))
        if kind not in LINEAR_TYPES:
            raise ValueError(
                f"layers: the {part} layer {name!r} is a {kind.__name__}; "
                "only plain nn.Linear and nn.Conv1d/2d/3d can be patched"
            )
        names.append(name)
    return list(dict.fromkeys(names))  # the input and output layer may coincide


def patch(
    model: nn.Module,
    k: int = 5,
    mode: Mode = "emp",
    layers: str = "bn",
    noise: float = 0.1,
    sigma: float = 0.0,
    seed: int | None = None,
) -> nn.Module:
    """Turn `model` into an EMP/ECMP network in place and return it (the same object).

    The selected layers are replaced in their parents by `PatchedBatchNorm`, `PatchedLinear`
    or `PatchedConv` (parameters `*_components`, so the state-dict keys change; running
    statistics keep their names). Everything else stays shared (§3.1).

    Args:
        model: any nn.Module; not yet patched.
        k: components K per patched layer (the paper uses 5; K = 1 is the plain model).
        mode: "emp" (one component per layer per forward pass, Eq. 4) or "ecmp" (one per
            element, Eq. 5).
        layers: which layers to patch, parts joined by "+": "bn" (every affine BatchNorm),
            "output" (the last nn.Linear/nn.Conv in `named_modules` order), "input" (the first
            one); the paper's settings are "bn" and "bn+output".
        noise: components 1..K-1 start as the layer's parameters plus Gaussian noise whose
            standard deviation is `noise` × the RMS of the layer's weight (γ for BatchNorm;
            `noise` itself if that RMS is 0), for weight and bias alike. Component 0 keeps the
            exact values, so `unpatch(model, component=0)` returns the original layer.
        sigma: fixed σ of each Gaussian component (§3.1; 0 = point masses, see module doc).
        seed: seed of the initial noise (None: the global torch RNG).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    k = _check_k(k)
    mode = _check_mode(mode)
    parts = parse_layers(layers)
    noise = check_number(noise, "noise", allow_zero=True)
    sigma = check_number(sigma, "sigma", allow_zero=True)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ValueError(f"seed: expected an integer or None, got {seed!r}")
    if patched_modules(model):
        raise ValueError("model: already patched; call unpatch(model) first")
    gen = None if seed is None else torch.Generator().manual_seed(int(seed))
    for name in _targets(model, parts):
        old = model.get_submodule(name)
        cls = (
            PatchedBatchNorm
            if type(old) in BN_TYPES
            else (PatchedLinear if type(old) is nn.Linear else PatchedConv)
        )
        new = cls(old, k, mode, noise, sigma, gen)
        new.train(old.training)
        _replace(model, name, new)
    return model


def unpatch(model: nn.Module, component: int | None = None) -> nn.Module:
    """Replace every patched layer of `model` by its plain layer, in place; returns `model`.

    Args:
        component: None takes the mixture mean Σ_k p_k M_k of each parameter (the
            deterministic eval-mode weights); an index takes that component in every layer
            (component 0 right after `patch` is the original model).
    """
    found = patched_modules(model)
    if not found:
        raise ValueError("model: has no patched layers to unpatch")
    if "" in found:
        raise ValueError("model: is itself a patched layer; use model.to_plain()")
    for name, module in found.items():
        plain = module.to_plain(component)
        plain.train(module.training)
        _replace(model, name, plain)
    return model


def set_sampling(model: nn.Module, value: bool | None) -> nn.Module:
    """Set `sampling` on every patched layer (None: sample in train mode only); returns model."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"value: expected True, False or None, got {value!r}")
    for module in patched_modules(model).values():
        module.sampling = value
    return model


__all__ = [
    "PatchedBatchNorm",
    "PatchedConv",
    "PatchedLinear",
    "PatchedModule",
    "emp_loss",
    "overhead",
    "patch",
    "patch_regularizer",
    "patched_modules",
    "set_sampling",
    "unpatch",
]
