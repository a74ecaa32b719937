"""Gaussians fitted to the last checkpoints of one training trajectory: `DiagonalGaussian` (per
weight mean and spread) and `LowRankGaussian` (mean plus the top principal directions)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from peg._params import flatten_state, unflatten_state
from peg.ensemble import Ensemble
from peg.methods import _constraints as checks
from peg.methods.base import FittedEnsemble, store_arguments
from peg.methods.trained.subspace._sampler import Sampler, SubspaceBN
from peg.source import Data
from peg.streams import generator
from peg.utils.progress import bar

Iterates = Sequence[Mapping[str, Tensor]] | Sequence[nn.Module] | Ensemble | FittedEnsemble


def _iterate_states(
    iterates: Iterates, skeleton: nn.Module | None
) -> tuple[nn.Module, list[dict[str, Tensor]]]:
    """(skeleton, state dicts) from a list of state dicts or modules, or an `Ensemble`."""
    if isinstance(iterates, FittedEnsemble):
        iterates = iterates.ensemble()
    if isinstance(iterates, Ensemble):
        states = [dict(iterates.member_state(i)) for i in range(len(iterates))]
        skeleton = iterates.skeleton if skeleton is None else skeleton
    elif isinstance(iterates, Sequence) and all(isinstance(m, nn.Module) for m in iterates):
        states = [dict(m.state_dict()) for m in iterates]
        skeleton = iterates[0] if (skeleton is None and iterates) else skeleton
    elif isinstance(iterates, Sequence) and all(isinstance(s, Mapping) for s in iterates):
        states = [dict(s) for s in iterates]
        if skeleton is None and states:
            raise ValueError(
                "skeleton: a list of state dicts needs the architecture: "
                "fit(iterates, skeleton=model)"
            )
    else:
        raise TypeError(
            "iterates: expected a list of state dicts (with skeleton=...), a list of nn.Modules "
            f"or a peg.Ensemble, got {type(iterates).__name__}"
        )
    if len(states) < 2:
        raise ValueError(
            f"iterates: expected at least 2 checkpoints to estimate a spread, got {len(states)}"
        )
    if not isinstance(skeleton, nn.Module):
        raise TypeError(f"skeleton: expected an nn.Module, got {type(skeleton).__name__}")
    expected = {k: v.shape for k, v in skeleton.state_dict().items()}
    for i, state in enumerate(states):
        if set(state) != set(expected):
            missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
            raise ValueError(
                f"iterates: checkpoint {i} does not match the architecture's state dict "
                f"(missing {missing[:5]}, unexpected {extra[:5]})"
            )
        bad = [k for k, shape in expected.items() if state[k].shape != shape]
        if bad:
            raise ValueError(
                f"iterates: checkpoint {i} has entries of the wrong shape: {bad[:5]} "
                f"({tuple(state[bad[0]].shape)} vs {tuple(expected[bad[0]])})"
            )
    return skeleton, [{k: v.detach() for k, v in s.items()} for s in states]


def _sampled_names(skeleton: nn.Module) -> list[str]:
    """The floating-point trainable parameters, in `named_parameters()` order."""
    names = [n for n, p in skeleton.named_parameters() if p.requires_grad and p.is_floating_point()]
    if not names:
        raise ValueError("skeleton: has no trainable floating-point parameters to sample")
    return names


class _IterateGaussian(Sampler):
    """Gaussians fitted to the last checkpoints θ₁…θ_K of one training trajectory.

    The sampled parameters are the floating-point trainable ones; everything else (buffers such
    as BatchNorm statistics, frozen parameters) is taken from the LAST iterate. Subclasses also
    take `scale`.
    """

    scale: float

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        **Sampler.parameter_constraints,
        "scale": checks.number(),
    }

    def _fit_moments(self, A: Tensor) -> None:
        """Fit the distribution to the iterates `A` `[K, P]` (float64)."""
        raise NotImplementedError

    def _sample(self, gen: torch.Generator) -> Tensor:
        """One sample `[P]` (float64)."""
        raise NotImplementedError

    def fit(
        self,
        iterates: Iterates,
        *,
        skeleton: nn.Module | None = None,
        bn_data: Data | None = None,
    ) -> _IterateGaussian:
        """Fit the Gaussian to `iterates` and draw `n_members` members from it.

        Args:
            iterates: ≥ 2 checkpoints of one trajectory, one architecture: a list of state
                dicts (then `skeleton` is required), a list of nn.Modules, or an `Ensemble`.
            skeleton: the architecture for a list of state dicts (default: the Ensemble's
                skeleton or the first module).
            bn_data: training inputs for bn='refresh'.

        Returns:
            self, with `ensemble_`, `param_names_` and the fitted moments.
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        skeleton, states = _iterate_states(iterates, skeleton)
        names = _sampled_names(skeleton)
        batches = self._bn_batches(bn_data)
        last = states[-1]
        device = last[names[0]].device
        A = torch.stack([flatten_state(s, names).double().cpu() for s in states])  # [K, P]
        self.param_names_ = names
        self.iterates_ = len(states)
        self.mean_ = A.mean(0).to(last[names[0]].dtype)
        self._fit_moments(A)
        members = []
        n = int(self.n_members)
        for s in bar(range(n), f"{self.method} ({n} samples)", enabled=self.progress):
            vector = self._sample(generator(self.seed, s)).to(device)
            state = unflatten_state(vector, last, names)
            members.append(self._refresh(skeleton, state, batches, s))
        meta = self._meta(iterates=len(states))
        self.ensemble_ = Ensemble.from_state_dicts(skeleton, members, meta)
        return self


