"""The label-free accuracy estimators, one small object each, registered by key (`ESTIMATORS`).

Every estimator is fitted on the labelled source (`SourceFit`: the temperature-scaled
log-probabilities of the validation points and their labels) and then reads a target only
through its streamed `Summary` (`_stats`) and the `Target` built on it (which computes the EM
priors once for every estimator that needs them). All of them estimate the accuracy of the
model's own argmax prediction (temperature scaling does not move it).

- "ac": average confidence, the mean top probability after temperature scaling (Guo et al.
  2017; Garg et al. 2022's AC baseline).
- "doc": difference of confidences (Guillory et al. 2021): source accuracy + (target mean
  confidence − source mean confidence).
- "atc-mc", "atc-ne": average thresholded confidence (Garg et al. 2022): the threshold is set on
  the source so that the share of points scoring below it equals the source error; the estimate
  is the target's share scoring at or above it. Scores: top probability, negative entropy.
- "label-shift": the target priors q by EM (Saerens et al. 2002) on bias-corrected temperature
  scaled probabilities (Alexandari et al. 2020), as `peg.LabelShift` fits them; the estimate
  is the source's per-class accuracy weighted by q: Σ_c q_c · acc_c (importance weights
  q(y) / p(y) on the source's correctness). Exact under label shift only.
- "cot": COT (Lu et al. 2023): 1 − the mean cost of the optimal transport from the target's
  probability vectors to labels drawn from the source label marginal (`_stats.transport_cost`).
- "cott": COTT (same paper): the transport costs thresholded: the threshold set on the source
  so that the share of costs above it equals the source error; the estimate is the target's
  share of costs at or below it.
- "atc-ls": peg's: ATC-MC with the threshold set on the source reweighted by EM's q(y) / p(y):
  the weighted share below the threshold equals the weighted error. Under label shift the
  target's share above it is consistent as ATC's is without shift; under covariate shift it is
  ATC-MC with the weights of the target's class mix. (The top probability, not the negative
  entropy: ATC-NE erred twice as much as ATC-MC on Fashion-MNIST, benchmarks/label_free.py.)
- "cot-em": peg's: COT with EM's target priors as the label marginal instead of the source's
  (COT's transport charges a label shift as error; this one does not, but it also lets EM
  explain a collapse of the predictions onto a few classes as a label shift).
- "auto" (`Auto`): see its docstring.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from peg.methods.calibration._label_shift import calibrated_log_probs, em_priors, fit_bcts
from peg.methods.estimation import _reliability, _shifts
from peg.methods.estimation._stats import Summary, atc_threshold, score, transport_cost
from peg.utils.registry import Registry

#: auto's gate: covariate branch from GATE × the largest |label-shift gap| of the synthetic
#: label shifts, fully at twice that (`Auto`)
GATE = 2.0


class SourceFit:
    """What every estimator learns from the source: calibrated log-probabilities `lp`
    `[N, C]`, labels `y` `[N]`, correctness, class priors, the BCTS step for EM."""

    def __init__(self, lp: torch.Tensor, y: torch.Tensor, transport_points: int, seed: int):
        self.lp, self.y = lp.double().cpu(), y.long().cpu()
        self.classes = lp.shape[1]
        self.correct = (self.lp.argmax(-1) == self.y).double().numpy()
        counts = np.bincount(self.y.numpy(), minlength=self.classes).astype(np.float64)
        self.priors = counts / counts.sum()
        hits = np.bincount(self.y.numpy(), weights=self.correct, minlength=self.classes)
        self.class_accuracy = np.divide(hits, counts, out=np.zeros_like(hits), where=counts > 0)
        self.accuracy = float(self.correct.mean())
        top = self.lp.max(-1).values.exp().numpy()
        self.confidence = float(top.mean())
        conf = np.bincount(self.y.numpy(), weights=top, minlength=self.classes)
        # the mean top probability of each TRUE class: what label shift alone keeps
        self.class_confidence = np.divide(conf, counts, out=np.zeros_like(conf), where=counts > 0)
        self.scores = {k: score(self.lp, k).numpy() for k in ("mc", "ne")}
        # what the distances of a target are measured from (`_reliability.distances`)
        pred = self.lp.argmax(-1).numpy()
        self.shares = np.bincount(pred, minlength=self.classes) / max(len(self.y), 1)
        self.top_counts = _reliability.confidence_counts(self.scores["mc"])
        self.joint = _reliability.joint_counts(
            pred, self.scores["mc"], self.classes, self.y.numpy()
        )
        self.transport_points, self.seed = transport_points, seed
        try:  # EM needs calibrated probabilities: BCTS, else the temperature-scaled ones
            self.bcts: tuple[float, torch.Tensor | None] = fit_bcts(self.lp, self.y)
        except FloatingPointError:
            self.bcts = (1.0, None)


class Target:
    """A target's `Summary` with what several estimators share computed once (the EM priors)."""

    def __init__(self, summary: Summary, source: SourceFit) -> None:
        self.summary, self.source = summary, source

    @cached_property
    def priors(self) -> np.ndarray:
        """EM's target priors `[C]` on the reservoir (at most `reservoir` points)."""
        rows = torch.from_numpy(self.summary.rows())
        if len(rows) == 0:
            return self.source.priors.copy()
        probs = calibrated_log_probs(rows, *self.source.bcts).exp()
        src = torch.as_tensor(self.source.priors).clamp_min(1e-12)
        q, _, _ = em_priors(probs, src / src.sum(), 1000, 1e-8)
        return q.numpy()

    @cached_property
    def costs(self) -> np.ndarray:
        s = self.source
        return transport_cost(self.summary.rows(), s.priors, s.transport_points, s.seed)

    @cached_property
    def costs_em(self) -> np.ndarray:
        """The transport costs with EM's priors as the label marginal (`"cot-em"`)."""
        s = self.source
        return transport_cost(self.summary.rows(), self.priors, s.transport_points, s.seed)

    @property
    def confidence(self) -> float:
        return self.summary.conf_sum / max(self.summary.n, 1)

    def distances(self, values: dict[str, float]) -> np.ndarray:
        """How far this target is from the source `[3]` (`_reliability.distances`), given the
        base estimates `values`."""
        s = self.summary
        shares = s.pred_counts / max(s.n, 1)
        counts = s.hist["mc"].sum(0)
        return _reliability.distances(
            values, shares, self.source.shares, counts, self.source.top_counts, self.residual
        )

    @property
    def residual(self) -> float:
        """What a label shift to EM's priors leaves unexplained (`_reliability.residual`)."""
        s = self.source
        w = self.priors / np.maximum(s.priors, 1e-12)
        return _reliability.residual(self.summary.hist["mc"], s.joint, w, s.shares)

    @property
    def label_shift_gap(self) -> float:
        """The target's mean top probability minus the one label shift alone predicts
        (Σ_c q_c · the source's mean top probability of class c, q EM's priors): near 0 when
        a label shift explains the target, below it when the inputs changed."""
        return float(self.confidence - self.priors @ self.source.class_confidence)


