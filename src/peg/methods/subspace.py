"""Subspace samplers around one solution (Fort et al. 2019, "Deep Ensembles: A Loss Landscape
Perspective", §4.2): random directions, dropout on the weights, diagonal and low-rank Gaussians.

Every sampler builds full state dicts from a base state dict in which only the sampled trainable
parameters change, and holds them as an `Ensemble` (`ensemble_`). Parameters are handled as one
flat vector `[P]` (`peg._params`): the selected parameters in `named_parameters()` order, each
flattened row-major (`reshape(-1)`); `mean_`, `std_` and `components_` use that order (names in
`param_names_`).

BatchNorm: `bn="eval"` (default) keeps the base running statistics in every sample;
`bn="refresh"` re-estimates them per sample on `bn_data` (`torch.optim.swa_utils.update_bn`, as
SWAG does), under a seeded RNG so dropout during that pass stays reproducible.

Random streams: draw d of a sampler uses `generator(seed, d)`, so the members depend only on
(base weights, hyper-parameters, seed).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call

from peg._inputs import (
    Data,
    as_xy,
    check_number,
    check_positive_int,
    diagnose,
    eval_mode,
    iter_inputs,
    model_device,
    to_device,
    weights_device,
)
from peg._params import ParamFilter, flatten_state, refresh_bn, select_parameters, unflatten_state
from peg._progress import bar
from peg.ensemble import Ensemble, model_output
from peg.methods.base import FittedEnsemble, store_arguments
from peg.metrics._inputs import check_labels
from peg.streams import SUBSPACE_BN, generator

SubspaceBN = Literal["eval", "refresh"]
BN_BATCH_SIZE = 256  # rows per batch when bn_data is a tensor (a loader keeps its own batches)
EVAL_BATCH_SIZE = 512  # rows per forward pass when checking min_accuracy
MAX_DRAWS_PER_SAMPLE = 10  # min_accuracy: give up after this many draws per requested sample


# ---------------------------------------------------------------- checks
def _check_bn(bn: Any) -> None:
    if bn not in ("eval", "refresh"):
        raise ValueError(f"bn: expected 'eval' or 'refresh', got {bn!r}")


def _param_label(params: ParamFilter) -> str:
    return params if isinstance(params, str) else getattr(params, "__name__", "callable")


# ---------------------------------------------------------------- shared machinery
class _Sampler(FittedEnsemble):
    """What every subspace sampler shares: validation, BatchNorm handling, the `Ensemble`.

    Subclasses take (keyword-only) at least `n_members`, `seed`, `bn` and `progress`.
    """

    method = "subspace"
    n_members: int
    seed: int
    bn: SubspaceBN
    progress: bool | None

    def _check_params(self) -> None:
        check_positive_int(self.n_members, "n_members")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")
        _check_bn(self.bn)

    def _hyperparameters(self) -> dict[str, Any]:
        return {}

    def _meta(self, **extra: Any) -> dict[str, Any]:
        return {
            "method": self.method,
            "n_members": int(self.n_members),
            "seed": self.seed,
            "bn": self.bn,
            **self._hyperparameters(),
            **extra,
        }

    def _bn_batches(self, bn_data: Data | None) -> list[Tensor] | None:
        """Input batches for bn='refresh' (None for bn='eval'); checked before any sampling."""
        if self.bn != "refresh":
            return None
        if bn_data is None:
            raise ValueError(
                "bn_data: bn='refresh' re-estimates BatchNorm statistics per sample and needs "
                "training inputs: fit(..., bn_data=train_loader)"
            )
        batches = list(iter_inputs(bn_data, BN_BATCH_SIZE))
        if not batches:
            raise ValueError("bn_data: the data is empty (0 samples)")
        return batches

    def _refresh(
        self,
        skeleton: nn.Module,
        state: dict[str, Tensor],
        batches: list[Tensor] | None,
        d: int,
    ) -> dict[str, Tensor]:
        """`state` with re-estimated BatchNorm statistics when bn='refresh', else unchanged."""
        if batches is None:
            return state
        # update_bn runs in train mode: seed any dropout in that pass from (seed, SUBSPACE_BN, d).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(generator(self.seed, SUBSPACE_BN, d).initial_seed()))
            return refresh_bn(skeleton, state, batches)


def _accuracy(probe: nn.Module, state: Mapping[str, Tensor], X: Tensor, y: Tensor) -> float:
    """Accuracy of `probe` (eval mode) carrying the weights `state` on (X, y)."""
    device = next(iter(state.values())).device
    correct = 0
    with torch.no_grad():
        for start in range(0, len(X), EVAL_BATCH_SIZE):
            x = X[start : start + EVAL_BATCH_SIZE].to(device)
            out = model_output(functional_call(probe, dict(state), (x,)), "val")
            correct += int((out.argmax(-1).cpu() == y[start : start + EVAL_BATCH_SIZE]).sum())
    return correct / len(X)


class _AroundSolution(_Sampler):
    """Samplers that change the weights θ₀ of one trained model, optionally keeping only
    samples with a validation accuracy of at least `min_accuracy` (the paper used 0.65).

    Subclasses also take `params` and `min_accuracy`.
    """

    params: ParamFilter
    min_accuracy: float | None

    def _check_params(self) -> None:
        super()._check_params()
        params, min_accuracy = self.params, self.min_accuracy
        if not (params in ("all", "weights") or callable(params)):
            raise ValueError(f"params: expected 'all', 'weights' or a callable, got {params!r}")
        if min_accuracy is not None and not (
            isinstance(min_accuracy, (int, float))
            and not isinstance(min_accuracy, bool)
            and 0 <= min_accuracy <= 1
        ):
            raise ValueError(
                f"min_accuracy: expected an accuracy in [0, 1] or None, got {min_accuracy!r}"
            )

    def _min_accuracy(self) -> float | None:
        return None if self.min_accuracy is None else float(self.min_accuracy)

    def _draw(self, theta0: Tensor, gen: torch.Generator) -> tuple[Tensor, float]:
        """One sample `[P]` from θ₀ `[P]` and the scalar recorded for it (t or p_keep)."""
        raise NotImplementedError

    def _prepare(self, theta0: Tensor) -> None:
        """Per-fit quantities computed from θ₀ (before any draw)."""

    def _record(self, values: list[float]) -> None:
        raise NotImplementedError

    def fit(
        self, model: nn.Module, val: Data | None = None, *, bn_data: Data | None = None
    ) -> _AroundSolution:
        """Sample `n_members` members around the trained `model`.

        Args:
            model: a trained nn.Module (left unchanged).
            val: (X, y) validation data; needed only for `min_accuracy`.
            bn_data: training inputs for bn='refresh' (a tensor, (X, y) or a loader).

        Returns:
            self, with `ensemble_`, `param_names_`, `draws_` (draws made, rejected ones
            included) and the per-sample values of the subclass (`ts_` or `keeps_`).
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        names = select_parameters(model, self.params)
        min_accuracy = self._min_accuracy()
        Xv = yv = None
        if min_accuracy is not None:
            if val is None:
                raise ValueError(
                    f"val: min_accuracy={min_accuracy} needs labelled validation data "
                    "fit(model, val=(X, y))"
                )
            Xv, yv = as_xy(val, "val", device=weights_device(model))
            device = model_device(model, "model", ("val", Xv))
            with eval_mode(model), torch.no_grad():
                out = model_output(diagnose(model, to_device(Xv[:2], device, "val"), "val"), "val")
            yv = check_labels(yv, len(Xv), out.shape[1], name="val labels")
        batches = self._bn_batches(bn_data)
        skeleton = copy.deepcopy(model).eval()
        base = {k: v.detach().clone() for k, v in model.state_dict().items()}
        theta0 = flatten_state(base, names)
        self._prepare(theta0)

        n = int(self.n_members)
        limit = n * (MAX_DRAWS_PER_SAMPLE if min_accuracy is not None else 1)
        states: list[dict[str, Tensor]] = []
        values: list[float] = []
        draws = 0
        for d in bar(range(limit), f"{self.method} ({n} samples)", enabled=self.progress):
            draws += 1
            vector, value = self._draw(theta0.cpu(), generator(self.seed, d))
            state = unflatten_state(vector.to(theta0.device), base, names)
            state = self._refresh(skeleton, state, batches, d)
            if Xv is not None and _accuracy(skeleton, state, Xv, yv) < min_accuracy:
                continue  # below the accuracy floor: redraw
            states.append(state)
            values.append(value)
            if len(states) == n:
                break
        if len(states) < n:
            raise ValueError(
                f"min_accuracy: only {len(states)} of {limit} draws reached a validation "
                f"accuracy of {min_accuracy}; {n} were needed. Lower "
                "min_accuracy or sample closer to the solution"
            )
        self.param_names_ = names
        self.draws_ = draws
        self._record(values)
        meta = self._meta(params=_param_label(self.params), min_accuracy=min_accuracy)
        self.ensemble_ = Ensemble.from_state_dicts(skeleton, states, meta)
        return self