class DiagonalGaussian(_IterateGaussian):
    """Diagonal Gaussian over the iterates: θ ~ N(μ, scale²·diag(σ²)).

    μ and σ are the per-entry mean and (unbiased, K−1) standard deviation over the K iterates,
    each entry sampled independently (like SWAG-diagonal, with the deviations measured from the
    mean of the iterates).

    Args:
        n_members: number of members.
        scale: multiplies σ, > 0.
        seed: random seed.
        bn: "eval" or "refresh" (needs `bn_data`).
        progress: progress bar over samples.

    After `fit`: `ensemble_`, `mean_` `[P]`, `std_` `[P]` (flat order: see the module docstring;
    names in `param_names_`).
    """

    method = "diagonal_gaussian"

    def __init__(
        self,
        *,
        n_members: int = 10,
        scale: float = 1.0,
        seed: int = 0,
        bn: SubspaceBN = "eval",
        progress: bool | None = None,
    ) -> None:
        store_arguments(self, locals())

    def _hyperparameters(self) -> dict[str, Any]:
        return {"scale": float(self.scale)}

    def _fit_moments(self, A: Tensor) -> None:
        self._mu, self._sigma = A.mean(0), A.std(0, correction=1)
        self.std_ = self._sigma.to(self.mean_.dtype)

    def _sample(self, gen: torch.Generator) -> Tensor:
        z = torch.randn(self._mu.shape, generator=gen, dtype=torch.float64)
        return self._mu + float(self.scale) * self._sigma * z


class LowRankGaussian(_IterateGaussian):
    """Low-rank (PCA) Gaussian over the iterates: θ = μ + scale·Σᵢ zᵢ vᵢ, z ~ N(0, I_k).

    The components are the top-k principal directions of the centred iterates A `[K, P]`
    (`torch.linalg.svd` of A, never a P×P matrix), scaled as vᵢ = sᵢ/√(K−1) · uᵢ (sᵢ the
    singular value, uᵢ the unit direction). With that scaling Σᵢ vᵢvᵢᵀ is the rank-k truncation
    of the sample covariance AᵀA/(K−1), so scale=1 samples match the iterates' spread along
    those directions. (The paper writes θ ~ μ + Σᵢ N(0, 1) vᵢ without stating the scale.)

    Args:
        n_members: number of members.
        rank: k, ≥ 1; at most K−1 (the rank of the centred iterates): larger values are
            lowered to K−1 with a warning.
        scale: multiplies the components, > 0.
        seed: random seed.
        bn: "eval" or "refresh" (needs `bn_data`).
        progress: progress bar over samples.

    After `fit`: `ensemble_`, `mean_` `[P]`, `components_` `[k, P]` (rows vᵢ), `rank_` (k used).
    """

    method = "lowrank_gaussian"

    def __init__(
        self,
        *,
        n_members: int = 10,
        rank: int = 5,
        scale: float = 1.0,
        seed: int = 0,
        bn: SubspaceBN = "eval",
        progress: bool | None = None,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        **_IterateGaussian.parameter_constraints,
        "rank": checks.positive_int(),
    }

    def _hyperparameters(self) -> dict[str, Any]:
        return {"rank": int(self.rank), "scale": float(self.scale)}

    def _fit_moments(self, A: Tensor) -> None:
        K = A.shape[0]
        k = int(self.rank)
        if k > K - 1:
            warnings.warn(
                f"rank={k} lowered to {K - 1}: {K} iterates span at most {K - 1} directions "
                "around their mean",
                UserWarning,
                stacklevel=3,
            )
            k = K - 1
        self._mu = A.mean(0)
        _, s, Vh = torch.linalg.svd(A - self._mu, full_matrices=False)  # Vh: [K, P]
        self._components = (s[:k, None] / math.sqrt(K - 1)) * Vh[:k]
        self.rank_ = k
        self.components_ = self._components.to(self.mean_.dtype)

    def _sample(self, gen: torch.Generator) -> Tensor:
        z = torch.randn(self.rank_, generator=gen, dtype=torch.float64)
        return self._mu + float(self.scale) * (z @ self._components)