class Learner(Protocol):
    """What auto's learned mode reads a target with (`_learned.Learned`)."""

    def estimate(self, summary: Summary) -> float: ...


#: key -> estimator class, in the order the classes are defined (`PerformanceEstimator`'s
#: `method` choices, `all_methods`' columns)
ESTIMATORS: Registry[type[Estimator]] = Registry("estimator")


class Estimator:
    """Base: `fit(source)` once, then `estimate(target) -> accuracy` in [0, 1]. A subclass
    that declares its `key` joins `ESTIMATORS` as it is defined."""

    key: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("key"):
            ESTIMATORS.add(cls.key, cls)

    def fit(self, source: SourceFit) -> Estimator:
        self.source = source
        return self

    def estimate(self, target: Target) -> float:
        raise NotImplementedError


class AC(Estimator):
    key = "ac"

    def estimate(self, target: Target) -> float:
        return target.confidence


class DoC(Estimator):
    key = "doc"

    def estimate(self, target: Target) -> float:
        s = self.source
        return float(np.clip(s.accuracy + target.confidence - s.confidence, 0.0, 1.0))


class ATC(Estimator):
    kind: ClassVar[str] = "mc"

    def fit(self, source: SourceFit) -> Estimator:
        super().fit(source)
        self.threshold = atc_threshold(source.scores[self.kind], source.correct, None)
        return self

    def estimate(self, target: Target) -> float:
        return target.summary.share_at_or_above(self.kind, self.threshold, None)


class ATCMC(ATC):
    key, kind = "atc-mc", "mc"


class ATCNE(ATC):
    key, kind = "atc-ne", "ne"


class LabelShiftEstimator(Estimator):
    key = "label-shift"

    def estimate(self, target: Target) -> float:
        return float(target.priors @ self.source.class_accuracy)


class COT(Estimator):
    key = "cot"

    def estimate(self, target: Target) -> float:
        return float(1.0 - target.costs.mean())


class COTT(Estimator):
    key = "cott"

    def fit(self, source: SourceFit) -> Estimator:
        super().fit(source)
        costs = transport_cost(
            source.lp.numpy(), source.priors, source.transport_points, source.seed
        )
        # the share of costs above t equals the source error: t = the (1 − error) quantile
        self.threshold = float(np.quantile(costs, source.accuracy)) if len(costs) else 0.5
        return self

    def estimate(self, target: Target) -> float:
        return float((target.costs <= self.threshold).mean())


