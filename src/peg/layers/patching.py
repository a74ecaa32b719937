"""Ensemble Model Patching (Chang et al., "Ensemble Model Patching"): EMP and ECMP layers.

A *patched* layer keeps K components of its parameters (for BatchNorm: γ and β; for a
Linear/Conv layer: weight and bias). Each component k is the variational Gaussian
N(M_k, σ²I) of Eq. (1), mixed with probabilities p_k. A forward pass that samples draws the
assignment Z of Eq. (1):

- EMP, Eq. (4): one component z ~ Categorical(p) for the whole layer per forward pass, shared
  by its weight and bias ("EMP samples each patch layer jointly", Fig. 2);
- ECMP, Eq. (5): an independent component for every element of the weight and of the bias.

How this module reads the points the paper leaves open:

- σ is a fixed constant, not learned (§3.1 and App. B: "Σ_k = σ²I where σ is a fixed constant",
  "fixing σ to be small, e.g. machine epsilon"). The default σ = 0 is that choice made exact:
  machine-epsilon noise is numerically invisible, and σ = 0 keeps shared and patched layers
  deterministic given Z (bit-identical results, K = 1 equal to the plain model). `sigma > 0`
  adds σ·ε to every sampled parameter.
- Shared (non-patched) layers are the ordinary PyTorch layers (σ fixed, Eq. (3)).
- The mixing probabilities are fixed and uniform, p_k = 1/K (§2: "fixed to be uniform over all
  K ensemble components"); the `mix` buffer holds them for the sampler and the regulariser.
- When a layer samples: `module.sampling` is None by default, meaning "sample in train mode,
  not in eval mode"; True/False force it either way (`set_sampling`). A layer that does not
  sample uses the mixture mean Σ_k p_k M_k (deterministic eval). MC inference (the MC
  predictor `peg.methods.patching.MCPatched`) puts the model in eval mode, so BatchNorm uses
  and never updates its running statistics, and sets `sampling=True`.
- Sampling uses the global torch RNG (like dropout), so `torch.manual_seed` reproduces it.

`patch(model, k, mode, layers)` converts BatchNorm and input/output layers in place;
`patch_regularizer` is the L2 term of Eq. (6) and `emp_loss` adds it to the cross-entropy for
`peg.train.train`; `overhead` counts the added parameters (§3.3); `unpatch` converts back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._inputs import check_number

Mode = Literal["emp", "ecmp"]
MODES: tuple[str, ...] = ("emp", "ecmp")
#: The parts of `layers=` in `patch`, joined by "+" (e.g. "bn+output").
LAYER_PARTS: tuple[str, ...] = ("bn", "input", "output")
BN_TYPES: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
LINEAR_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: Input ranks each BatchNorm type accepts (as its `_check_input_dim`).
_BN_INPUT_DIMS: dict[type[nn.Module], tuple[int, ...]] = {
    nn.BatchNorm1d: (2, 3),
    nn.BatchNorm2d: (4,),
    nn.BatchNorm3d: (5,),
}
_CONV_FN: dict[type[nn.Module], Callable[..., Tensor]] = {
    nn.Conv1d: F.conv1d,
    nn.Conv2d: F.conv2d,
    nn.Conv3d: F.conv3d,
}


# ---------------------------------------------------------------- argument checks
def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k: expected an integer >= 1 (components per layer), got {k!r}")
    return int(k)


def _check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"mode: expected 'emp' or 'ecmp', got {mode!r}")
    return str(mode)


def parse_layers(layers: Any) -> frozenset[str]:
    """The parts of a `layers=` string such as "bn", "bn+output" or "bn+input+output"."""
    parts = layers.split("+") if isinstance(layers, str) else None
    if not parts or any(p not in LAYER_PARTS for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(
            f"layers: expected parts of {LAYER_PARTS} joined by '+' (e.g. 'bn', 'bn+output', "
            f"'bn+input+output'), got {layers!r}"
        )
    return frozenset(parts)


# ---------------------------------------------------------------- the patched layers
class PatchedModule(nn.Module):
    """Base of the patched layers: K components per parameter, their sampling and L2 term.

    Subclasses register each patched parameter `name` (e.g. "weight", "bias") as an
    `nn.Parameter` `{name}_components` of shape `[K, *shape]` (or None when the layer has no
    such parameter) and call `effective()` in `forward`.

    Attributes:
        k: number of components K.
        mode: "emp" (one component per layer per pass) or "ecmp" (one per element).
        sigma: fixed standard deviation σ of each Gaussian component (0: point masses).
        sampling: None (sample in train mode only), True (always) or False (never: mixture
            mean).
        mix: buffer `[K]`, the mixing probabilities p (uniform, fixed).
    """

    param_names: tuple[str, ...] = ("weight", "bias")

    def __init__(self, k: int, mode: str, sigma: float = 0.0) -> None:
        super().__init__()
        self.k = _check_k(k)
        self.mode = _check_mode(mode)
        self.sigma = check_number(sigma, "sigma", allow_zero=True)
        self.sampling: bool | None = None
        self.register_buffer("mix", torch.full((self.k,), 1.0 / self.k), persistent=False)

    def _init_components(
        self, name: str, value: Tensor | None, noise_std: float, gen: torch.Generator | None
    ) -> None:
        """Register `{name}_components` `[K, *value.shape]`: component 0 is `value` itself,
        components 1..K-1 are `value` plus N(0, noise_std²) noise (to break their symmetry)."""
        if value is None:
            self.register_parameter(f"{name}_components", None)
            return
        comps = value.detach().clone().unsqueeze(0).repeat(self.k, *([1] * value.ndim))
        if self.k > 1 and noise_std > 0:
            eps = torch.randn(comps[1:].shape, generator=gen, dtype=torch.float32)
            comps[1:] += (noise_std * eps).to(comps)
        self.register_parameter(f"{name}_components", nn.Parameter(comps))

    def components(self) -> dict[str, Tensor]:
        """The patched parameters' components, `{name: [K, *shape]}` (absent ones left out)."""
        out = {}
        for name in self.param_names:
            c = getattr(self, f"{name}_components")
            if c is not None:
                out[name] = c
        return out

    def is_sampling(self) -> bool:
        """Whether the next forward pass samples (see `sampling`)."""
        return self.training if self.sampling is None else bool(self.sampling)

    def mean(self) -> dict[str, Tensor]:
        """The mixture means Σ_k p_k M_k, `{name: [*shape]}`."""
        return {
            n: torch.tensordot(self.mix.to(c.dtype), c, dims=1)
            for n, c in self.components().items()
        }

    def component(self, index: int) -> dict[str, Tensor]:
        """Component `index` of every patched parameter, `{name: [*shape]}`."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise ValueError(f"component: expected an integer index, got {index!r}")
        if not -self.k <= index < self.k:
            raise ValueError(f"component: expected an index in [0, {self.k}), got {index}")
        return {n: c[index] for n, c in self.components().items()}

    def sample(self) -> dict[str, Tensor]:
        """One draw of the layer's parameters, `{name: [*shape]}` (global RNG).

        EMP (Eq. 4): one z ~ Categorical(p) for the layer, used by all its parameters.
        ECMP (Eq. 5): Z ~ Categorical(p) independently per element of each parameter.
        Then σ·ε is added when σ > 0 (Eq. 1).
        """
        comps = self.components()
        if self.mode == "emp":
            z = torch.multinomial(self.mix, 1)  # [1]: one component for the whole layer
            out = {n: c.index_select(0, z).squeeze(0) for n, c in comps.items()}
        else:
            out = {}
            for n, c in comps.items():
                z = torch.multinomial(self.mix, c[0].numel(), replacement=True)  # [numel]
                out[n] = c.gather(0, z.view(1, *c.shape[1:])).squeeze(0)
        if self.sigma > 0:
            out = {n: v + self.sigma * torch.randn_like(v) for n, v in out.items()}
        return out

    def effective(self) -> dict[str, Tensor]:
        """The parameters this forward pass uses: a sample, or the mixture mean."""
        return self.sample() if self.is_sampling() else self.mean()

    def regularizer(self) -> Tensor:
        """Σ_params Σ_k p_k/2 ‖M_k‖² (the patched terms of Eq. 6, without τ or ρ), a scalar."""
        total = self.mix.new_zeros(())
        for c in self.components().values():
            total = total + 0.5 * (self.mix.to(c.dtype) * c.pow(2).flatten(1).sum(1)).sum()
        return total

    def base_parameters(self) -> int:
        """Parameters of one component (= of the plain layer)."""
        return sum(c[0].numel() for c in self.components().values())

    def added_parameters(self) -> int:
        """Parameters added by patching, (K-1) × `base_parameters()` (§3.3)."""
        return (self.k - 1) * self.base_parameters()

    def to_plain(self, component: int | None = None) -> nn.Module:
        """The equivalent plain layer with the mixture mean (None) or one component."""
        raise NotImplementedError

    def _plain_values(self, component: int | None) -> dict[str, Tensor]:
        values = self.mean() if component is None else self.component(component)
        return {n: v.detach().clone() for n, v in values.items()}

    def extra_repr(self) -> str:
        return f"k={self.k}, mode={self.mode!r}, sigma={self.sigma}"


class PatchedBatchNorm(PatchedModule):
    """BatchNorm with K components of γ and β; normalisation as `nn.BatchNorm{1,2,3}d`.

    Built from an affine BatchNorm, whose running statistics (same buffer names) it keeps
    updating in train mode exactly as BatchNorm does. Input `[B, C, ...]` -> output of the
    same shape. Parameters: `weight_components`, `bias_components`, both `[K, C]`.
    """

    def __init__(
        self,
        bn: nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d,
        k: int,
        mode: str = "emp",
        noise: float = 0.1,
        sigma: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(k, mode, sigma)
        if type(bn) not in BN_TYPES or not bn.affine:
            raise ValueError(
                f"bn: expected an affine nn.BatchNorm1d/2d/3d, got {type(bn).__name__}"
                f"{'' if getattr(bn, 'affine', True) else ' with affine=False'}"
            )
        self.plain_type = type(bn)
        self.num_features = bn.num_features
        self.eps = bn.eps
        self.momentum = bn.momentum
        self.track_running_stats = bn.track_running_stats
        # The running statistics are taken over as they are (the same tensors).
        self.register_buffer("running_mean", bn.running_mean)
        self.register_buffer("running_var", bn.running_var)
        self.register_buffer("num_batches_tracked", bn.num_batches_tracked)
        std = _noise_std(noise, bn.weight)
        self._init_components("weight", bn.weight, std, generator)
        self._init_components("bias", bn.bias, std, generator)
        self.mix = self.mix.to(bn.weight.device)

    def forward(self, x: Tensor) -> Tensor:
        """`[B, C, ...]` normalised with the batch (train) or running (eval) statistics."""
        dims = _BN_INPUT_DIMS[self.plain_type]
        if x.dim() not in dims:
            raise ValueError(
                f"x: {self.plain_type.__name__} expects {' or '.join(f'{d}D' for d in dims)} "
                f"input, got {x.dim()}D"
            )
        # The factor and flags below follow nn.BatchNorm's own forward, so K = 1 is exact.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else factor
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        p = self.effective()
        return F.batch_norm(
            x,
            self.running_mean if track else None,
            self.running_var if track else None,
            p["weight"],
            p["bias"],
            use_batch,
            factor,
            self.eps,
        )

    def to_plain(self, component: int | None = None) -> nn.Module:
        """An `nn.BatchNorm{1,2,3}d` with γ, β from the mixture mean (None) or `component`."""
        values = self._plain_values(component)
        w = values["weight"]
        bn = self.plain_type(
            self.num_features,
            eps=self.eps,
            momentum=self.momentum,
            affine=True,
            track_running_stats=self.track_running_stats,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            bn.weight.copy_(w)
            bn.bias.copy_(values["bias"])
        bn.running_mean, bn.running_var = self.running_mean, self.running_var
        bn.num_batches_tracked = self.num_batches_tracked
        return bn

    def extra_repr(self) -> str:
        return f"{self.num_features}, {super().extra_repr()}"


class PatchedLinear(PatchedModule):
    """`nn.Linear` with K components of its weight `[K, O, I]` and bias `[K, O]`.

    Input `[B, ..., I]` -> output `[B, ..., O]`.
    """

    def __init__(
        self,
        linear: nn.Linear,
        k: int,
        mode: str = "emp",
        noise: float = 0.1,
        sigma: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(k, mode, sigma)
        if type(linear) is not nn.Linear:
            raise ValueError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        std = _noise_std(noise, linear.weight)
        self._init_components("weight", linear.weight, std, generator)
        self._init_components("bias", linear.bias, std, generator)
        self.mix = self.mix.to(linear.weight.device)

    def forward(self, x: Tensor) -> Tensor:
        """`x @ Wᵀ + b` with the drawn (or mean) W and b."""
        p = self.effective()
        return F.linear(x, p["weight"], p.get("bias"))

    def to_plain(self, component: int | None = None) -> nn.Module:
        """An `nn.Linear` with the mixture mean (None) or one component."""
        values = self._plain_values(component)
        w = values["weight"]
        layer = nn.Linear(
            self.in_features,
            self.out_features,
            bias="bias" in values,
            device=w.device,
            dtype=w.dtype,
        )
        _copy_into(layer, values)
        return layer

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {super().extra_repr()}"


class PatchedConv(PatchedModule):
    """`nn.Conv{1,2,3}d` with K components of its weight `[K, O, I/groups, *kernel]` and bias.

    Input `[B, I, *spatial]` -> output `[B, O, *spatial']`, as the plain convolution.
    """

    def __init__(
        self,
        conv: nn.Conv1d | nn.Conv2d | nn.Conv3d,
        k: int,
        mode: str = "emp",
        noise: float = 0.1,
        sigma: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(k, mode, sigma)
        if type(conv) not in _CONV_FN:
            raise ValueError(f"conv: expected an nn.Conv1d/2d/3d, got {type(conv).__name__}")
        self.plain_type = type(conv)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.padding, self.dilation = conv.padding, conv.dilation
        self.groups, self.padding_mode = conv.groups, conv.padding_mode
        self._reversed_padding_repeated_twice = conv._reversed_padding_repeated_twice
        std = _noise_std(noise, conv.weight)
        self._init_components("weight", conv.weight, std, generator)
        self._init_components("bias", conv.bias, std, generator)
        self.mix = self.mix.to(conv.weight.device)

    def forward(self, x: Tensor) -> Tensor:
        """The convolution with the drawn (or mean) kernel, as `nn.Conv*d.forward`."""
        p = self.effective()
        conv = _CONV_FN[self.plain_type]
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding: Any = 0
        else:
            padding = self.padding
        return conv(x, p["weight"], p.get("bias"), self.stride, padding, self.dilation, self.groups)

    def to_plain(self, component: int | None = None) -> nn.Module:
        """An `nn.Conv{1,2,3}d` with the mixture mean (None) or one component."""
        values = self._plain_values(component)
        w = values["weight"]
        layer = self.plain_type(
            self.in_channels,
            self.out_channels,
            self.kernel_size,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            bias="bias" in values,
            padding_mode=self.padding_mode,
            device=w.device,
            dtype=w.dtype,
        )
        _copy_into(layer, values)
        return layer

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, {super().extra_repr()}"
        )


def _noise_std(noise: float, weight: Tensor) -> float:
    """`noise` × RMS of the layer's weight (γ for BatchNorm), or `noise` itself if that is 0."""
    rms = float(weight.detach().float().pow(2).mean().sqrt()) if weight.numel() else 0.0
    return noise * (rms if rms > 0 else 1.0)


