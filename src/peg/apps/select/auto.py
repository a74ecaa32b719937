"""`AutoSelect`: the best post-hoc predictor for a trained model, chosen by cross-fitting on its
validation data only, under a cost budget (`peg.AutoSelect`; guide: docs/select.md).

It lives among the applications because its candidates are `peg.compare`'s methods (named as in
`peg.apps.compare.CATALOGUE`, built through the method registry); `peg.AutoSelect` imports it on
first use, as `peg.compare`. Its archive is the chosen predictor's own (`save`), with the report
in the archive's meta under `"auto_select"`: `peg.load(path, model)` gives the chosen predictor
back (a `TemperatureScaling`, an `Ensemble`, ...), and nothing in the core knows AutoSelect.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from peg import archive
from peg.apps import registry
from peg.apps.compare.costs import probe_rows
from peg.apps.compare.methods import _spec, logit_methods, options, resolve
from peg.apps.html import Report, Reported
from peg.apps.kinds import fitted_kind, kind_options, saved_kind
from peg.apps.results import json_ready
from peg.apps.select import page
from peg.apps.select.budgets import budget_seconds, check_seconds, drop_over_forwards
from peg.apps.select.cross import CrossFit
from peg.apps.select.folds import CRITERIA, check_fold_sizes, stratified_folds
from peg.apps.select.nested import nested_score, refit
from peg.apps.select.race import Plan, fold_lines
from peg.apps.select.reference import slowdown, ts_seconds, warm_up
from peg.apps.select.report import choose
from peg.ensemble import Predicts
from peg.methods import _constraints as checks
from peg.methods._predictors import (
    iter_member_logits_of,
    logits_and_labels,
    member_logits_of,
    read_predictor,
    stateless,
)
from peg.methods.base import Method, store_arguments
from peg.methods.calibration._calibrator import calibrators
from peg.methods.calibration._kinded import check_integer
from peg.source import Data, Source
from peg.source._kinds import IGNORE_INDEX, TASKS, Kind
from peg.source._values import check_labels
from peg.source.batches import BatchFn, check_batch_fn
from peg.utils.io import atomic_target

# the default candidates beyond the maps of logits (Laplace and MC dropout only where they
# apply: `faults.precheck`)
MODEL_CANDIDATES = ("PEG", "Last-layer PEG", "TS → PEG", "PEG + TS", "PEP", "Laplace", "MC dropout")


def __getattr__(name: str) -> tuple[str, ...]:
    # the default candidates, read from the registry when asked (not frozen at this import: a
    # map registered, or removed, after it is, or is not, among them)
    if name == "LOGIT_CANDIDATES":  # for saved logits (a model without parameters)
        return logit_methods()
    if name == "DEFAULT_CANDIDATES":
        return (*logit_methods(), *MODEL_CANDIDATES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _candidate_list(value: Any, name: str) -> None:
    """None (the defaults) or a non-empty list of candidates, each one compare knows."""
    if value is None:
        return
    if isinstance(value, (str, Mapping)) or not isinstance(value, Sequence):
        raise TypeError(f"{name}: expected a list, got {value!r}")
    if not value:
        raise ValueError(f"{name}: expected at least one candidate")
    for i, entry in enumerate(value):
        _as_candidates(lambda e=entry, i=i: _spec(e, f"{name}[{i}]"))


class AutoSelect(Reported, Predicts, Method):
    """Choose, fit and report the best post-hoc predictor for `model` on validation data: the
    least mean cross-fitted criterion over K folds or, with `one_se`, the cheapest candidate
    within one paired standard error of it (the one-SE rule, Hastie et al., "The Elements of
    Statistical Learning", §7.10).

    `fit(model, val)` cross-fits every candidate on `cv` stratified, seeded folds of `val` (the
    same folds for all: paired per-point scores), drops the candidates over budget, picks the
    best mean `criterion` (with `one_se`, the cheapest within one paired SE of it: see
    `peg.apps.select.report`), refits it on all of `val`, and then predicts as it does.

    Args:
        candidates: names from `peg.apps.compare.CATALOGUE` ("TS", "Vector scaling", "PEG",
            "PEG + TS", ...), `peg.apps.compare.method(...)` specs or mappings; a chained
            candidate's base is added before it (and is a candidate too). None:
            `DEFAULT_CANDIDATES` (Laplace only with laplace-torch and a Linear last module, MC
            dropout only on a model with dropout); `LOGIT_CANDIDATES` for a model without
            parameters (saved logits through `nn.Identity()`).
        cv: folds (≥ 2, at most half the validation points: a fold of fewer than 2 points is
            refused, fewer than 10 on average warned of; `peg.apps.select.folds`); a class
            with fewer than `cv` points is warned of.
        criterion: "nll" or "brier" (per point, lower is better).
        max_forwards: drop candidates predicting with more forwards of the model per input
            (measured as `peg.compare` does, on the first fold's predictor). None: no limit.
        max_fit_seconds: the whole fit's time budget in seconds (`peg.apps.select.race`: a
            candidate starts only where it and the kept ones can finish; after each fold the
            dearest is dropped while the rest would pass it; what is skipped says why).
            "auto": `AUTO_BUDGET` (25) × the measured temperature scaling fit (a forward pass
            of `val` and the fit of T: `cost_["reference_seconds"]`), at least
            `MIN_BUDGET_SECONDS` (10) of an unloaded machine (× `cost_["slowdown"]`, the wall
            over the CPU seconds of that pass and fit, at least 1). None: no budget and no race,
            every candidate on every fold (the exhaustive run).
        race: under a budget, once two folds are in, drop a candidate whose paired difference
            to the leader exceeds this many standard errors (None: no race).
        one_se: take the cheapest candidate within one paired SE of the best (else the best).
        seed: the folds' and every candidate's seed.
        progress: progress bar (None: only on a terminal).
        nested: also estimate the whole procedure's score by nested cross-validation (`cv`
            outer folds, each running the selection on the rest): `nested_` (`cv` × the cost).
        batch_size, batch_fn: rows per forward pass; how to split loader batches.
        task, ignore_index: how saved logits of another kind are read (binary `[N]`,
            multilabel `[N, K]`, dense `[B, C, *S]`: `peg.apps.kinds`, whose candidates
            are `calibrators(kind)`, scored on the kind's rows) and the label left out.

    Attributes (after `fit`):
        predictor_: the chosen candidate refitted on all of `val`.
        chosen_: its name.
        report_: a row per candidate (dicts: "candidate", "cv_mean", "cv_se", "diff", "diff_se"
            (paired, to the best), "forwards", "vs_base" (`peg.apps.compare.collapse`: a
            candidate indistinguishable from its base is left out of the choice unless better
            beyond noise), "fit_seconds" (mean per fold), "status" ("chosen", "kept",
            "dropped") and "why"); `to_markdown()` shows it.
        score_: `{"criterion", "mean", "se"}`: the chosen candidate's CV score, optimistically
            biased (it won on these folds); `nested_` is the honest estimate.
        nested_: `{"mean", "se", "chosen"}` (the outer folds' choices) with `nested=True`, else
            None.
        cost_: `{"seconds", "setup_seconds", "reference_seconds", "times_reference",
            "budget_seconds", "slowdown", "max_fit_seconds", "race"}`: what the whole fit cost (wall
            seconds), against a TS fit on the same data timed after the one-time costs
            (imports, a first forward: `setup_seconds`, outside the budget).
        meta_: what was fitted (method "auto-select", the choice, the settings, the cost).
        reliability_: reliability data on `val`, the model's and the choice's out of fold.
        verdict_: the answer (`peg.apps.verdict.Verdict`): the choice against the uncalibrated
            model on the same points (the criterion and the ECE before → after, paired SEs,
            whether the difference is real); `baseline_`: the uncalibrated model's row.

    Shown: `to_markdown()`, `to_html(path=None)`, `to_pandas()`, `to_text()`, and in a notebook.
    """

    def __init__(
        self,
        *,
        candidates: Sequence[Any] | None = None,
        cv: int = 5,
        criterion: str = "nll",
        max_forwards: float | None = None,
        max_fit_seconds: float | str | None = "auto",
        race: float | None = 3.0,
        one_se: bool = True,
        seed: int = 0,
        progress: bool | None = None,
        nested: bool = False,
        batch_size: int = 512,
        batch_fn: BatchFn | None = None,
        task: str = "auto",
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        store_arguments(self, locals())

    parameter_constraints: ClassVar[Mapping[str, checks.Check]] = {
        "candidates": checks.described(
            _candidate_list, "None (the defaults) or a non-empty list of candidate names"
        ),
        "cv": checks.positive_int(minimum=2),
        "criterion": checks.one_of(*CRITERIA),
        "max_forwards": checks.number(optional=True),
        "max_fit_seconds": checks.described(
            check_seconds, "'auto', None or a number of seconds > 0"
        ),
        "race": checks.number(optional=True),
        "one_se": checks.boolean(),
        "seed": checks.positive_int(minimum=0),
        "progress": checks.boolean(optional=True),
        "nested": checks.boolean(),
        "batch_size": checks.positive_int(),
        "batch_fn": checks.batch_fn,
        "task": checks.one_of(*TASKS),
        "ignore_index": checks.described(check_integer, "an integer (a label left out)"),
    }

    # ---------------------------------------------------------------- fitting
    def fit(self, model: nn.Module, val: Data) -> AutoSelect:
        """Cross-fit the candidates on `val`, choose, refit the choice on all of `val`;
        `fit(logits, labels)` on saved logits `[N, C]` and their labels (`read_predictor`)."""
        self._check_params()  # as the constructor did: catches an attribute set directly
        started = time.perf_counter()
        model, val = read_predictor(model, val, "model", "a trained nn.Module", kinds=True)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a trained nn.Module, got {type(model).__name__}")
        batch_fn = check_batch_fn(self.batch_fn)
        source = Source(val, batch_fn, "val").rows()
        if not source.indexable:
            raise TypeError("val: AutoSelect reads folds by index; an IterableDataset cannot be")
        check_fold_sizes(len(source), self.cv, self.nested)  # before any fold or forward pass
        kind = (
            saved_kind(val, self.task, self.ignore_index, self.nested) if stateless(model) else None
        )
        defaults = logit_methods() + (() if stateless(model) else MODEL_CANDIDATES)
        if kind is not None:  # the maps that take the kind, whatever the registry holds
            defaults = tuple(c.name for c in calibrators(kind.kind))
        entries = list(defaults if self.candidates is None else self.candidates)
        specs, skipped = _as_candidates(lambda: resolve(entries, model))
        site = registry.Site(seed=self.seed, progress=False)
        made = ((s.name, s.method, options(s, self.batch_size, batch_fn)) for s in specs)
        _as_candidates(lambda: registry.check_all(made, site))
        rows = probe_rows(val, batch_fn)
        model_flops = warm_up(model, rows)  # one-time costs, outside the reference and budget
        clock, cpu = time.perf_counter(), time.process_time()  # the budget's clock from here
        logits, y = logits_and_labels(model, val, self.batch_size, batch_fn, "val")  # once
        forward = time.perf_counter() - clock
        if kind is None:
            y = check_labels(y, len(y), logits.shape[-1], name="val labels")  # before any
        reference = forward + ts_seconds(logits, y, **kind_options(kind))
        load = slowdown(time.perf_counter() - clock, time.process_time() - cpu, logits.device)
        budget = budget_seconds(self.max_fit_seconds, reference, load)
        everything = torch.arange(len(y))
        cross = self._cross(model, source, logits, y, specs, rows, kind=kind)
        strata = y if cross.kept is None else cross.kept.strata(y)
        folds = stratified_folds(strata, self.cv, self.seed)  # class counts checked first
        cross._model_flops = model_flops
        cross.run(folds, self._budget, self._plan(budget, cross, clock, forward))
        # the points: the samples (multiclass), another kind's rows not ignored
        rows_logits, rows_y, points = cross.as_points(logits, everything)
        report, chosen = choose(cross, specs, torch.arange(len(points)), self.one_se, skipped)
        self.reliability_ = page.reliability(rows_logits, rows_y, cross.top[chosen], chosen)
        self.verdict_, self.baseline_ = page.verdict(rows_logits, rows_y, cross, chosen, report)
        chain = refit(cross, specs, chosen, everything)
        seconds = time.perf_counter() - started
        self.predictor_ = chain[chosen]
        self.kind_ = getattr(self.predictor_, "kind_", None)  # what evaluate reads
        row = next(r for r in report if r["candidate"] == chosen)
        self.score_ = {"criterion": self.criterion, "mean": row["cv_mean"], "se": row["cv_se"]}
        self.nested_ = self._nested(cross, specs, skipped, budget, forward) if self.nested else None
        self.chosen_, self.report_ = chosen, report
        self.cost_ = {
            "seconds": seconds,
            "setup_seconds": clock - started,
            "reference_seconds": reference,
            "times_reference": seconds / reference if reference > 0 else float("nan"),
            "budget_seconds": budget,
            "slowdown": load,
            "max_fit_seconds": self.max_fit_seconds,
            "race": None if budget is None else self.race,
        }
        self.meta_ = {
            "method": "auto-select",
            "chosen": chosen,
            "criterion": self.criterion,
            "cv": self.cv,
            "one_se": self.one_se,
            "seed": self.seed,
            "score": self.score_,
            # the scales fitted along the chosen chain (T of "TS → PEG"'s base: its archive is
            # of `Scaled(model, T)`)
            "scales": {n: registry.scales(p) for n, p in chain.items()},
            "nested": self.nested_,
            "cost": self.cost_,
            "report": report,
            "verdict": self.verdict_.to_dict(),
        }
        return self

    def _cross(self, *data: Any, kind: Kind | None = None) -> CrossFit:
        """The cross-fitting of `(model, source, logits, y, specs, rows)` under these settings."""
        return CrossFit(
            *data[:5],
            criterion=self.criterion,
            seed=self.seed,
            batch_size=self.batch_size,
            batch_fn=check_batch_fn(self.batch_fn),
            rows=data[5],
            progress=self.progress,
            kind=kind,
        )

    def _plan(self, budget: float | None, cross: CrossFit, started: float, forward: float) -> Plan:
        """The race and budget of one cross-fitting (the nested CV's inner ones too: each under
        the same budget and the same prices, from the same measured forward pass of `val`)."""
        classes = int(cross.logits.shape[-1]) if cross.kind is None else cross.kind.width
        return Plan(budget, self.race, started, fold_lines(cross.progress), forward, classes)

    def _budget(self, cross: CrossFit) -> None:
        drop_over_forwards(cross, self.max_forwards)

    def _nested(
        self,
        cross: CrossFit,
        specs: list[Any],
        skipped: dict[str, str],
        budget: float | None,
        forward: float,
    ) -> dict[str, Any]:
        """`nested.nested_score`: each inner selection under the same budget, prices and race."""

        def select(inner: list[Tensor]) -> CrossFit:
            sub = self._cross(cross.model, cross.source, cross.logits, cross.y, specs, cross.rows)
            sub.run(inner, self._budget, self._plan(budget, sub, time.perf_counter(), forward))
            return sub

        return nested_score(
            cross, specs, skipped, select, cv=self.cv, seed=self.seed, one_se=self.one_se
        )

    # ---------------------------------------------------------------- predicting
    def _fitted(self) -> Any:
        self._check_fitted()
        return self.predictor_

    def member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        *,
        batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Tensor:
        """The chosen predictor's member logits `[M, N, C]` (the predictor protocol)."""
        size, split = self._reading(batch_size, batch_fn)
        return member_logits_of(self._fitted(), X, size, split, **options)

    def iter_member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        *,
        batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Iterator[Tensor]:
        """`member_logits` batch by batch (the chosen predictor's)."""
        size, split = self._reading(batch_size, batch_fn)
        return iter_member_logits_of(self._fitted(), X, size, split, **options)

    def __len__(self) -> int:
        return len(self._fitted())

    def predict_proba(self, X: Data, batch_size: int | None = None, **options: Any) -> Any:
        """The chosen predictor's probabilities (another kind's in the input's shape)."""
        return (fitted_kind(self._fitted()) or super()).predict_proba(X, batch_size, **options)

    def predict(self, X: Data, batch_size: int | None = None, **options: Any) -> Any:
        """The chosen predictor's predicted labels (another kind's in its shape)."""
        return (fitted_kind(self._fitted()) or super()).predict(X, batch_size, **options)

    def to_markdown(self) -> str:
        """The verdict (`verdict_`), `report_` as a markdown table (the uncalibrated baseline's
        row first), then the choice and its scores."""
        self._check_fitted("to_markdown")
        return page.markdown(self)

    def _reportable(self) -> bool:
        return self.__sklearn_is_fitted__()

    def _report(self) -> Report:
        self._check_fitted("reporting")
        return page.report(self)

    def save(self, path: str | os.PathLike[str]) -> str:
        """The chosen predictor's archive (its own `save`) with the report in the meta under
        `"auto_select"`; `peg.load(path, model)` gives the chosen predictor back.

        Written once, atomically: the predictor's `save` writes it, the report added by
        `peg.archive.with_meta`; a predictor whose archive cannot carry the report (Laplace's
        own format) is a TypeError, `path` left as it was."""
        self._check_fitted("saving")
        predictor = self.predictor_
        if not callable(getattr(predictor, "save", None)):
            raise TypeError(f"AutoSelect: the chosen {self.chosen_} cannot be saved")
        report = {"auto_select": json_ready(self.meta_)}  # strict JSON
        with atomic_target(path) as tmp, archive.with_meta(report) as written:
            predictor.save(tmp)
            if written != [tmp]:
                raise TypeError(
                    f"AutoSelect: the chosen {self.chosen_} saves in a format of its own, "
                    "which cannot carry the report; save predictor_ itself"
                )
        return str(path)


def _as_candidates(call: Any) -> Any:
    """`call()`, its errors naming `candidates` (compare's name them `methods`)."""
    try:
        return call()
    except (TypeError, ValueError) as e:
        raise type(e)(str(e).replace("methods", "candidates")) from None
