"""`PerformanceEstimator`: a model's accuracy on unlabelled target data, with an interval.

`fit(predictor, val)` (or `fit(logits, labels)`) reads the labelled source once: member logits
→ log p̄ `[N, C]`, temperature scaling fitted on them (`fit_temperature`, the one of
`peg.TemperatureScaling`), every estimator of `estimators` fitted, each one's width scale
calibrated on synthetic shifts (`_shifts`, `_reliability`), and the energy threshold (5% of
the source) the monitor's OOD share counts against. `estimate(X)` streams the target through
the predictor batch by batch into a `Summary` (memory flat in N) and reads the chosen estimate
from it, its interval and whether it is reliable.

A model (an nn.Module) is read through one `Ensemble` built at `fit` (`_reader`): a copy of it
in eval mode, the user's own never touched, and no copy per `estimate` (a one-member ensemble
built on every call deep-copied the model twice and cloned its weights: the read of 64 images
through a small CNN took 12-15 ms of CPU time, 6-8 ms without). `estimate` reads the model as
it was at `fit`, which the temperature and widths were fitted on (`_reader`'s weights: a copy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from peg.ensemble import Ensemble
from peg.errors import NotFittedError, NotStreamable
from peg.methods import _constraints as checks
from peg.methods._display import RecordDisplay
from peg.methods._predictors import (
    is_model,
    iter_member_logits_of,
    logits_and_labels,
    member_logits_of,
    only_multiclass,
    read_predictor,
    scores_of,
    stateless,
)
from peg.methods.base import Method, store_arguments
from peg.methods.calibration.temperature import fit_temperature
from peg.methods.estimation import _learned, _reliability, _shifts
from peg.methods.estimation._reliability import SPREAD
from peg.methods.estimation._stats import Summary
from peg.methods.estimation.estimators import ESTIMATORS, Estimator, SourceFit, Target, estimates
from peg.source import Data
from peg.source._devices import model_device
from peg.source._values import check_labels
from peg.source.batches import BatchFn, check_batch_fn

OOD_QUANTILE = 0.05


@dataclass(repr=False)
class Estimate(RecordDisplay):
    """One target's estimate: `accuracy`, `interval` (lo, hi) at `confidence`, the `method`,
    `n` points, every estimator's value in `estimates`, EM's target `priors` `[C]`; shown
    rounded (`repr`, and in a notebook: `peg.methods._display.RecordDisplay`).

    Attributes:
        accuracy: the estimated accuracy on the target, in [0, 1].
        interval: (lo, hi), covering the accuracy with probability `confidence`.
        method: the estimator that gave `accuracy` ("auto (gate)" names the one "auto" took).
        confidence: the interval's nominal coverage (`PerformanceEstimator(confidence=...)`).
        n: the target points the estimate is of.
        estimates: every estimator's accuracy that was computed, by name.
        priors: the target's class priors `[C]` as EM estimates them, or None.
        reliable: False when the estimate should not be trusted (the target too far from the
            source for the interval to mean anything); `reasons` says why.
        reasons: why the estimate is not reliable, one sentence each (empty when it is).
        distances: how far the target is from the source, read without labels
            (`_reliability.DISTANCES`: the estimators' disagreement, the prediction shift, the
            confidence shift, the label-shift residual; the first and last widen the interval).

    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 3, (1500,), generator=g)
        >>> logits = torch.randn(1500, 3, generator=g)
        >>> logits[torch.arange(1500), labels] += 1.0
        >>> logits = 4 * logits  # an over-confident model's saved logits [N, C]
        >>> estimator = peg.PerformanceEstimator("atc-mc").fit(logits[:1000], labels[:1000])
        >>> estimate = estimator.estimate(logits[1000:])  # unshifted: near the source
        >>> estimate.method, estimate.n
        ('atc-mc', 500)
        >>> estimate.reliable, sorted(estimate.to_dict())[:4]
        (True, ['accuracy', 'confidence', 'distances', 'estimates'])

    See Also:
        peg.PerformanceEstimator: what makes an estimate.
        peg.Monitor: an estimate per chunk of a stream.
    """

    _doc: ClassVar[str | None] = "Estimate"

    accuracy: float
    interval: tuple[float, float]
    method: str
    confidence: float
    n: int
    estimates: dict[str, float] = field(default_factory=dict)
    priors: list[float] | None = None
    reliable: bool = True
    reasons: tuple[str, ...] = ()
    distances: dict[str, float] = field(default_factory=dict)

    def __repr__(self) -> str:
        """One line: the accuracy and its interval first, then whether to trust it."""
        lo, hi = self.interval
        state = "reliable" if self.reliable else "unreliable: " + "; ".join(self.reasons)
        return (
            f"Estimate(accuracy={self.accuracy:.4g} [{lo:.4g}, {hi:.4g}] at "
            f"{self.confidence:.0%}, method={self.method!r}, n={self.n}, {state})"
        )

    def verdict(self) -> str:
        """The estimate in one sentence, e.g. "accuracy 0.79, 90% interval [0.73, 0.86]
        (auto (gate), 500 points): unreliable: the target is far from the source: …"."""
        lo, hi = self.interval
        said = (
            f"accuracy {self.accuracy:.3f}, {self.confidence:.0%} interval [{lo:.3f}, {hi:.3f}] "
            f"({self.method}, {self.n} points)"
        )
        return said + (
            ": reliable" if self.reliable else ": unreliable: " + "; ".join(self.reasons)
        )

    def _display_lead(self) -> tuple[str, str]:
        # green when it may be trusted, red when not (the reports' verdict colours)
        return self.verdict(), "peg-verdict" + ("" if self.reliable else " peg-worse")

    def to_dict(self) -> dict[str, Any]:
        """The estimate as plain JSON-ready values (`interval` a list), as results.json holds it."""
        return {
            "accuracy": self.accuracy,
            "interval": list(self.interval),
            "method": self.method,
            "confidence": self.confidence,
            "n": self.n,
            "estimates": dict(self.estimates),
            "priors": self.priors,
            "reliable": self.reliable,
            "reasons": list(self.reasons),
            "distances": dict(self.distances),
        }