class ATCLS(Estimator):
    key = "atc-ls"

    def estimate(self, target: Target) -> float:
        s = self.source
        w = (target.priors / np.maximum(s.priors, 1e-12))[s.y.numpy()]
        t = atc_threshold(s.scores["mc"], s.correct, w)
        return target.summary.share_at_or_above("mc", t, None)


class COTEM(Estimator):
    key = "cot-em"

    def estimate(self, target: Target) -> float:
        return float(1.0 - target.costs_em.mean())


class Auto(Estimator):
    """peg's default. Two modes, named by `mode` (and in `Estimate.method`):

    - "learned", when `learn` was given shifted copies of the source (`_learned`: fit on a
      model and images, or `shifted=` sets): `_learned.combiner` (a ridge) maps the base
      estimates (`FEATURES`) and the label-shift gap to the accuracy, learned on those copies,
      whose true accuracy is known. Assumes the target's shift resembles some of them (see
      `_learned`).
    - "gate", from logits alone: a gate between two estimators, each right where the other's
      assumption fails. The gate reads the label-shift gap g (`Target.label_shift_gap`): the
      target's mean confidence minus the one a pure label shift to EM's priors would give.
      |g| small (label shift explains the target): mean("ac", "atc-ls"); |g| large (the inputs
      changed): max("cot", "cot-em") (COT sees the confident collapse of predictions that the
      confidence-based estimators miss; with EM's marginal it does not charge a label shift
      as error; the max: each errs low when its marginal is wrong). Between: linear in |g|
      from δ to 2δ, δ = `GATE` × the largest |g| over the source's synthetic label shifts
      (`_shifts.shifted_sets`), i.e. the gap's own noise under a pure label shift. A label
      shift that looks like a collapse (or the reverse) fools the gate: without labels the
      two are not told apart by the predictions alone.
    Everything here was chosen on shifts of the source only (synthetic ones for the gate,
    corrupted copies for the learned mode, scored leave-one-corruption-family-out), none of
    the benchmark's target sets; the figures and the candidates measured are in
    docs/monitor.md.
    """

    key = "auto"
    parts: ClassVar[tuple[str, ...]] = ("ac", "atc-ls")
    branches: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (
        ("ac", "atc-ls"),
        ("cot", "cot-em"),
    )

    def fit(self, source: SourceFit) -> Estimator:
        super().fit(source)
        keys = {k for branch in self.branches for k in branch}
        self.members = {k: ESTIMATORS[k]().fit(source) for k in sorted(keys)}
        self.delta = max(GATE * synthetic_gap(source), 1e-3)
        self.learned: Learner | None = None
        return self

    @property
    def mode(self) -> str:
        return "gate" if self.learned is None else "learned"

    def learn(self, learned: Learner) -> None:
        """Switch to the learned mode (`_learned.Learned`, fitted on shifted source copies)."""
        self.learned = learned

    def weight(self, target: Target) -> float:
        """The gate's covariate-branch weight in [0, 1]."""
        return float(np.clip(abs(target.label_shift_gap) / self.delta - 1.0, 0.0, 1.0))

    def estimate(self, target: Target) -> float:
        if self.learned is not None:
            return self.learned.estimate(target.summary)
        w, value = self.weight(target), 0.0
        label, covariate = self.branches
        if w < 1:  # the transports are computed only when the covariate branch counts
            value += (1 - w) * np.mean([self.members[k].estimate(target) for k in label])
        if w > 0:
            value += w * max(self.members[k].estimate(target) for k in covariate)
        return float(value)


def synthetic_gap(source: SourceFit) -> float:
    """The largest |label-shift gap| over the synthetic label shifts of `source` (the second
    half resampled, read against the first half's fit)."""
    first, second = _shifts.split_halves(len(source.y), source.seed)
    half = SourceFit(source.lp[first], source.y[first], source.transport_points, source.seed)
    gaps = [0.0]
    for name, lp, _ in _shifts.shifted_sets(source.lp[second], source.y[second], source.seed):
        if name.startswith("label shift"):
            summary = Summary(source.classes, seed=source.seed)
            summary.add(lp)
            gaps.append(abs(Target(summary, half).label_shift_gap))
    return max(gaps)


def estimates(fitted: dict[str, Estimator], target: Target) -> dict[str, Any]:
    """Every fitted estimator's accuracy on one target, clipped to [0, 1]."""
    return {k: float(np.clip(e.estimate(target), 0.0, 1.0)) for k, e in fitted.items()}