# ---------------------------------------------------------------- around one solution
class RandomSubspace(_AroundSolution):
    """Random directions around θ₀: members θ₀ + t·v.

    v ~ N(0, I) over the selected parameters, normalised to ‖v‖ = 1, and t ~ Uniform(0, radius),
    multiplied by ‖θ₀‖ (of the selected parameters) when `relative`. So a member lies at
    distance exactly t·‖θ₀‖ (relative) or t (absolute) from θ₀.

    Args:
        n_members: number of members.
        radius: largest step (a fraction of ‖θ₀‖ when relative, else in weight units), > 0.
        relative: scale steps by ‖θ₀‖.
        seed: random seed.
        params: the parameters to move: "all", "weights" (ndim ≥ 2) or a callable(name, p).
        bn: "eval" (keep the base BatchNorm statistics) or "refresh" (needs `bn_data`).
        min_accuracy: reject and redraw samples whose accuracy on `val` is below it (at most
            10×n_members draws, then an error).
        progress: progress bar over draws.

    After `fit`: `ensemble_`, `ts_` (the t drawn per member, before the ‖θ₀‖ factor),
    `theta_norm_` (‖θ₀‖ of the selected parameters).
    """

    method = "random_subspace"

    def __init__(
        self,
        *,
        n_members: int = 10,
        radius: float = 0.1,
        relative: bool = True,
        seed: int = 0,
        params: ParamFilter = "all",
        bn: SubspaceBN = "eval",
        min_accuracy: float | None = None,
        progress: bool | None = None,
    ) -> None:
        store_arguments(self, locals())

    def _check_params(self) -> None:
        super()._check_params()
        check_number(self.radius, "radius")

    def _hyperparameters(self) -> dict[str, Any]:
        return {"radius": float(self.radius), "relative": bool(self.relative)}

    def _prepare(self, theta0: Tensor) -> None:
        self.theta_norm_ = float(theta0.double().norm())
        self._unit = self.theta_norm_ if self.relative else 1.0

    def _draw(self, theta0: Tensor, gen: torch.Generator) -> tuple[Tensor, float]:
        v = torch.randn(theta0.shape, generator=gen, dtype=torch.float64)
        v /= v.norm()
        t = float(torch.rand((), generator=gen, dtype=torch.float64)) * float(self.radius)
        return (theta0.double() + (t * self._unit) * v).to(theta0.dtype), t

    def _record(self, values: list[float]) -> None:
        self.ts_ = torch.tensor(values, dtype=torch.float64)


