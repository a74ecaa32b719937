"""The Laplace approximation through laplace-torch (Daxberger et al., "Laplace Redux", NeurIPS
2021), last layer by default: a comparison method, not a reimplementation.

`Laplace.fit(model, val, *, train_data=None)` makes one laplace-torch call chain::

    la = laplace.Laplace(model, "classification", subset_of_weights=..., hessian_structure=...,
                         prior_precision=...)
    la.fit(loader)              # the Hessian (GGN) over `train_data` if given, else `val`, once
    la.optimize_prior_precision(method="marglik", ...)  # or "gridsearch" on `val`, or nothing

and predicts with laplace-torch's predictive: `la(x, pred_type="glm", link_approx="probit")`
(one forward pass, the last-layer Jacobians and the GLM predictive per batch), or, for
`link_approx="mc"` (or `pred_type="nn"`), `la.predictive_samples(x, ..., generator=...)`.
For the default last-layer KFAC posterior (and laplace-torch 0.3), the GLM predictive, and the
grid search's, are computed explicitly through the Kronecker structure (`fast_variance`,
`_laplace_variance.predictive`): the same numbers as laplace-torch's, without forming the
Jacobians; anything else goes through laplace-torch's own calls above.

Which data: laplace-torch fits the Hessian on the training data (the paper's setting), N points
weighing the likelihood; here `train_data` when passed (`peg bench` passes its training split),
else `val` (`peg.compare`, which has only validation data: a wider, more cautious posterior).

Dict batches (HuggingFace-style) work as tensors do, but for `pred_type="nn"`
(`_laplace_torch.Keywords`); `meta_["keyword_inputs"]` says which the fit took.

`save` writes the posterior (no data); `peg.load(path, model)` (or `Laplace.load`) reads it.

laplace-torch is optional: `pip install "peg[laplace]"`, then `pip install --no-deps` the three
packages of `INSTALL` (their metadata asks for torchvision, which would replace a CPU torch; they
run without it). It is imported by `fit`, after the inputs are checked and before any work.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from peg._forward import diagnose
from peg.loading import FORMATS
from peg.methods import _constraints as checks
from peg.methods.base import ModulePredictor, store_arguments
from peg.methods.laplace import _state, _torch, _variance
from peg.methods.laplace._torch import require_laplace
from peg.source import Data, Source, ValSource
from peg.source._devices import model_device, move
from peg.source.batches import BatchFn
from peg.streams import generator

SUBSETS = ("last_layer", "all")
STRUCTURES = ("kron", "diag", "full")
PRIORS = ("marglik", "gridsearch", None)
PRED_TYPES = ("glm", "nn")
LINKS = ("probit", "bridge", "bridge_norm", "mc")


def _combined(la: Laplace) -> None:
    """The combinations laplace-torch refuses or ignores."""
    if la.pred_type == "nn" and la.link_approx != "mc":
        raise ValueError(
            f"link_approx: pred_type='nn' samples networks, so it needs link_approx='mc', "
            f"got {la.link_approx!r}"
        )
    if la.last_layer_name is not None and la.subset_of_weights != "last_layer":
        raise ValueError(
            "last_layer_name: only used with subset_of_weights='last_layer', got "
            f"subset_of_weights={la.subset_of_weights!r}"
        )


class Laplace(ModulePredictor):
    """Laplace approximation of a trained classifier's posterior, fitted by laplace-torch 0.3:
    N(θ_MAP, (H + λI)⁻¹), H the GGN of the log-likelihood (Daxberger et al. 2021, "Laplace
    Redux", NeurIPS).

    Args (laplace-torch's names, except `n_members` and `fast_variance`):
        subset_of_weights: "last_layer" (the last nn.Linear, found by laplace-torch on the first
            batch, or `last_layer_name`) or "all" (every parameter: costly beyond small nets).
        hessian_structure: "kron" (KFAC), "diag" or "full" GGN of the log-likelihood.
        prior_optimization: how the prior precision (a scalar) is chosen after the Hessian:
            "marglik" (`optimize_prior_precision(method="marglik")`: 100 Adam steps on the
            Laplace log marginal likelihood, from `prior_precision`), "gridsearch" (the NLL of
            the predictive on `fit`'s `val` over laplace-torch's grid 1e-4..1e4, 100 values: 100
            predictive passes over `val`), or None (`prior_precision` kept).
        prior_precision: the prior precision given to laplace-torch (marglik's starting point).
        pred_type: "glm" (the linearised predictive, consistent with the GGN) or "nn" (the
            network at sampled weights; needs `link_approx="mc"`).
        link_approx: "probit", "bridge" or "bridge_norm" (deterministic approximations of the
            softmax of the Gaussian logits) or "mc" (`n_members` samples).
        n_members: laplace-torch's `n_samples`: the MC samples, which are the members, for
            `link_approx="mc"`; unused by the deterministic links (one member).
        last_layer_name: the last layer's module name (None: laplace-torch finds it).
        seed: seed of the MC samples; the samples of batch j depend only on (seed, j) (and so
            on the batching), never on the global RNG.
        batch_size: rows per batch when fitting and predicting tensors.
        progress: progress bar over prediction batches (None: only on a terminal).
        batch_fn: `batch_fn(batch) -> (inputs, y)` for loader batches of another shape.
        fast_variance: for a last-layer KFAC posterior, the GLM covariance of the logits by its
            Kronecker structure (True: O(D² + C·D + C³) per point for D features and C classes;
            laplace-torch's own call, False, forms the `[B, C, C·D + C]` Jacobians: O(C²·D²));
            the same covariance to float rounding, in every GLM link and the grid search.
            Other posteriors always use laplace-torch's; `meta_["fast_variance"]` says which ran.

    After `fit(model, val)`: `laplace_` (the laplace-torch object), `prior_precision_`, `meta_`,
    `model_` (laplace-torch's copy of the model; the caller's is never changed),
    `member_logits(X)`: for the deterministic links `[1, N, C]`, the log of the predictive
    probabilities floored at the dtype's smallest normal number (log 0 would be -inf); for "mc"
    `[S, N, C]`, the log of the S sampled softmax outputs, so metrics treat them as an
    ensemble's members; `predict_proba(X) -> [N, C]` (their average: the predictive),
    `predict(X) -> [N]`, `save(path)` (read back by `peg.load(path, model)`).

    Cost: fit = one pass over `data` computing the last layer's GGN factors (forward and the
    output Jacobians) plus the prior optimisation (marglik: 100 steps on the Kronecker
    eigenvalues, no data; gridsearch: 100 predictive passes over `val`); prediction = one
    forward pass and the GLM predictive per batch (S Gaussian samples of the logits for "mc"):
    SmallCNN (D = 1568, C = 10), one thread: 0.086 ms per image with `fast_variance`, 3.1 × its
    forward pass, 159 × faster than laplace-torch's own call (13.8 ms; MC: 129 ×;
    docs/performance.md, "Laplace prediction").
    """

    method = "laplace"
    label = "Laplace"

    def __init__(
        self,
        *,
        subset_of_weights: str = "last_layer",
        hessian_structure: str = "kron",
        prior_optimization: str | None = "marglik",
        prior_precision: float = 1.0,
        pred_type: str = "glm",
        link_approx: str = "probit",
        n_members: int = 100,
        last_layer_name: str | None = None,
        seed: int = 0,
        batch_size: int = 512,
        progress: bool | None = None,
        batch_fn: BatchFn | None = None,
        fast_variance: bool = True,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[dict[str, checks.Check]] = {
        "subset_of_weights": checks.one_of(*SUBSETS),
        "hessian_structure": checks.one_of(*STRUCTURES),
        "prior_optimization": checks.one_of(*PRIORS),
        "prior_precision": checks.number(),
        "pred_type": checks.one_of(*PRED_TYPES),
        "link_approx": checks.one_of(*LINKS),
        "n_members": checks.positive_int(),
        "last_layer_name": checks.text("a module name", optional=True),
        "seed": checks.positive_int(minimum=0),
        "batch_size": checks.positive_int(),
        "progress": checks.boolean(optional=True),
        "batch_fn": checks.batch_fn,
        "fast_variance": checks.boolean(),
    }
    parameter_rules: ClassVar[tuple[checks.Rule, ...]] = (_combined,)

    def _sampled(self) -> bool:
        return self.link_approx == "mc"  # pred_type="nn" implies it

    # ---------------------------------------------------------------- fitting
    def fit(
        self,
        model: nn.Module,
        val: Data | None = None,
        *,
        bn_data: Data | None = None,
        train_data: Data | None = None,
    ) -> Laplace:
        """Fit the Laplace approximation around `model`'s weights.

        Args:
            model: a trained nn.Module whose forward returns logits `[B, C]` (a Tensor; wrap other
                outputs with `peg.with_output`), ending in an nn.Linear for the last layer.
            val: labelled data, `(X, y)` tensors or arrays, a Dataset or a DataLoader of
                `(x, y, ...)` batches, dict batches (see the module doc) or `batch_fn`'s: the
                points of the likelihood, N of them, unless `train_data` is given; the grid
                search's for `prior_optimization="gridsearch"`.
            bn_data: unused (accepted as by every post-hoc method).
            train_data: labelled data for the likelihood instead of `val` (the training data
                in the paper; see the module doc). With it, `val` is for the grid search only.
        """
        self._check_params()  # as the constructor did: catches an attribute set directly
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        gridsearch = self.prior_optimization == "gridsearch"
        if val is None and (gridsearch or train_data is None):
            raise ValueError(
                "val: prior_optimization='gridsearch' needs labelled validation data"
                if gridsearch
                else "val: the Laplace approximation needs labelled data (X, y)"
            )
        if train_data is not None and val is not None and not gridsearch:
            raise ValueError(
                "val: with train_data, only used by prior_optimization='gridsearch', got "
                f"prior_optimization={self.prior_optimization!r}"
            )
        device, split = model_device(model), self.batch_fn  # checked by _check_params
        name = "train_data" if train_data is not None else "val"
        source = Source(train_data if train_data is not None else val, split, name).rows(device)
        grid = Source(val, split, "val").rows(device) if gridsearch else None
        laplace = require_laplace()
        network = copy.deepcopy(model).eval()  # laplace-torch runs it; the caller's is untouched
        network, self.keywords_ = _torch.wrapped(network, source, self.pred_type)
        self._check_sources(network, source, grid)
        la = self._new(laplace, network)
        with _torch.quiet(), _torch.seeded(int(self.seed), device):
            la.fit(_torch.Batches(source, int(self.batch_size), device))
            self._optimize_prior(la, grid, device)
        self._set_fitted(la)
        return self

    def _check_sources(self, network: nn.Module, source: ValSource, grid: ValSource | None) -> None:
        """The classes from one forward pass on two rows; a pair checked whole (it is read
        unchecked batch by batch), before laplace-torch runs."""
        classes = self._probe_model(network, source)
        for s in (source, grid):
            if s is not None:
                s.classes = classes
                if s.X is not None and s.y is not None:
                    s.check(s.X, s.y, "all points")

    def _optimize_prior(self, la: Any, grid: ValSource | None, device: torch.device) -> None:
        """The prior precision: marglik or the grid search on `grid` (explicitly through the
        Kronecker structure where `_fast`, else laplace-torch's), or kept."""
        if self.prior_optimization is None:
            return
        batches = None if grid is None else _torch.Batches(grid, int(self.batch_size), device)
        if batches is not None and self._fast(la):
            _variance.gridsearch(la, batches.paired(), self.link_approx, int(self.n_members))
            return
        la.optimize_prior_precision(
            pred_type=self.pred_type,
            method=self.prior_optimization,
            init_prior_prec=float(self.prior_precision),
            val_loader=batches,
            link_approx=self.link_approx,
            n_samples=int(self.n_members),
        )

    def _probe_model(self, network: nn.Module, source: ValSource) -> int:
        """The model's number of classes, from one forward pass on two rows of the data (a clear
        error for inputs it cannot take or an output that is not a logits Tensor)."""
        x, _ = source.first()
        x = move(x, model_device(network), source.name)
        with torch.no_grad():
            # laplace-torch calls the model as network(x), a mapping x whole (`Keywords`)
            out = diagnose(lambda rows: network(rows), x, source.name)
        if not isinstance(out, Tensor) or out.ndim != 2:
            got = f"shape {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
            raise TypeError(
                f"model: laplace-torch needs a forward returning logits [B, C] as a Tensor, got "
                f"{got}; wrap the model, e.g. peg.with_output(model, 'logits')"
            )
        return int(out.shape[1])

    def _new(self, laplace: ModuleType, network: nn.Module, last_layer: str | None = None) -> Any:
        """laplace-torch's object for these options around `network` (not fitted)."""
        extra: dict[str, Any] = {}
        if self.subset_of_weights == "last_layer":
            name = _torch.inner_name(self.last_layer_name, self.keywords_)
            extra["last_layer_name"] = last_layer or name
        if self.keywords_:  # mapping batches: see `_laplace_torch`
            extra.update(dict_key_x=_torch.ROWS, dict_key_y=_torch.ROWS)
        return laplace.Laplace(
            network,
            "classification",
            subset_of_weights=self.subset_of_weights,
            hessian_structure=self.hessian_structure,
            prior_precision=float(self.prior_precision),
            **extra,
        )

    def _set_fitted(self, la: Any) -> None:
        self.laplace_ = la
        self.model_ = la.model  # laplace-torch's copy (a FeatureExtractor around it: last layer)
        self.model_.eval()
        prior = la.prior_precision
        self.prior_precision_ = float(prior.reshape(-1)[0]) if isinstance(prior, Tensor) else prior
        self._fast_ = self._fast(la)
        self.meta_: dict[str, Any] = {
            "method": self.method,
            "subset_of_weights": self.subset_of_weights,
            "hessian_structure": self.hessian_structure,
            "prior_optimization": self.prior_optimization,
            "prior_precision": self.prior_precision_,
            "pred_type": self.pred_type,
            "link_approx": self.link_approx,
            "n_members": int(self.n_members) if self._sampled() else 1,
            "seed": int(self.seed),
            "last_layer": _torch.outer_name(_state.last_layer(la), self.keywords_),
            "keyword_inputs": bool(self.keywords_),
            "data_points": int(la.n_data),
            "backend": la._backend_cls.__name__,
            "fast_variance": self._fast_,
            "laplace_torch": importlib.metadata.version("laplace-torch"),
        }

    # ---------------------------------------------------------------- predicting
    def _fast(self, la: Any) -> bool:
        """Whether the GLM predictive goes through the Kronecker structure (`_laplace_variance`:
        `fast_variance`, a GLM predictive, laplace-torch 0.3 and a last-layer KFAC posterior)."""
        return bool(self.fast_variance) and self.pred_type == "glm" and _variance.usable(la)

    def _forward(self, x: Any) -> Any:
        """One forward pass as laplace-torch runs it: `model_(x)`, a mapping whole (`Keywords`)."""
        return self.model_(x)

    def _probe(self, x: Any, name: str = "X") -> None:
        if not isinstance(x, Mapping) or self.keywords_:  # else `_batch_logits`' TypeError
            super()._probe(x, name)

    def _batch_logits(self, x: Any, j: int) -> Tensor:
        """Members of batch j, `[M, B, C]`: log predictive probabilities (see the class doc)."""
        x = _torch.predict_inputs(x, self.keywords_, self._device())
        la, n = self.laplace_, int(self.n_members)
        draws = None
        if self._sampled():
            draws = torch.Generator(device=self._device())
            draws.manual_seed(int(generator(int(self.seed), j).initial_seed()))
        probs = _variance.predictive(la, x, self.link_approx, n, draws) if self._fast_ else None
        if probs is None and draws is not None:  # laplace-torch's own predictive
            probs = la.predictive_samples(x, pred_type=self.pred_type, n_samples=n, generator=draws)
        elif probs is None:
            probs = la(x, pred_type=self.pred_type, link_approx=self.link_approx)
        probs = probs if draws is not None else probs[None]
        return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()

    def __len__(self) -> int:
        self._check_fitted()
        return self.meta_["n_members"]

    def posterior_tensors(self) -> list[Tensor]:
        """The tensors of the posterior laplace-torch holds besides the model: its state (mean,
        Hessian factors, prior) and the factors' eigendecomposition (Kronecker structure)."""
        self._check_fitted("reading the posterior")
        la = self.laplace_
        state = {k: v for k, v in la.state_dict().items() if k != "data"}
        decomposed = [getattr(la.H, "eigenvectors", []), getattr(la.H, "eigenvalues", [])]
        return _state.leaves([state, decomposed])

    # ---------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the fitted approximation to `path` (safetensors + JSON, atomic; no pickle):
        the options, the model's weights (the MAP) and laplace-torch's `state_dict()` (posterior
        mean, Hessian factors, prior precision, N, ...), no data (`_laplace_state.write`). Read
        it back with `peg.load(path, model)`."""
        self._check_fitted("saving")
        params = {k: v for k, v in self.get_params().items() if k != "batch_fn"}
        return _state.write(path, self.laplace_, params, self.meta_)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        model: nn.Module,
        device: str | torch.device = "cpu",
        batch_fn: BatchFn | None = None,
    ) -> Laplace:
        """`peg.load(path, model, device, batch_fn=batch_fn)` for a file `save` wrote (the same
        reader); any other file is refused (`_laplace_state.read`)."""
        return _read(Path(path), model, device, batch_fn)


def _read(
    path: Path, model: nn.Module, device: str | torch.device, batch_fn: BatchFn | None
) -> Laplace:
    """A fitted `Laplace` from a file `save` wrote (`peg.load`'s reader for the format).
    `model`: any instance of the saved architecture (deep-copied; its weights are replaced by
    the saved ones)."""
    tree = _state.read(path)
    fitted = _state.rebuilt(Laplace, tree, path, batch_fn)
    fitted.keywords_ = bool(tree["meta"].get("keyword_inputs", False))
    if fitted.keywords_:  # fitted on mapping batches: the weights saved are `Keywords`'
        model = _torch.Keywords(model) if isinstance(model, nn.Module) else model
    network = _state.weights(model, tree, device)
    la = fitted._new(require_laplace(), network, tree["last_layer"])
    with _torch.quiet():
        _state.restore(la, tree, torch.device(device), path)
    fitted._set_fitted(la)
    return fitted


FORMATS.add(_state.FORMAT, _read)
