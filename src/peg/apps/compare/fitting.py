"""`Fitting`: the methods of one comparison fitted one after another, each in isolation: a method
that raises becomes a row with its error (`faults.failure`) and the run goes on (a method on a
failed base fails too, saying so); a finished method's row is saved at once (`state.State`),
and a resumed run takes the saved rows back and loads (or refits) a saved method's predictor only
when it is needed (loaded only where its archive is the one the row recorded).
"""

from __future__ import annotations

import time
from typing import Any

from torch import nn

from peg.apps import registry
from peg.apps.bench.spec import MethodSpec
from peg.apps.chain import as_base, chained_seconds
from peg.apps.compare.faults import failure
from peg.apps.compare.methods import MODEL, options
from peg.apps.compare.state import State
from peg.loading import load
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.perturbation._scale_search import MAX_SCORE_POINTS
from peg.source import Data
from peg.source.batches import BatchFn

PENDING = object()  # a resumed method's predictor, not loaded yet


class Fitting:
    """Fit methods on `model` with `val`: `run(i, spec)` returns the method's table row;
    `predictors()` every fitted predictor (resumed ones loaded from their archives, or refitted
    where they have none). `evaluation(spec, predictor, base)` gives a row's costs and metrics and
    keeps its reliability data (`evaluation.saved(name)`, `evaluation.restore(...)`)."""

    def __init__(
        self,
        model: nn.Module,
        val: Data,
        evaluation: Any,
        state: State,
        *,
        seed: int,
        progress: bool | None,
        batch_size: int,
        batch_fn: BatchFn | None,
    ) -> None:
        self.model, self.val, self.evaluation, self.state = model, val, evaluation, state
        self.seed, self.progress = seed, progress
        self.batch_size, self.batch_fn = batch_size, batch_fn
        # the calibrators' `task`, `ignore_index` on saved logits of another kind (`apps.kinds`)
        self.kind_options: dict[str, Any] = {}
        self.fitted: dict[str, Any] = {}
        self.specs: dict[str, MethodSpec] = {}
        self.seconds: dict[str, float] = {MODEL: 0.0}
        self.errors: dict[str, dict[str, Any]] = {}
        self.loaded: set[str] = set()  # resumed methods whose predictor came from its archive

    def run(self, i: int, spec: MethodSpec) -> dict[str, Any]:
        """Method `i`'s row: saved (when resuming), fitted and evaluated, or failed."""
        self.specs[spec.name] = spec
        saved = self.state.load(i, spec)
        if saved is not None:
            row = saved["row"]
            self.evaluation.restore(spec.name, saved["curves"], saved["sizes"])
            self.seconds[spec.name] = float(row["fit_seconds"])
            self.fitted[spec.name] = PENDING
            return row
        head = {"method": spec.name, "base": spec.base}
        if spec.base in self.errors:
            base_error = self.errors[spec.base]
            self.errors[spec.name] = {
                "type": base_error["type"],
                "message": f"its base, {spec.base}, failed",
                "hint": base_error["hint"],
            }
            return head | {"failed": self.errors[spec.name]}
        try:
            predictor, own = self._fit(spec)
            seconds = chained_seconds(own, spec.base, self.seconds)
            base = (
                (lambda: self.model) if spec.base == MODEL else (lambda: self.predictor(spec.base))
            )
            row = head | {"fit_seconds": seconds} | self.evaluation(spec, predictor, base)
        except Exception as e:  # one method's failure is its row; the others go on
            self.errors[spec.name] = failure(e)
            return head | {"failed": self.errors[spec.name]}
        self.seconds[spec.name], self.fitted[spec.name] = seconds, predictor
        sizes = self.evaluation.sizes
        warning = self.state.save(i, spec, row, self.evaluation.saved(spec.name), sizes, predictor)
        if warning is not None:  # the row stands: a failed save loses no work of this run
            self.state.say(f"compare: {spec.name}: {warning}")
            row["warning"] = warning
        return row

    def _fit(self, spec: MethodSpec) -> tuple[Any, float]:
        """The fitted predictor of `spec` and its own fit seconds."""
        base = self.model
        if spec.base != MODEL:
            base = self._as_base(spec)
        site = registry.Site(
            seed=self.seed,
            progress=self.progress,
            base=lambda: base,
            val=self.val,
            score_points=MAX_SCORE_POINTS,
        )
        started = time.perf_counter()
        made = options(spec, self.batch_size, self.batch_fn)
        if spec.method in Calibrator.registry:  # saved logits of another kind: how to read them
            made = made | self.kind_options
        predictor = registry.build(spec.method, site, **made)
        return predictor, time.perf_counter() - started

    def _as_base(self, spec: MethodSpec) -> Any:
        """The predictor of `spec`'s base as its base: a loaded archive where it serves (a
        loaded temperature scaling is no module for "TS → PEG"), else the base refitted (the
        same seed gives the same predictor)."""
        fitted = self.predictor(spec.base)
        try:
            return as_base(fitted, spec.method, spec.base)
        except ValueError:
            if spec.base not in self.loaded:
                raise
        self.loaded.discard(spec.base)
        self.fitted[spec.base] = self._fit(self.specs[spec.base])[0]
        return as_base(self.fitted[spec.base], spec.method, spec.base)

    def predictor(self, name: str) -> Any:
        """The fitted predictor of method `name` (a resumed one loaded or refitted now)."""
        if self.fitted[name] is PENDING:
            loaded = self._load(name)
            if loaded is None:
                self.fitted[name] = self._fit(self.specs[name])[0]
            else:
                self.fitted[name] = loaded
                self.loaded.add(name)
        return self.fitted[name]

    def _load(self, name: str) -> Any:
        path = self.state.archive(name)
        if path is None or not self.state.reusable(name):  # the archive its row recorded
            return None
        try:
            return load(path, self.model, val=self.val, batch_fn=self.batch_fn)
        except Exception:  # another architecture (a chain saved unrecorded), damaged: refit
            return None

    def predictors(self) -> dict[str, Any]:
        return {n: self.predictor(n) for n in self.fitted}