def free_energy_lse(logits: Tensor) -> Tensor:
    """logsumexp of the logits `[N]` (minus the energy score), averaged over members; member
    logits `[M, N, C]`."""
    return torch.logsumexp(logits.double(), -1).mean(0)


class PerformanceEstimator(Method):
    """Estimate a classifier's accuracy on unlabelled target data, with an interval: e.g. ATC,
    the share of target points whose confidence score exceeds the threshold t at which the
    source's share equals its accuracy (Garg et al. 2022; DoC: Guillory et al. 2021; COT: Lu
    et al. 2023; `peg.methods.estimation.estimators`).

    Args:
        method: which estimator (`peg.methods.estimation.estimators`): "auto" (peg's default),
            "ac", "doc", "atc-mc", "atc-ne", "atc-ls", "label-shift", "cot", "cott", "cot-em".
        confidence: the interval's nominal coverage on shifts like the synthetic shifts of
            the source it is calibrated on (`_shifts`, `_reliability`), its width growing with
            the target's distance from the source, widened by the target's sampling error.
        reservoir: at most this many target rows kept (uniformly) for EM and the transport.
        transport_points: COT/COTT's exact assignment on at most this many points.
        batch_size, batch_fn: how the predictor reads data (`peg.source.batches`).
        seed: the halves, the synthetic shifts, the reservoir and the subsample.
        all_methods: also fit and report every other estimator in `Estimate.estimates` (and
            calibrate its width): what a comparison needs; the chosen one alone is cheaper.
        shift_points: "auto" learns from corrupted copies of this many source images when
            `fit` is given a model and images `(X [N, 1 or 3, H, W], y)` (`_learned`; the rest
            of the source fits the base estimators it combines). 0 (the default): never, "auto"
            is the gate (learning won on Fashion-MNIST, MAE 2.88 against 3.37 points, and lost
            on CIFAR-10, 4.88 against 4.44: docs/monitor.md).

    After `fit`: `temperature_`, `source_accuracy_`, `scales_` (each method's width scale q:
    half-width = q · (0.02 + disagreement + label-shift residual), `_reliability`),
    `synthetic_errors_` `[S]` and `synthetic_distances_` `[S, 4]` (each method's errors and
    each shift's distances on the synthetic shifts q is calibrated on), `learned_width_` (the
    learned mode's least half-width, 0 in the gate mode), `energy_threshold_`, `n_classes_`,
    `fitted_` (set last). `estimate(X)` → `Estimate`, `reliable=False` past a half-width of
    0.15.

    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 3, (300,), generator=g)
        >>> logits = torch.randn(300, 3, generator=g)
        >>> logits[torch.arange(300), labels] += 1.0
        >>> logits = 4 * logits  # an over-confident model's saved logits [N, C]
        >>> estimator = peg.PerformanceEstimator("atc-mc").fit(logits[:200], labels[:200])
        >>> estimate = estimator.estimate(logits[200:])  # the target's logits, no labels
        >>> estimate.interval[0] <= estimate.accuracy <= estimate.interval[1]
        True

    See Also:
        peg.methods.estimation.Estimate: what `estimate` returns.
        peg.Monitor: the estimate chunk by chunk on a stream, with alerts.
        docs/monitor.md: the estimators, their intervals and the evidence.
    """

    #: set last by `fit`: its presence means fitted (`Method`'s protocol)
    fitted_attribute: ClassVar[str] = "fitted_"
    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "method": checks.one_of(*ESTIMATORS),
        "confidence": checks.interval(0, 1, "a probability", "()"),
        "reservoir": checks.positive_int(100),
        "transport_points": checks.positive_int(10),
        "batch_size": checks.positive_int(),
        "batch_fn": checks.optional_callable("a function batch -> (inputs, labels)"),
        "seed": checks.positive_int(0),
        "all_methods": checks.boolean(),
        "shift_points": checks.positive_int(0),
    }

    def __init__(
        self,
        method: str = "auto",
        *,
        confidence: float = 0.9,
        reservoir: int = 10_000,
        transport_points: int = 1000,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        seed: int = 0,
        all_methods: bool = False,
        shift_points: int = 0,
    ) -> None:
        store_arguments(self, locals())

    # ---------------------------------------------------------------- fitting
    def fit(
        self, predictor: Any, val: Data | None = None, *, shifted: Iterable | None = None
    ) -> PerformanceEstimator:
        """Fit on labelled source data: a model (or peg predictor) and `val`, or saved logits
        `[N, C]` and their labels `[N]`. "auto" learns from shifted copies of the source:
        corrupted copies of `shift_points` of val's images when given a model and images (19
        corruptions × 5 severities: the fit then costs ~100 forward passes over them), or
        `shifted`, (name, logits `[n, C]`, labels `[n]`) triples of labelled points NOT in
        val (name "clean" or "<corruption> <severity>", `_learned.FAMILIES`). Returns self."""
        self._check_params()
        predictor, val = read_predictor(predictor, val, kinds=True)
        if val is None:
            raise ValueError("val: PerformanceEstimator needs labelled validation data (X, y)")
        split = check_batch_fn(self.batch_fn)
        reader = _reader(predictor)
        logits, y = logits_and_labels(reader, val, int(self.batch_size), split, "val")
        only_multiclass(logits, y, "PerformanceEstimator")  # the other kinds: out of scope
        scores = scores_of(logits, "log_probs", "val")
        y = check_labels(y, *scores.shape, name="val labels").cpu()
        if len(y) < 20:
            raise ValueError(f"val: {len(y)} labelled points are too few (at least 20)")
        sets = None if shifted is None else _learned.checked_sets(shifted, scores.shape[1])
        if sets is None and int(self.shift_points) > 0:
            _learned.check_range(_learned.images_of(val))
        self.predictor_, self._reader = predictor, reader
        self.n_classes_ = scores.shape[1]
        self.temperature_ = fit_temperature(scores.cpu(), y, label=None)
        fitted = self._fit_all(scores.cpu(), y)
        self.source_ = fitted[self.method].source
        self.source_accuracy_ = self.source_.accuracy
        errors, far, truths = _shifts.synthetic_errors(
            scores.cpu(), y, self._predictor_on, int(self.seed)
        )
        self.synthetic_errors_, self.synthetic_distances_ = errors, far
        conf = float(self.confidence)
        # each shifted set's own sampling error is not the shift's: q is net of it (the
        # target's interval adds the target's)
        noise = np.array([_shifts.sampling(a, int(n), conf) for a, n in truths])
        self.scales_ = {k: _reliability.fit_q(v, far, conf, noise) for k, v in errors.items()}
        self.learned_width_ = 0.0
        lse = free_energy_lse(logits).cpu().numpy()
        self.energy_threshold_ = float(np.quantile(lse, OOD_QUANTILE))
        if "auto" in fitted:
            self._learn(fitted["auto"], scores.cpu(), y, val, sets)
        self.fitted_ = fitted  # last: fitted from here on
        return self

    def _learn(self, auto: Any, scores: Tensor, y: Tensor, val: Any, sets: list | None) -> None:
        """auto's learned mode (`_learned`), from `sets` or corrupted copies of val's images;
        left in its gate mode when there are neither."""
        t, seed = self.temperature_, int(self.seed)
        source = self.source_
        if sets is None:
            images = _learned.images_of(val)
            m = min(int(self.shift_points), len(y) // 2)
            if images is None or m < 10:
                return
            order = np.random.default_rng(seed).permutation(len(y))
            sub, rest = torch.from_numpy(order[:m]), torch.from_numpy(order[m:])
            source = SourceFit(
                (scores[rest] / t).log_softmax(-1), y[rest], source.transport_points, seed
            )
            size, split = int(self.batch_size), check_batch_fn(self.batch_fn)

            def predict(X: Tensor) -> Tensor:
                logits = member_logits_of(self._reader, X, size, split)
                return scores_of(logits, "log_probs", "val").cpu()

            names = _learned.corruptions(images.shape[1])
            idx = sub.to(images.device)
            sets = list(_learned.corrupted_sets(predict, images[idx], y[sub], names, seed))
        calibrated = [(n, (s / t).log_softmax(-1), labels) for n, s, labels in sets]
        learned = _learned.Learned(source, int(self.reservoir), seed)
        learned.fit(_learned.training_sets(calibrated, seed))
        auto.learn(learned)
        self.learned_width_ = _shifts.half_width(learned.errors_, self.confidence)

    def _fit_all(self, scores: Tensor, y: Tensor, temperature: float | None = None) -> dict:
        t = self.temperature_ if temperature is None else temperature
        source = SourceFit(
            (scores / t).log_softmax(-1), y, int(self.transport_points), int(self.seed)
        )
        keys = [self.method, *getattr(ESTIMATORS[self.method], "parts", ()), *SPREAD]
        keys = list(ESTIMATORS) if self.all_methods else list(dict.fromkeys(keys))
        return {k: ESTIMATORS[k]().fit(source) for k in keys}

    def _predictor_on(self, scores: Tensor, y: Tensor) -> Any:
        """Every estimator fitted on (scores, y) (temperature too): a function of a set's scores
        giving each estimate (what the synthetic shifts score)."""
        t = fit_temperature(scores, y, label=None)
        fitted = self._fit_all(scores, y, t)

        def predict(s: Tensor) -> tuple[dict[str, float], np.ndarray]:
            summary = Summary(self.n_classes_, int(self.reservoir), int(self.seed))
            summary.add((s / t).log_softmax(-1))
            target = Target(summary, next(iter(fitted.values())).source)
            values = estimates(fitted, target)
            return values, target.distances(values)

        return predict

    # ---------------------------------------------------------------- estimating
    def summary(self) -> Summary:
        """An empty `Summary` for this estimator's classes (`add` batches, then `read`)."""
        self._check_fitted()
        return Summary(self.n_classes_, int(self.reservoir), int(self.seed))

    def add(self, summary: Summary, logits: Tensor, name: str = "X", start: int = 0) -> None:
        """One batch of member logits `[M, B, C]` (or logits `[B, C]`) into `summary`."""
        logits = torch.as_tensor(logits)
        if logits.ndim == 2:
            logits = logits[None]
        if logits.ndim != 3 or logits.shape[-1] != self.n_classes_:
            raise ValueError(
                f"{name}: expected logits [N, {self.n_classes_}] (the classes of val), got "
                f"shape {tuple(logits.shape)}; label-free estimation and the Monitor take "
                "multiclass logits only (not binary scores [N], multilabel or dense outputs)"
            )
        scores = scores_of(logits, "log_probs", name, start)
        cal = (scores.cpu() / self.temperature_).log_softmax(-1)
        summary.add(cal, free_energy_lse(logits), self.energy_threshold_)

    def batches(self, X: Data) -> Iterable[Tensor]:
        """Member logits `[M, B, C]` of `X` batch by batch (one pass; streamed where the
        predictor can)."""
        size, split = int(self.batch_size), check_batch_fn(self.batch_fn)
        try:
            return iter_member_logits_of(self._reader, X, size, split)
        except NotStreamable:
            return iter([member_logits_of(self._reader, X, size, split)])

    def estimate(self, X: Data) -> Estimate:
        """The accuracy on unlabelled `X` (inputs for the fitted model, or logits `[N, C]` when
        fitted on logits), streamed: memory O(C · bins + reservoir · C) whatever N."""
        self._check_fitted()
        summary, start = self.summary(), 0
        for logits in self.batches(X):
            self.add(summary, logits, "X", start)
            start += logits.shape[1]
        return self.read(summary)

    def read(self, summary: Summary) -> Estimate:
        """The `Estimate` of a filled `summary`."""
        self._check_fitted()
        if summary.n == 0:
            raise ValueError("X: no target points to estimate on (0 samples)")
        target = Target(summary, self.source_)
        values = estimates(self.fitted_, target)
        accuracy = values[self.method]
        method = self.method
        if method == "auto":
            method = f"auto ({self.fitted_['auto'].mode})"
        distance = target.distances(values)
        shift = self.scales_[self.method] * float(_reliability.scale(distance))
        if method == "auto (learned)":
            shift = max(shift, self.learned_width_)
        lo, hi = _shifts.interval(accuracy, shift, summary.n, float(self.confidence))
        reasons = _reliability.reasons(distance, shift)
        return Estimate(
            accuracy=accuracy,
            interval=(lo, hi),
            method=method,
            confidence=float(self.confidence),
            n=summary.n,
            estimates=values,
            priors=[float(p) for p in target.priors],
            reliable=not reasons,
            reasons=reasons,
            distances=dict(zip(_reliability.DISTANCES, map(float, distance), strict=True)),
        )

    def _check_fitted(self, doing: str | None = None) -> None:
        """`Method`'s check; asked without `doing`, its message names both ways to fit."""
        if doing is not None:
            return super()._check_fitted(doing)
        if not self.__sklearn_is_fitted__():
            raise NotFittedError(
                "PerformanceEstimator is not fitted: call fit(predictor, val) or "
                "fit(logits, labels) first"
            )

    @property
    def estimators_(self) -> dict[str, Estimator]:
        """Every fitted estimator by name (`method`'s and, with `all_methods`, the others)."""
        self._check_fitted()
        return dict(self.fitted_)


def _reader(predictor: Any) -> Any:
    """What reads `predictor`'s logits: a model (an nn.Module without `member_logits`, with
    weights) as the one-member `Ensemble` that `member_logits_of` would build on every call,
    built once (the model's weights refused on `meta` first, as there); anything else as is."""
    if is_model(predictor) and not stateless(predictor):
        model_device(predictor, "predictor")
        return Ensemble.from_models([predictor])
    return predictor
