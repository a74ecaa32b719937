"""`PatchedModule`, the base of the patched layers of Ensemble Model Patching (Chang et al.): K
components per parameter, their sampling (EMP, ECMP), mixture mean and L2 term; and
`patched_modules`, which finds them in a model.

Each component k of a parameter is the variational Gaussian N(M_k, σ²I) of Eq. (1), mixed with
probabilities p_k. A forward pass that samples draws the assignment Z of Eq. (1): EMP (Eq. 4)
one component for the whole layer, ECMP (Eq. 5) one for every element (see `peg.layers.patching`).

How the patched layers read the points the paper leaves open:

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
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from peg.utils.scalars import check_number

Mode = Literal["emp", "ecmp"]
MODES: tuple[str, ...] = ("emp", "ecmp")


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k: expected an integer >= 1 (components per layer), got {k!r}")
    return int(k)


def _check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"mode: expected 'emp' or 'ecmp', got {mode!r}")
    return str(mode)


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


def patched_modules(model: nn.Module) -> dict[str, PatchedModule]:
    """The patched layers of `model` by qualified name, in `named_modules` order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, PatchedModule)}