def _copy_into(layer: nn.Module, values: dict[str, Tensor]) -> None:
    with torch.no_grad():
        for name, value in values.items():
            getattr(layer, name).copy_(value)


# ---------------------------------------------------------------- model conversion
def patched_modules(model: nn.Module) -> dict[str, PatchedModule]:
    """The patched layers of `model` by qualified name, in `named_modules` order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, PatchedModule)}


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


# ---------------------------------------------------------------- regularisation and overhead
def patch_regularizer(model: nn.Module, shared: bool = True) -> Tensor:
    """The L2 term of Eq. (6) without its precisions: a scalar to add to the loss × τ.

    Σ_patched Σ_k p_k/2 ‖M_k‖² over the components of every patched layer, plus, with
    `shared=True`, Σ ½‖θ‖² over every other trainable parameter (the shared layers' term of
    Eq. 6). All precisions τ_i, ρ_j are taken equal (App. B.5), so `weight × this` is Eq. (6).
    With `shared=True` train with the optimiser's weight decay at 0, or the shared weights are
    regularised twice; `shared=False` leaves them to the optimiser's weight decay.
    """
    found = patched_modules(model)
    first = next(model.parameters(), None)
    total = torch.zeros((), device=first.device if first is not None else None)
    patched_ids = set()
    for module in found.values():
        total = total + module.regularizer()
        patched_ids.update(id(c) for c in module.components().values())
    if shared:
        for p in model.parameters():
            if p.requires_grad and id(p) not in patched_ids:
                total = total + 0.5 * p.pow(2).sum()
    return total


def emp_loss(
    model: nn.Module,
    weight: float,
    shared: bool = True,
    base: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
) -> Callable[[Tensor, Tensor], Tensor]:
    """A `loss(logits, y)` for `peg.train.train`: `base(logits, y) + weight × regulariser`.

    The negative ELBO of §3.2 with one MC draw per step (the training forward pass samples):
    the mean cross-entropy plus `weight × patch_regularizer(model, shared)`
    `weight` plays the role of the prior precision τ divided by the
    number of training points.
    """
    weight = check_number(weight, "weight", allow_zero=True)

    def loss(logits: Tensor, y: Tensor) -> Tensor:
        return base(logits, y) + weight * patch_regularizer(model, shared)

    return loss


# ---------------------------------------------------------------- regression


def overhead(model: nn.Module) -> dict[str, Any]:
    """Parameters added by patching (§3.3), per patched layer and in total.

    Each patched layer adds (K-1) × its plain parameter count: 2(K-1)N₂ for a BatchNorm over
    N₂ channels, (K-1)(I+1)O for a Linear layer with bias (so (K-1)((I₁+1)O₁ + (I_L+1)O_L)
    for the input and output layers), (K-1)k²IO for a k×k convolution without bias
    ((K-1)(k²I+1)O with one; I/groups for grouped ones).

    Returns `{"per_layer": {name: added}, "total": added, "base": parameters of the plain
    model, "ratio": total / base}`.
    """
    per_layer = {n: m.added_parameters() for n, m in patched_modules(model).items()}
    total = sum(per_layer.values())
    base = sum(p.numel() for p in model.parameters()) - total
    return {
        "per_layer": per_layer,
        "total": total,
        "base": base,
        "ratio": total / base if base else float("nan"),
    }


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