class DropoutSubspace(_AroundSolution):
    """Dropout on the weights of θ₀: members mask ⊙ θ₀ / p_keep.

    Per member, p_keep ~ Uniform(keep[0], keep[1]) and mask ~ Bernoulli(p_keep) independently
    per entry of the selected parameters; `rescale=True` divides by p_keep (inverted dropout,
    so E[member] = θ₀), `rescale=False` keeps the surviving weights as they are.

    Args:
        n_members: number of members.
        keep: range (low, high) of the keep probability, 0 < low ≤ high ≤ 1 (a single number:
            a fixed p_keep).
        seed, params, bn, min_accuracy, progress: as in `RandomSubspace`.
        rescale: divide the kept weights by p_keep.

    After `fit`: `ensemble_`, `keeps_` (p_keep per member).
    """

    method = "dropout_subspace"

    def __init__(
        self,
        *,
        n_members: int = 10,
        keep: tuple[float, float] | float = (0.5, 1.0),
        seed: int = 0,
        params: ParamFilter = "all",
        rescale: bool = True,
        bn: SubspaceBN = "eval",
        min_accuracy: float | None = None,
        progress: bool | None = None,
    ) -> None:
        store_arguments(self, locals())

    def _check_params(self) -> None:
        super()._check_params()
        keep = self.keep
        try:
            pair = (keep, keep) if isinstance(keep, (int, float)) else tuple(keep)
        except TypeError:  # not iterable
            pair = ()
        if not (
            len(pair) == 2
            and all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in pair)
            and 0 < pair[0] <= pair[1] <= 1
        ):
            raise ValueError(
                f"keep: expected a range (low, high) with 0 < low <= high <= 1, got {keep!r}"
            )

    def _keep(self) -> tuple[float, float]:
        """`keep` as a range (low, high) of floats (a single number: (keep, keep))."""
        keep = self.keep
        low, high = (keep, keep) if isinstance(keep, (int, float)) else tuple(keep)
        return float(low), float(high)

    def _hyperparameters(self) -> dict[str, Any]:
        return {"keep": list(self._keep()), "rescale": bool(self.rescale)}

    def _draw(self, theta0: Tensor, gen: torch.Generator) -> tuple[Tensor, float]:
        lo, hi = self._keep()
        p_keep = lo + (hi - lo) * float(torch.rand((), generator=gen, dtype=torch.float64))
        mask = torch.rand(theta0.shape, generator=gen, dtype=torch.float64) < p_keep
        member = theta0 * mask.to(theta0.dtype)
        return (member / p_keep if self.rescale else member), p_keep

    def _record(self, values: list[float]) -> None:
        self.keeps_ = torch.tensor(values, dtype=torch.float64)


# ---------------------------------------------------------------- from training iterates
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


class _IterateGaussian(_Sampler):
    """Gaussians fitted to the last checkpoints θ₁…θ_K of one training trajectory.

    The sampled parameters are the floating-point trainable ones; everything else (buffers such
    as BatchNorm statistics, frozen parameters) is taken from the LAST iterate. Subclasses also
    take `scale`.
    """

    scale: float

    def _check_params(self) -> None:
        super()._check_params()
        check_number(self.scale, "scale")

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

    def _check_params(self) -> None:
        super()._check_params()
        check_positive_int(self.rank, "rank")

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
