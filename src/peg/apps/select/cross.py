"""`CrossFit`: every candidate of `AutoSelect` fitted on K − 1 folds and scored on the held-out
fold, the same folds for every candidate (paired per-point scores), under the budgets.

Shared work is done once: the model's logits on the validation set are computed once (by
`AutoSelect.fit`) and every calibrator fitted on the model itself (temperature, vector and
matrix scaling, Dirichlet, binning, isotonic) is fitted on the fold's rows of those logits and
scores the held-out rows of them, with no forward pass; a chained candidate ("TS → PEG") is
fitted on its base's predictor of the same fold, and a calibrator chained on a fitted base
("PEG + TS") on that base's member logits: on the held-out fold those the base was scored with
(no forward pass of its own), on the training part computed once, for a one-parameter map
(temperature) on a seeded subsample of at most `ONE_PARAMETER_POINTS` points (one scalar needs
no more; the refit of a chosen one uses all of `val`). The other candidates (PEG, PEP, Laplace, MC
dropout) are fitted through the method registry on a view of the fold
(`peg.source._rows.ValSource.view`: indices over the validation data, nothing gathered) and predict
the held-out view.

From the same held-out outputs (no forward pass of its own), a candidate with more members than
its base is measured against it (`peg.apps.compare.collapse.vs_base`: against the cached logits
for the model, the base's own held-out outputs for a chained one): `gaps`, which the choice reads.

The candidates run in `race.cheap_first` order, fold by fold; a `race.Plan` decides after each
fold what is raced out or over budget, and when a candidate may start (module doc of `race`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor, nn

from peg.apps import registry
from peg.apps.bench.spec import MethodSpec
from peg.apps.chain import as_base
from peg.apps.compare.collapse import indistinguishable, vs_base
from peg.apps.compare.costs import flops
from peg.apps.compare.faults import failure
from peg.apps.compare.methods import MODEL, options
from peg.apps.kinds import Points, kind_options
from peg.apps.select.deadline import Overrun, stop_at
from peg.apps.select.folds import point_scores
from peg.apps.select.race import Plan, cheap_first
from peg.methods._predictors import logits_and_labels
from peg.methods.calibration._affine_select import reduces_to
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.perturbation._scale_search import MAX_SCORE_POINTS
from peg.metrics._inputs import ensemble_log_probs
from peg.source import ValSource
from peg.source._kinds import Kind
from peg.utils.progress import bar, lines

# the most points a one-parameter map chained on a fitted base is cross-fitted on (a fold)
ONE_PARAMETER_POINTS = 1000


class Cached:
    """Member logits computed already, as a predictor of them: `member_logits(X)` of `X`
    `[N, M, C]` (the logits with the points first, so that a fold indexes them) is `[M, N, C]`."""

    def member_logits(self, X: Tensor, batch_size: int = 512, **_: Any) -> Tensor:
        return X.transpose(0, 1)


class CrossFit:
    """Cross-fit `specs` on `model` (see the module doc): `run(folds)` fills `points` (name →
    out-of-fold scores `[N]`), `top` (name → out-of-fold top-class confidence `[N]` float64 and
    whether it is right `[N]` bool: the chosen one's reliability diagram), `seconds` (name →
    fit seconds per fold, a chained candidate's base's included), `forwards` (name →
    prediction cost, measured on the first fold's predictor), `gaps` (name →
    `collapse.vs_base` on the held-out points, the largest over the folds; None where not
    measured: no more members than its base), `reduced` (name → per fold, the simpler map an
    affine map's cross-validated strengths made it: `_affine_select.reduces_to`) and
    `dropped` (name → why)."""

    def __init__(
        self,
        model: nn.Module,
        source: ValSource,
        logits: Tensor,
        y: Tensor,
        specs: list[MethodSpec],
        *,
        criterion: str,
        seed: int,
        batch_size: int,
        batch_fn: Any,
        rows: Any,
        progress: bool | None = None,
        kind: Kind | None = None,
    ) -> None:
        self.model, self.source, self.logits, self.y = model, source, logits, y
        # another kind than multiclass: scored on its canonical rows (`kinds.Points`)
        self.kind = kind
        self.kept = None if kind is None or kind.kind == "multiclass" else Points(kind, y)
        self.specs, self.criterion, self.seed = specs, criterion, seed
        self.batch_size, self.batch_fn, self.rows = batch_size, batch_fn, rows
        self.progress = progress
        n = len(y) if self.kept is None else len(self.kept)
        self.points = {s.name: torch.full((n,), float("nan"), dtype=torch.float64) for s in specs}
        self.top = {s.name: (torch.full((n,), float("nan"), dtype=torch.float64),
                             torch.zeros(n, dtype=torch.bool)) for s in specs}  # fmt: skip
        self.seconds: dict[str, list[float]] = {s.name: [] for s in specs}
        self.forwards: dict[str, float | None] = {}
        self.dropped: dict[str, str] = {}
        self.stopped: set[str] = set()  # stopped within a fold (`deadline`): past the budget
        self.gaps: dict[str, float | None] = {}
        # name → per scored fold, the simpler map its chosen strengths made it (None: none)
        self.reduced: dict[str, list[str | None]] = {s.name: [] for s in specs}
        self._fold_seconds: dict[str, float] = {}  # this fold's, chained
        self._bases = {s.base for s in specs}
        self._held: dict[str, tuple[int, Tensor]] = {}  # this fold's bases: members, log-probs
        self._raw: dict[str, Tensor] = {}  # this fold's held-out member logits of mapped bases
        self._mapped_bases = {
            s.base for s in specs if s.method in Calibrator.registry and s.base != MODEL
        }
        self.steps: dict[str, list[float]] = {s.name: [] for s in specs}  # a fold's own seconds
        self.base_of = {s.name: s.base for s in specs}
        self.order = cheap_first(specs, self._on_logits)
        self._model_flops: int | None = None
        self._probing = 0.0  # this step's seconds measuring the prediction cost

    # ---------------------------------------------------------------- one candidate
    def fit(
        self, spec: MethodSpec, idx: Tensor, fitted: dict[str, Any], bounded: bool = False
    ) -> tuple[Any, float]:
        """`spec` fitted on the points `idx` (its base: `fitted[spec.base]`, of the same
        points; `bounded`: a one-parameter map chained on it on a bounded subsample of them,
        as in a fold); returns the predictor and its own fit seconds."""
        on_logits = self._on_logits(spec)
        mapped = self._mapped(spec, fitted)
        started = time.perf_counter()
        if on_logits:
            base: Any = nn.Identity()  # the logits are the inputs, the map fitted where they are
            val: Any = (self.logits[0][idx], self.y[idx])
            made = options(spec, self.batch_size, None) | kind_options(self.kind)
        elif mapped:  # the base's member logits, as inputs (see the module doc)
            base, made = Cached(), options(spec, self.batch_size, None)
            val = self._base_logits(spec, fitted[spec.base], idx, bounded)
        else:
            base = self.model
            if spec.base != MODEL:
                base = as_base(fitted[spec.base], spec.method, spec.base)
            val = self.source.view(idx)
            made = options(spec, self.batch_size, self.batch_fn)
        site = registry.Site(
            seed=self.seed,
            progress=False,
            base=lambda: base,
            val=val,
            score_points=MAX_SCORE_POINTS,
        )
        predictor = registry.build(spec.method, site, **made)
        seconds = time.perf_counter() - started
        if on_logits:  # the map acts on the model's logits: predict through the model
            predictor._set_fitted(self.model, {})
        elif mapped:  # ... on its base's: predict through the base
            predictor._set_fitted(fitted[spec.base], {})
        return predictor, seconds

    def _on_logits(self, spec: MethodSpec) -> bool:
        return spec.base == MODEL and spec.method in Calibrator.registry

    def cheap(self, name: str) -> bool:
        """Whether candidate `name` is a map on the cached logits (it costs next to nothing)."""
        spec = next(s for s in self.specs if s.name == name)
        return self._on_logits(spec) or registry.entry(spec.method) is registry.Base

    def _mapped(self, spec: MethodSpec, fitted: dict[str, Any]) -> bool:
        """A calibrator on a base fitted in this fold: fitted on its member logits."""
        return spec.base != MODEL and spec.method in Calibrator.registry and spec.base in fitted

    def _base_logits(
        self, spec: MethodSpec, base: Any, idx: Tensor, bounded: bool
    ) -> tuple[Tensor, Tensor]:
        """The base's member logits on the points `idx` (a bounded subsample of them for a
        one-parameter map), points first `[n, M, C]`, and their labels."""
        one_parameter = registry.entry(spec.method).method is TemperatureScaling
        if bounded and one_parameter and len(idx) > ONE_PARAMETER_POINTS:
            g = torch.Generator().manual_seed(self.seed)
            idx = idx[torch.randperm(len(idx), generator=g)[:ONE_PARAMETER_POINTS]].sort().values
        logits = logits_and_labels(base, self.source.view(idx), self.batch_size,
                                   self.batch_fn, "val")[0]  # fmt: skip
        return logits.transpose(0, 1), self.y[idx]

    def outputs(self, spec: MethodSpec, predictor: Any, idx: Tensor) -> Tensor:
        """Member logits `[M, len(idx), C]` of `predictor` on the points `idx`."""
        if registry.entry(spec.method) is registry.Base and spec.base == MODEL:
            return self.logits[:, idx]
        if self._on_logits(spec):
            return predictor.scale(self.logits[:, idx])
        data = self.source.view(idx)
        return logits_and_labels(predictor, data, self.batch_size, self.batch_fn, "val")[0]

    def score(self, spec: MethodSpec, predictor: Any, idx: Tensor) -> Tensor:
        """Per-point scores of `predictor` on the points `idx` (another kind's: on the kept
        rows of the samples `idx`, `kinds.Points.of(idx)`)."""
        logits, y, _ = self.as_points(self.outputs(spec, predictor, idx), idx)
        return point_scores(logits, y, self.criterion)

    def as_points(self, logits: Tensor, idx: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Member logits of the samples `idx` as the points' logits `[M, n, W]`, their labels
        and their indices into `points` (multiclass: as they are, and `idx`)."""
        if self.kept is None:
            return logits, self.y[idx], idx
        rows, y = self.kept.rows(logits, idx)
        return rows, y, self.kept.of(idx)

    def measure(self, spec: MethodSpec, logits: Tensor, held: Tensor) -> float | None:
        """`collapse.vs_base` of `spec`'s held-out member logits `[M, n, C]` against its base's
        outputs on the same points, held already (None where the base has as many members, or
        its outputs are not held: a base fitted but not scored)."""
        members = logits.shape[0]
        if spec.name in self._mapped_bases:
            self._raw[spec.name] = logits
        if spec.name in self._bases:
            self._held[spec.name] = (members, ensemble_log_probs(logits))
        if spec.base == MODEL:
            known = (self.logits.shape[0], self.logits[:, held])
            if members <= known[0]:
                return None
            return vs_base(logits, known[0], ensemble_log_probs(known[1]))
        held_base = self._held.get(spec.base)
        return None if held_base is None else vs_base(logits, *held_base)

    # ---------------------------------------------------------------- every candidate, every fold
    def run(self, folds: list[Tensor], budget: Any, plan: Plan | None = None) -> None:
        """Cross-fit every candidate over `folds`, fold by fold in `order`; `budget(self)` is
        called after the first fold (it drops what is over the forwards budget, or raises),
        `plan` decides what starts, what is raced out and what is over the time budget."""
        steps = [(f, s) for f in range(len(folds)) for s in self.order]
        fitted: dict[str, Any] = {}
        say = lines(self.progress)  # a line per step in a log, where no bar shows
        said: set[str] = set()
        for f, spec in bar(steps, "AutoSelect: cross-fitting", len(steps), self.progress):
            if spec is self.order[0]:  # a new fold: its own predictors
                fitted, self._fold_seconds, self._held, self._raw = {}, {}, {}, {}
            if f == 0 and plan is not None:
                self._admit(plan, spec, len(folds))
            held = folds[f]
            train = torch.cat([folds[j] for j in range(len(folds)) if j != f]).sort().values
            started, self._probing = time.perf_counter(), 0.0
            allowed = None if plan is None else plan.allowance(self, spec, f, len(folds))
            with stop_at(allowed):  # a fold past its share of the budget is stopped mid-fold
                ran = self._one(spec, f, train, held, fitted)
            if ran:  # its seconds, less the one-off probe
                self.steps[spec.name].append(time.perf_counter() - started - self._probing)
                done = f"{self._fold_seconds.get(spec.name, 0):.1f} s"
                if spec.name not in self.dropped and indistinguishable(self.gaps.get(spec.name)):
                    done += f"; indistinguishable from its base ({spec.base}) so far"
                if spec.name not in self.dropped:
                    say(f"AutoSelect [fold {f + 1}/{len(folds)}] {spec.name}: {done}")
            if spec.name in self.dropped and spec.name not in said:  # once, when it happens
                said.add(spec.name)
                say(f"AutoSelect [fold {f + 1}/{len(folds)}] {spec.name}: "
                    f"{self.dropped[spec.name]}")  # fmt: skip
            if spec is self.order[-1]:
                if f == 0:
                    budget(self)
                if plan is not None:
                    plan.after_fold(self, folds, f)

    def _forwards(self, predictor: Any) -> float | None:
        """`compare.costs.forwards`, the model's FLOPs counted once for every candidate."""
        started = time.perf_counter()
        if self._model_flops is None:
            self._model_flops = flops(self.model, self.rows)
        own = flops(predictor, self.rows) if self._model_flops else 0
        self._probing = time.perf_counter() - started  # once a candidate: not a fold's cost
        return own / self._model_flops if self._model_flops else None

    def _admit(self, plan: Plan, spec: MethodSpec, folds: int) -> None:
        """Whether `spec` starts (`plan.admit`); not started, the candidates chained on it are
        asked now too, so that it is not fitted as a base for candidates that will not start."""
        for candidate in [spec] + [s for s in self.order if s.base == spec.name]:
            if candidate.name in self.dropped:
                continue
            if candidate is not spec and spec.name not in self.dropped:
                return  # it starts: its chained candidates are asked in their turn
            why = plan.admit(self, candidate, folds)
            if why is not None:
                self.dropped[candidate.name] = why

    def _needed(self) -> set[str]:
        active = [s for s in self.specs if s.name not in self.dropped]
        return {s.name for s in active} | {s.base for s in active}

    def _one(
        self, spec: MethodSpec, f: int, train: Tensor, held: Tensor, fitted: dict[str, Any]
    ) -> bool:
        """Fit and score `spec` on fold `f`; whether it was fitted."""
        name = spec.name
        if name not in self._needed():
            return False
        if spec.base != MODEL and spec.base not in fitted:
            why = "was stopped (over budget)" if spec.base in self.stopped else "failed"
            self.dropped.setdefault(name, f"its base, {spec.base}, {why}")
            return False
        try:
            predictor, own = self.fit(spec, train, fitted, bounded=True)
            fitted[name] = predictor
            self._fold_seconds[name] = own + self._fold_seconds.get(spec.base, 0.0)
            if name in self.dropped:
                return True  # fitted as the base of a kept candidate only
            # its base's, this fold's
            if spec.base in self._raw and spec.method in Calibrator.registry:
                logits = predictor.scale(self._raw[spec.base])
            else:
                logits = self.outputs(spec, predictor, held)
            rows, y, at = self.as_points(logits, held)
            self.points[name][at] = point_scores(rows, y, self.criterion)
            confidence, predicted = ensemble_log_probs(rows).max(-1)
            self.top[name][0][at] = confidence.exp().double().cpu()
            self.top[name][1][at] = predicted.cpu() == y.cpu()
            gap, before = self.measure(spec, logits, held), self.gaps.get(name)
            if f > 0:  # the largest over the folds; not measured on one fold: not measured
                gap = None if gap is None or before is None else max(gap, before)
            self.gaps[name] = gap
            self.seconds[name].append(self._fold_seconds[name])
            record = getattr(predictor, "regularisation_", None)
            full = bool(getattr(predictor, "full", False))
            self.reduced[name].append(reduces_to(record if isinstance(record, dict) else None,
                                                 full))  # fmt: skip
            if f == 0:
                self.forwards[name] = self._forwards(predictor)
        except Overrun as e:  # past its share of the budget (`race.Plan.allowance`)
            fitted.pop(name, None)  # not a base for this fold's chained candidates either
            self.stopped.add(name)
            self.dropped.setdefault(name, (
                f"stopped in fold {f + 1}: over budget, past its share of it ({e.allowed:.3g} s "
                "a fold: what the budget leaves after the kept candidates, over its folds left)"
            ))  # fmt: skip
        except Exception as e:  # a failing candidate is dropped; the others go on
            error = failure(e)
            self.dropped[name] = f"failed: {error['type']}: {error['message']}"
        return True
