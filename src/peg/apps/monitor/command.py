"""`peg monitor`: a `PerformanceEstimator` fitted on labelled reference data, then a `Monitor`
over the target data, one chunk per file or data source (or `--chunk-size` points); DIR gets
results.json / .md / .csv as each chunk ends (`--html`: report.html); exit 0, or 4 with
`--fail-on-alert` when any chunk alerts.

Two ways in, as `peg compare` takes them (`peg.apps.compare.sources`, the one reader):
- saved logits: `--val-logits V.npy --val-labels VL.npy --logits F1.npy …` (`--val-*`:
  the reference data; `--reference-logits`, `--reference-labels` are their earlier names)
  (`--labels L1.npy … `, `-` for a file without, for the realized accuracy); each target file
  memory-mapped and read `--batch-size` rows at a time: memory flat in its length;
- a model and its data: `--model module:function --val DATA --data [NAME=]DATA …` (a registry
  set, a `.npz` / `.pt` file, or `module:function`; labels where the data has them).

Every file, spec and the output folder is checked before the estimator is fitted; a bad target
met while streaming (NaN logits) is a ValueError naming the option and the file, after the
chunks before it were written. A file name is shown `printable` (one that is not UTF-8 with
backslash escapes) in every chunk, file and line. The options are `peg.apps.arguments`'s.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from peg.apps import arguments, html, input_checks
from peg.apps import results as files
from peg.apps.arguments import printable
from peg.apps.compare import sources
from peg.apps.monitor.chunking import by_size, per_update
from peg.apps.monitor.files import FILES, WRITES, earlier_run
from peg.apps.monitor.monitor import Monitor
from peg.methods.estimation import PerformanceEstimator
from peg.source import is_pair

ALERT_STATUS = 4
NO_LABELS = arguments.NO_LABELS  # `--labels`: this file has none
LOGIT_OPTIONS = input_checks.MONITOR_LOGITS


def inputs(args: argparse.Namespace) -> tuple[Any, Any, list[tuple[str, str, Any, Any]]]:
    """(predictor, reference data, targets): targets as (option, name, batch, labels or None),
    every one read (saved logits memory-mapped) and checked before any work; a ValueError
    naming the option missing, mixed or bad."""
    saved = input_checks.check_monitor(args)
    options = input_checks.spelled(args, LOGIT_OPTIONS)
    if not saved:
        targets = sources.named(args.data, "--data", labelled=False)
        rows = [("--data", name, *_pair(got)) for name, got in targets.items()]  # printable
        return sources.model(args.model), sources.data(args.val, "--val"), rows
    V, VL = sources.saved_logits(args.val_logits, args.val_labels, options[:2])
    labels = args.labels or [NO_LABELS] * len(args.logits)
    if len(labels) != len(args.logits):
        raise ValueError(
            f"--labels: {len(labels)} files for {len(args.logits)} --logits files; "
            f"give one per file, '{NO_LABELS}' for a file without"
        )
    rows = [
        ("--logits", printable(path), *_saved(path, y, V.shape[1]))
        for path, y in zip(args.logits, labels, strict=True)
    ]
    return V, VL, rows


def _pair(got: Any) -> tuple[Any, Any]:
    """A data source as (inputs, labels or None): a pair `(X, y)` has labels."""
    return (got[0], got[1]) if is_pair(got, arrays=False) else (got, None)


def _saved(path: str, labels: str, classes: int) -> tuple[Any, Any]:
    """One target file: logits `[N, C]` memory-mapped (and its labels `[N]`), checked."""
    X = sources.read_npy(path, "--logits", mmap=True)
    if X.ndim != 2 or X.dtype.kind != "f" or X.shape[1] != classes:
        raise ValueError(
            f"--logits: expected floating-point logits [N, {classes}] (the classes of the "
            f"reference) in {path}, got shape {X.shape} and dtype {X.dtype}"
        )
    if labels == NO_LABELS:
        return X, None
    return X, sources.saved_logits(path, labels, ("--logits", "--labels"))[1]


def check_chunk_size(size: int | None, targets: list[tuple[str, str, Any, Any]]) -> None:
    """`--chunk-size` at most the target points, where every target says how many it holds
    (a ValueError naming the option; a chunk larger than the data would never end, and the
    reference chunks of its size cost what it does)."""
    if size is None:
        return
    counts = [_points(batch) for _, _, batch, _ in targets]
    if all(c is not None for c in counts) and size > max(1, sum(counts)):
        raise ValueError(
            f"--chunk-size: {size} points per chunk, more than the {sum(counts)} target points "
            f"in all; give at most {max(1, sum(counts))}, or leave it out (one chunk per file)"
        )


def _points(batch: Any) -> int | None:
    """The points in a target that says so without being read (an array, a tensor); None for
    anything else (a loader's length counts its batches, not its points)."""
    if hasattr(batch, "shape") and len(batch.shape):
        return int(batch.shape[0])
    return None


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    predictor, val, targets = inputs(args)
    check_chunk_size(args.chunk_size, targets)
    try:  # before the folder is claimed
        estimator = PerformanceEstimator(args.method, batch_size=args.batch_size)
    except ValueError as e:  # "method: expected one of [...]": the option typed
        raise ValueError(f"--{e}") from None
    out = files.claim(
        args.out,
        "monitor",
        args.overwrite,
        argument="--out",
        files=FILES,
        writes=WRITES,
        override="--overwrite",
    )
    earlier_run(out, args.overwrite, False, "--out")  # an earlier run's chunks: before the fit
    if args.html:
        html.check_target(out / html.REPORT, "--html")
    chunker = per_update() if args.chunk_size is None else by_size(args.chunk_size)
    monitor = Monitor(estimator.fit(predictor, val), chunker, out=out, overwrite=args.overwrite)
    try:
        for option, name, batch, labels in targets:
            before = len(monitor.chunks)
            _update(monitor, option, name, batch, labels)
            print(f"{name}: {len(monitor.chunks) - before} chunks ({len(monitor.chunks)} so far)")
        monitor.close()
    finally:  # what finished is written (no chunk at all too), whatever stopped the stream
        monitor._write()
        if args.html and monitor.chunks:
            monitor.to_html(out / html.REPORT)
    if not monitor.chunks:
        warnings.warn(f"{targets[0][0]}: no target points; no chunk to report", stacklevel=1)
    print()
    print(monitor.to_text("md"))
    return ALERT_STATUS if args.fail_on_alert and monitor.alerts else 0


def _update(monitor: Any, option: str, name: str, batch: Any, labels: Any) -> None:
    """`monitor.update` on one target (named `name` in its chunks); its errors name `option`
    and the target; an empty one is said and skipped."""
    if hasattr(batch, "shape") and len(batch.shape) and batch.shape[0] == 0:
        warnings.warn(f"{option}: {name} holds no points; no chunk for it", stacklevel=1)
        return
    try:
        monitor.update(batch, labels, name=name)
    except (ValueError, TypeError) as e:  # "batch: …" is this target
        raise ValueError(f"{option}: {name}: {str(e).removeprefix('batch: ')}") from None
