"""`peg.compare(model, val, test)`: fit post-hoc methods on a trained model and its validation
data, evaluate them on test data (and shifted and OOD sets), one table of costs and metrics.

Every argument is checked before anything is fitted (errors name it). Then, method by method
(`peg.apps.compare.methods`; built through the method registry `peg.apps.registry`, as the
bench builds its methods): fit on `val` (timed), predict every evaluation set once (member
logits `[M, N, C]` of one set held at a time, as the bench's cache holds them), score them with
the bench's metrics (`peg.apps.scores`), measure the costs (`peg.apps.compare.costs`), note an
ensemble indistinguishable from its base (`peg.apps.compare.collapse`), and say one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from peg import distributed, metrics
from peg.apps import kinds, registry
from peg.apps.bench.spec import MethodSpec
from peg.apps.compare.collapse import indistinguishable, note, vs_base
from peg.apps.compare.costs import forwards, held_bytes, probe_rows
from peg.apps.compare.diagrams import figure_name
from peg.apps.compare.faults import check_data, describe
from peg.apps.compare.fitting import Fitting
from peg.apps.compare.methods import MODEL, options, resolve
from peg.apps.compare.report import TEST, Comparison, check_shown, column
from peg.apps.compare.sets import argument, check_widths, fingerprints, read_sets
from peg.apps.compare.state import PRINT, Say, State, told
from peg.apps.conformal import ConformalSpec, parse_conformal, scorer
from peg.apps.results import RESULTS
from peg.apps.scores import CLASSIFICATION, labelled_metrics, ood_detection, scored_detection
from peg.apps.verdict import per_point
from peg.detectors import DETECTOR_SCORES, OODDetector
from peg.methods._predictors import read_predictor
from peg.methods.perturbation._scale_search import MAX_SCORE_POINTS
from peg.metrics._inputs import ensemble_log_probs
from peg.metrics.ood import OOD_SCORES
from peg.source import Data
from peg.source._kinds import IGNORE_INDEX, Kind
from peg.source.batches import BatchFn, check_batch_fn
from peg.utils.scalars import check_positive_int, check_seed


def compare(
    model: nn.Module,
    val: Data,
    test: Data,
    methods: Sequence[Any] | None = None,
    *,
    shifted: Data | Mapping[str, Data] | None = None,
    ood: Data | Mapping[str, Data] | None = None,
    ood_score: str = "entropy",
    seed: int = 0,
    batch_size: int = 512,
    batch_fn: BatchFn | None = None,
    bins: int = 15,
    metrics: Sequence[str] | None = None,
    conformal: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    out: str | Path | None = None,
    say: Say | None = PRINT,
    command: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    task: str = "auto",
    ignore_index: int = IGNORE_INDEX,
) -> Comparison:
    """Fit post-hoc methods on `model` with `val`; compare them on `test` (and shifted, OOD).

    Args:
        model: the trained classifier (an nn.Module returning logits `[B, C]`); never changed.
            Or saved validation logits `[N, C]` (a tensor or a NumPy array), `val` then their
            labels `[N]` and `test` the pair `(test_logits, test_labels)`: the model is then
            `nn.Identity()`, and the defaults are the maps of logits (below).
        val: labelled validation data the methods are fitted on: a pair `(X, y)` of tensors or
            arrays, a Dataset or a DataLoader (batches `(x, y, ...)`, mappings with "labels",
            or any shape with `batch_fn`; `peg.source.batches`).
        test: labelled test data, as `val`.
        methods: names from `peg.apps.compare.CATALOGUE` ("TS", "PEP", "PEG", "PEG + TS",
            "MC dropout", "Last-layer PEG", "PEG (ascent)", "TS → PEG", "Model"),
            `peg.apps.compare.method(name, key, on=..., **options)` or mappings
            `{"name", "method", "on", **options}`. None: "Model" (the reference row), "TS",
            "PEP", "PEG", "PEG + TS", "MC dropout" (only where the model has dropout: said in
            `skipped` otherwise) and "Last-layer PEG".
        shifted: labelled shifted sets, `{name: data}` (one set alone is named "shifted"; the
            names "val" and "test" are refused: they are the validation and test sets).
        ood: out-of-distribution inputs, `{name: data}` (labels, if any, are ignored; one set
            alone is named "ood"); scored by `ood_score` against the test set: a score of the
            logits (`peg.metrics.ood.OOD_SCORES`), or "mahalanobis" / "knn", a
            `peg.OODDetector` fitted on `val` for each method (on its model's penultimate
            features, so rows over the same model differ only where the model does).
        seed: every method's seed.
        batch_size, batch_fn: rows per forward pass; how to split loader batches.
        bins: ECE and reliability bins.
        metrics: the metric columns of the markdown tables, keys of
            `peg.apps.bench.tables.ROWS` (None: nll, error, brier, ece, adaptive_ece,
            classwise_ece, aurc, augrc); `.table` and results.json hold every metric.
        conformal: `{alpha: [0.1, 0.05], score: "aps", columns: [...]}` adds coverage and
            set size per α (`coverage@0.1`, `set_size@0.1`, ...; `peg.apps.conformal`:
            calibrated on half the test set, scored on the other half and the shifted sets).
        progress: progress bars (None: only on a terminal); False is quiet: no bars, and no
            progress lines either unless `say` is given.
        out: a folder to write results.json, results.md and the reliability diagrams to.
        say: where the progress lines go (None: nowhere; by default printed, unless
            `progress=False`).
        command: recorded in results.json (default: this call, abridged).
        resume: take back the methods a previous run with the same arguments and the same
            data and weights (their bytes hashed, `state.fingerprint`) saved in `out`
            (each method's row is saved there as it finishes, `peg.apps.compare.state`) and
            fit only the others; a saved method's predictor is loaded from its archive (where
            it is the archive the row recorded). A saved row or archive that does not check
            is fitted again, and said.
        overwrite: write into `out` even where it is a non-empty folder peg compare did not
            make (refused otherwise: its results.json, results.md, figures and predictors/
            would replace the user's files of the same names).
        task, ignore_index: saved logits of another kind (binary `[N]`, multilabel `[N, K]`,
            dense `[B, C, *S]`; "auto" reads it): the defaults are then the model and the maps
            that take it, scored by the kind's metrics (`peg.apps.kinds`); the label left out.

    Before any fitting, the data is checked once (each set's first batch read, the model run
    on two of its rows, the labels in [0, C)) and `out` must be writable; a method whose save
    fails (a full disk) keeps its row, with a `"warning"`. The table and results are always
    written, even when every method failed.

    A method that fails (raises) is a row with its `"failed"` entry (type, message, what to do) and
    no metrics, listed in `Comparison.failed`; the others go on. Methods that cannot apply
    (Laplace on a model whose last module is not nn.Linear, MC dropout without dropout) are
    left out before any fitting, in `skipped`.

    Returns:
        a `Comparison`: `.table` (a row per method), `.predictors`, `.to_markdown()`, ...

    Examples:
        >>> import torch, peg
        >>> from torch import nn
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.randn(600, 2, generator=g)
        >>> y = (X[:, 0] + torch.randn(600, generator=g) > 0).long()  # noisy labels
        >>> model = nn.Linear(2, 2).eval()  # stands for your trained model: 1 where X[:, 0] > 0
        >>> with torch.no_grad():
        ...     _ = model.weight.copy_(torch.tensor([[-4.0, 0.0], [4.0, 0.0]]))
        >>> val, test = (X[:300], y[:300]), (X[300:], y[300:])
        >>> result = peg.compare(model, val, test, ["TS", "PEG"], progress=False)
        >>> [row["method"] for row in result.table if row["method"] in ("TS", "PEG")]
        ['TS', 'PEG']

    See Also:
        peg.AutoSelect: chooses one method by cross-validation instead of showing them all.
        peg.evaluate: the same metrics for one predictor.
        docs/compare.md: the methods, the columns and the command `peg compare`.
    """
    rank = distributed.world()[0]  # under torchrun: the ranks share the predictions
    say = told(say, progress, rank)
    # compare(logits, labels, test): saved logits through SavedLogits()
    model, val = read_predictor(model, val, "model", "a trained nn.Module", kinds=True)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a trained nn.Module, got {type(model).__name__}")
    kind, methods = kinds.compared_kind(model, val, methods, task, ignore_index)
    specs, skipped = resolve(methods, model)
    seed, batch_size = check_seed(seed), check_positive_int(batch_size, "batch_size")
    bins, batch_fn = check_positive_int(bins, "bins"), check_batch_fn(batch_fn)
    shown = check_shown(metrics)
    _check_options(resume, overwrite, ood_score)
    labelled, unlabelled = read_sets(val, test, shifted, ood)
    check_widths(model, labelled, unlabelled, kind)  # saved logits: of one set of classes
    _check_sets(model, kind, task, labelled, unlabelled, batch_fn)
    check = registry.Site(seed=seed, progress=False, score_points=MAX_SCORE_POINTS)
    registry.check_all(((s.name, s.method, options(s, batch_size, batch_fn)) for s in specs), check)
    val = labelled.pop("val")
    evaluation = Evaluation(model, labelled, unlabelled, batch_size, batch_fn, bins, ood_score)
    evaluation.kind = kind
    evaluation.val = val  # what a feature OOD detector ("mahalanobis", "knn") is fitted on
    evaluation.bases = {s.base for s in specs}  # whose test outputs a later row compares with
    evaluation.conformal = parse_conformal(conformal, "conformal", [s.name for s in specs])

    if resume and out is None:
        raise ValueError("resume: needs out=, the folder of the run to resume")
    figures = tuple(figure_name(n) for n in labelled)
    state = State(out, {}, resume, write=rank == 0, say=say)
    distributed.guarded(lambda: state.prepare(overwrite, (*RESULTS, *figures)), "out")
    if out is not None:
        state.run_key = evaluation.run_key(seed)
    fitting = Fitting(
        model,
        val,
        evaluation,
        state,
        seed=seed,
        progress=progress,
        batch_size=batch_size,
        batch_fn=batch_fn,
    )
    fitting.kind_options = kinds.kind_options(kind)
    table: list[dict[str, Any]] = []
    for i, spec in enumerate(specs):
        table.append(fitting.run(i, spec))
        say(_line(i, len(specs), table[-1]))
    predictors = fitting.predictors()
    sets = {n: {"points": p, "kind": k} for n, (p, k) in evaluation.sizes.items()}
    result = Comparison(table, predictors, evaluation.curves, skipped, sets, ood_score)
    result.metrics, result.points = shown, evaluation.points
    if out is not None and rank == 0:
        paths = result.write(out, command or _command(specs, out))
        say(f"compare: wrote {', '.join(str(p) for p in paths)} and {len(result.figures)} figures")
    return result


def _check_sets(
    model: nn.Module,
    kind: Kind | None,
    task: str,
    labelled: dict[str, Data],
    unlabelled: dict[str, Data],
    batch_fn: BatchFn | None,
) -> None:
    """Every set checked before any fitting (`faults.check_data`; saved logits of another
    kind: `kinds.check_sets`, each read as val's)."""
    if kind is not None:
        kinds.check_sets(kind, {argument(n): d for n, d in labelled.items()}, task)
        return
    check_data(
        model,
        [(argument(n), d, True) for n, d in labelled.items()]
        + [(f"ood[{n!r}]", d, False) for n, d in unlabelled.items()],
        batch_fn,
    )


def _check_options(resume: Any, overwrite: Any, ood_score: Any) -> None:
    for flag, value in (("resume", resume), ("overwrite", overwrite)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag}: expected True or False, got {value!r}")
    if ood_score not in (*OOD_SCORES, *DETECTOR_SCORES):
        raise ValueError(
            f"ood_score: expected one of {[*OOD_SCORES, *DETECTOR_SCORES]}, got {ood_score!r}"
        )


class Evaluation:
    """Every evaluation set of one comparison: `self(spec, predictor, base)` predicts each once
    and returns the predictor's costs and metrics (a table row's), and how far it is from its
    base (`"vs_base"`, a `"note"` where indistinguishable; `base()`: the base predictor, run
    on the test set only where its outputs are not held yet); reliability data in `curves`."""

    def __init__(
        self,
        model: nn.Module,
        labelled: dict[str, Data],
        unlabelled: dict[str, Data],
        batch_size: int,
        batch_fn: BatchFn | None,
        bins: int,
        ood_score: str,
    ) -> None:
        self.model, self.labelled, self.unlabelled = model, labelled, unlabelled
        self.batch_size, self.batch_fn, self.bins = batch_size, batch_fn, bins
        self.ood_score = ood_score
        self.rows = probe_rows(labelled[TEST], batch_fn)
        self.curves: dict[str, dict[str, dict[str, Tensor]]] = {n: {} for n in labelled}
        # labelled set → method → per-point values: the report's paired SEs (`apps.verdict`)
        self.points: dict[str, dict[str, dict[str, Tensor]]] = {n: {} for n in labelled}
        self.sizes: dict[str, tuple[int, str]] = {}
        self.conformal: ConformalSpec | None = None
        self.val: Data = None
        self.bases: set[str] = set()
        self.kind: Kind | None = None  # saved logits of another kind than multiclass
        # base name → (members, test log-probabilities `[N, C]`) of the bases met so far
        self.base_outputs: dict[str, tuple[int, Tensor]] = {}

    def run_key(self, seed: int) -> dict[str, Any]:
        """What the saved rows are made of: the options and the fingerprints of the weights and
        of every set (one read of each, hashed: `state.fingerprint`)."""
        sets = self.labelled | self.unlabelled
        return {
            "seed": seed,
            "batch_size": self.batch_size,
            "bins": self.bins,
            "ood_score": self.ood_score,
            "conformal": repr(self.conformal),
            **fingerprints(self.model, self.val, sets, self.batch_size),
        }

    def __call__(
        self, spec: MethodSpec, predictor: Any, base: Callable[[], Any] | None = None
    ) -> dict[str, Any]:
        size = held_bytes(predictor)
        row: dict[str, Any] = {
            "forwards": forwards(predictor, self.model, self.rows),
            "memory_mb": None if size is None else size / 1e6,
            "chosen": ", ".join(f"{k} = {v:.3g}" for k, v in registry.scales(predictor).items()),
        }
        test_logits, curves, sizes, points = None, {}, {}, {}
        for name, data in self.labelled.items():
            started = time.perf_counter()
            logits, y = distributed.labelled_member_logits(
                predictor, data, self.batch_size, self.batch_fn, name
            )
            if name == TEST:
                row["predict_seconds"] = time.perf_counter() - started
            native = logits, y
            if self.kind is not None:  # scored on the kind's rows, and by its own metrics
                logits, y = kinds.kind_rows(self.kind, logits, y)
            test_logits = logits if name == TEST else test_logits
            sizes[name] = (len(y), TEST if name == TEST else "shifted")
            row |= {column(k, name): v for k, v in labelled_metrics(logits, y).items()}
            if self.kind is not None:
                own = kinds.kind_scores(self.kind, *native, self.bins, CLASSIFICATION)
                row |= {column(k, name): v for k, v in own.items()}
            if self.conformal is not None and self.conformal.applies(spec.name):
                if name == TEST:  # the first set: calibrated on half of it
                    conformal_sets = scorer(logits, y, self.conformal)
                row |= {
                    column(k, name): v for k, v in conformal_sets(logits, y, name == TEST).items()
                }
            curves[name] = metrics.reliability(logits, y, self.bins)
            points[name] = per_point(logits, y)
            if self.kind is not None:
                points[name] = kinds.kind_points(self.kind, points[name])
        assert test_logits is not None
        row |= self.vs_base(spec, test_logits, base, row["forwards"])
        detector = None
        if self.ood_score in DETECTOR_SCORES and self.unlabelled:  # per predictor: its model
            detector = OODDetector(
                score=self.ood_score, batch_size=self.batch_size, batch_fn=self.batch_fn
            ).fit(predictor, self.val)
            scores_in = detector.ood_score(self.labelled[TEST])
        for name, data in self.unlabelled.items():
            logits = distributed.member_logits(predictor, data, self.batch_size, self.batch_fn)
            sizes[name] = (logits.shape[1], "ood")
            scores = (
                ood_detection(test_logits, logits, self.ood_score)
                if detector is None
                else scored_detection(scores_in, detector.ood_score(data))
            )
            row |= {column(k, name): v for k, v in scores.items()}
        self.restore(spec.name, curves, sizes)  # kept once the whole row is made
        for name, values in points.items():
            self.points[name][spec.name] = values
        return row

    def vs_base(
        self,
        spec: MethodSpec,
        logits: Tensor,
        base: Callable[[], Any] | None,
        forwards: float | None,
    ) -> dict[str, Any]:
        """`{"vs_base": gap}` of the method `spec` with test member logits `logits` `[M, N, C]`
        (`collapse.vs_base`; None where it has no more members than its base), and its `"note"`
        where it is indistinguishable from the base."""
        members = logits.shape[0]
        if registry.entry(spec.method) is registry.Base and spec.base == MODEL:
            model = (members, ensemble_log_probs(logits))
            self.base_outputs.setdefault(MODEL, model)  # the model's
        known = self.base_outputs.get(spec.base)
        if known is None and members > 1 and base is not None:  # not held: the base, once
            outputs, _ = distributed.labelled_member_logits(
                base(), self.labelled[TEST], self.batch_size, self.batch_fn, TEST
            )
            known = self.base_outputs[spec.base] = (outputs.shape[0], ensemble_log_probs(outputs))
        if spec.name in self.bases:
            self.base_outputs[spec.name] = (members, ensemble_log_probs(logits))
        gap = None if known is None else vs_base(logits, *known)
        if not indistinguishable(gap):
            return {"vs_base": gap}
        assert gap is not None
        return {"vs_base": gap, "note": note(gap, spec.base, forwards, "the test set")}

    def saved(self, method: str) -> dict[str, dict[str, Tensor]]:
        """Method `method`'s reliability data per labelled set (what `restore` takes back)."""
        return {n: c[method] for n, c in self.curves.items() if method in c}

    def restore(self, method: str, curves: Mapping[str, Any], sizes: Mapping[str, Any]) -> None:
        """Keep a method's reliability data and the sets' sizes (a saved method's)."""
        for name, curve in curves.items():
            self.curves[name][method] = dict(curve)
        self.sizes |= {n: (int(p), str(k)) for n, (p, k) in sizes.items()}


def _line(i: int, n: int, row: dict[str, Any]) -> str:
    if "failed" in row:
        return f"compare [{i + 1}/{n}] {describe(row['method'], row['failed'])}"
    cost = "" if row["forwards"] is None else f", {row['forwards']:.3g} forwards/input"
    said = "" if "note" not in row else f"; {row['note']}"
    return (
        f"compare [{i + 1}/{n}] {row['method']}: fit {row['fit_seconds']:.1f} s{cost}; test "
        f"NLL {row['nll']:.4f}, error {100 * row['error']:.2f}%, ECE {100 * row['ece']:.2f}%{said}"
    )


def _command(specs: Sequence[MethodSpec], out: str | Path) -> str:
    return f"peg.compare(model, val, test, methods={[s.name for s in specs]}, out={str(out)!r})"
