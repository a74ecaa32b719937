"""Samplers around the weights θ₀ of one trained model: `RandomSubspace` (θ₀ + t·v along random
directions) and `DropoutSubspace` (dropout on the weights), with the optional accuracy floor on
validation data their base `_AroundSolution` applies."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call

from peg._forward import diagnose, eval_mode
from peg._params import (
    ParamFilter,
    flatten_state,
    param_label,
    select_parameters,
    unflatten_state,
)
from peg.ensemble import Ensemble, model_output
from peg.methods import _constraints as checks
from peg.methods.base import store_arguments
from peg.methods.trained.subspace._sampler import Sampler, SubspaceBN
from peg.source import Data, Source
from peg.source._devices import model_device, move
from peg.source._values import check_finite, check_labels
from peg.source.batches import batch_rows, call_model
from peg.streams import generator
from peg.utils.progress import bar

EVAL_BATCH_SIZE = 512  # rows per forward pass when checking min_accuracy
MAX_DRAWS_PER_SAMPLE = 10  # min_accuracy: give up after this many draws per requested sample


def _val_batches(val: Data) -> Any:
    """`(inputs, y)` per batch of `val`, read anew on every call (never gathered)."""
    return Source(val, name="val").batches(EVAL_BATCH_SIZE, need_labels=True)


def _check_val(model: nn.Module, val: Data) -> int:
    """Before any sampling: the first batch of `val` runs through `model` and has labels in
    range; returns the number of classes (later batches are checked as they come)."""
    first = next(iter(_val_batches(val)), None)
    if first is None:
        raise ValueError("val: the data is empty (0 samples)")
    inputs, y = first
    check_finite(inputs, "val")
    device = model_device(model, "model")
    with eval_mode(model), torch.no_grad():
        probe = diagnose(lambda x: call_model(model, x), move(inputs, device, "val"), "val")
        out = model_output(probe, "val")
    check_labels(y, batch_rows(inputs, "val"), out.shape[1], name="val labels")
    return int(out.shape[1])


def _accuracy(probe: nn.Module, state: Mapping[str, Tensor], val: Data, classes: int) -> float:
    """Accuracy of `probe` (eval mode) carrying the weights `state` on `val`, accumulated
    batch by batch."""
    device = next(iter(state.values())).device
    correct = seen = 0
    with torch.no_grad():
        for j, (inputs, y) in enumerate(_val_batches(val)):
            rows = batch_rows(inputs, "val")
            y = check_labels(y, rows, classes, name=f"val labels (batch {j})")
            x = move(inputs, device, "val")
            args, kwargs = ((), x) if isinstance(x, Mapping) else ((x,), {})
            out = model_output(functional_call(probe, dict(state), args, kwargs), "val")
            correct += int((out.argmax(-1).cpu() == y).sum())
            seen += rows
    return correct / seen


class _AroundSolution(Sampler):
    """Samplers that change the weights θ₀ of one trained model, optionally keeping only
    samples with a validation accuracy of at least `min_accuracy` (the paper used 0.65).

    Subclasses also take `params` and `min_accuracy`.
    """

    params: ParamFilter
    min_accuracy: float | None

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        **Sampler.parameter_constraints,
        "params": checks.param_filter,
        "min_accuracy": checks.interval(0, 1, "an accuracy", closed="[]", optional=True),
    }

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
            val: labelled validation data, needed only for `min_accuracy`: (X, y), a Dataset
                or a DataLoader (`peg.source.batches` conventions), read batch by batch for every
                draw, the accuracy accumulated (never gathered).
            bn_data: training inputs for bn='refresh' (a tensor, (X, y), a Dataset or a
                loader), read batch by batch for every sample.

        Returns:
            self, with `ensemble_`, `param_names_`, `draws_` (draws made, rejected ones
            included) and the per-sample values of the subclass (`ts_` or `keeps_`).
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        names = select_parameters(model, self.params)
        min_accuracy = self._min_accuracy()
        classes = None
        if min_accuracy is not None:
            if val is None:
                raise ValueError(
                    f"val: min_accuracy={min_accuracy} needs labelled validation data "
                    "fit(model, val=(X, y))"
                )
            classes = _check_val(model, val)
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
            if classes is not None and _accuracy(skeleton, state, val, classes) < min_accuracy:
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
        meta = self._meta(params=param_label(self.params), min_accuracy=min_accuracy)
        self.ensemble_ = Ensemble.from_state_dicts(skeleton, states, meta)
        return self


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
        params: the parameters to move: "all", "weights" (ndim ≥ 2), "last_layer", a list of
            module names or a callable(name, p) (see `peg._params.select_parameters`).
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

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        **_AroundSolution.parameter_constraints,
        "radius": checks.number(),
        "relative": checks.boolean(),
    }

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


def _keep_range(keep: Any, name: str) -> None:
    """A keep probability in (0, 1], or a range (low, high) of them with low <= high."""
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
            f"{name}: expected a range (low, high) with 0 < low <= high <= 1, got {keep!r}"
        )


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

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        **_AroundSolution.parameter_constraints,
        "keep": checks.described(
            _keep_range, "a keep probability in (0, 1], or a range (low, high) of them"
        ),
        "rescale": checks.boolean(),
    }

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
