"""`peg monitor`: a `PerformanceEstimator` fitted on labelled reference data, then a `Monitor`
over the target data, one chunk per file or data source (or `--chunk-size` points); DIR gets
results.json / .md / .csv as each chunk ends (`--html`: report.html); exit 0, or 4 with
`--fail-on-alert` when any chunk alerts.

Two ways in, as `peg compare` takes them (`peg.apps.compare.sources`, the one reader):
- saved logits: `--reference-logits V.npy --reference-labels VL.npy --logits F1.npy …`
  (`--labels L1.npy … `, `-` for a file without, for the realized accuracy); each target file
  memory-mapped and read `--batch-size` rows at a time: memory flat in its length;
- a model and its data: `--model module:function --val DATA --data [NAME=]DATA …` (a registry
  set, a `.npz` / `.pt` file, or `module:function`; labels where the data has them).

Every file, spec and the output folder is checked before the estimator is fitted; a bad target
met while streaming (NaN logits) is a ValueError naming the option and the file, after the
chunks before it were written.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from peg.apps import html
from peg.apps import results as files
from peg.apps.compare import sources

ALERT_STATUS = 4
NO_LABELS = "-"  # `--labels`: this file has none
LOGIT_OPTIONS = ("--reference-logits", "--reference-labels", "--logits")
MODEL_OPTIONS = ("--model", "--val", "--data")
DESCRIPTION = (
    "Fit peg.PerformanceEstimator on labelled reference data (saved logits: --reference-logits, "
    "--reference-labels; or --model and --val, as peg compare takes them), run peg.Monitor over "
    "the target data (--logits files, memory-mapped, or --data sources; one chunk each, or "
    "--chunk-size points) and write results.{json,md,csv} in --out as each chunk ends; exit 4 "
    "with --fail-on-alert when a chunk alerts. See docs/monitor.md."
)


def positive(text: str) -> int:
    """`--chunk-size`, `--batch-size`: a positive integer (argparse names the option)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


positive.__name__ = "positive integer"  # argparse's message: "invalid positive integer value"


def arguments(p: Any) -> None:
    p.add_argument("--reference-logits", help="source validation logits [N, C] (.npy)")
    p.add_argument("--reference-labels", help="their labels [N] (.npy)")
    p.add_argument("--logits", nargs="+", help="target logits [N_i, C] (.npy), in order")
    p.add_argument(
        "--labels",
        nargs="+",
        help="the targets' labels [N_i] (.npy), one per "
        f"--logits file ('{NO_LABELS}' for one without): the realized accuracy",
    )
    p.add_argument("--model", help="module:function returning the trained nn.Module")
    p.add_argument("--val", help="labelled reference data (as peg compare's --val)")
    p.add_argument(
        "--data",
        nargs="+",
        help="target data, [NAME=]DATA each, in order (a "
        "registry set, a .npz or .pt file, module:function)",
    )
    p.add_argument("--out", required=True, help="results folder")
    p.add_argument(
        "--chunk-size",
        type=positive,
        default=None,
        help="points per chunk (default: one chunk per file or --data source)",
    )
    p.add_argument(
        "--batch-size",
        type=positive,
        default=512,
        help="rows read (or inputs predicted) at a time (default: 512)",
    )
    p.add_argument("--method", default="auto", help="the estimator (default: auto)")
    p.add_argument("--fail-on-alert", action="store_true", help="exit 4 when any chunk alerts")
    p.add_argument(
        "--overwrite", action="store_true", help="write into a folder peg monitor did not make"
    )
    p.add_argument("--html", action="store_true", help="also write report.html in --out")


def _given(args: argparse.Namespace, options: tuple[str, ...]) -> list[str]:
    return [o for o in options if getattr(args, o[2:].replace("-", "_")) is not None]


def inputs(args: argparse.Namespace) -> tuple[Any, Any, list[tuple[str, str, Any, Any]]]:
    """(predictor, reference data, targets): targets as (option, name, batch, labels or None),
    every one read (saved logits memory-mapped) and checked before any work; a ValueError
    naming the option missing, mixed or bad."""
    logits, model = _given(args, LOGIT_OPTIONS), _given(args, MODEL_OPTIONS)
    if logits and model:
        raise ValueError(
            f"{logits[0]}: give saved logits ({', '.join(LOGIT_OPTIONS)}) or a "
            f"model ({', '.join(MODEL_OPTIONS)}), not both (got "
            f"{', '.join(logits + model)})"
        )
    if model or not logits:
        missing = [o for o in MODEL_OPTIONS if o not in model]
        if missing:
            raise ValueError(
                f"{missing[0]}: give --model, --val and --data (or "
                f"{', '.join(LOGIT_OPTIONS)} for saved logits); missing: {', '.join(missing)}"
            )
        if args.labels is not None:
            raise ValueError(
                "--labels: goes with --logits (saved logits); a --data source's labels are its "
                "own (a .npz file's y, the second of a pair (X, y))"
            )
        targets = sources.named(args.data, "--data", labelled=False)
        rows = [("--data", name, *_pair(got)) for name, got in targets.items()]
        return sources.model(args.model), sources.data(args.val, "--val"), rows
    missing = [o for o in LOGIT_OPTIONS if o not in logits]
    if missing:
        raise ValueError(
            f"{missing[0]}: give {', '.join(LOGIT_OPTIONS)} together (or "
            f"{', '.join(MODEL_OPTIONS)} for a model); missing: "
            f"{', '.join(missing)}"
        )
    V, VL = sources.saved_logits(args.reference_logits, args.reference_labels, LOGIT_OPTIONS[:2])
    labels = args.labels or [NO_LABELS] * len(args.logits)
    if len(labels) != len(args.logits):
        raise ValueError(
            f"--labels: {len(labels)} files for {len(args.logits)} --logits files; "
            f"give one per file, '{NO_LABELS}' for a file without"
        )
    rows = [
        ("--logits", path, *_saved(path, y, V.shape[1]))
        for path, y in zip(args.logits, labels, strict=True)
    ]
    return V, VL, rows


def _pair(got: Any) -> tuple[Any, Any]:
    """A data source as (inputs, labels or None): a pair `(X, y)` has labels."""
    return (got[0], got[1]) if isinstance(got, (tuple, list)) and len(got) == 2 else (got, None)


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


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    import peg
    from peg.apps.monitor.monitor import FILES, WRITES, Monitor, earlier_run

    predictor, val, targets = inputs(args)
    try:  # before the folder is claimed
        estimator = peg.PerformanceEstimator(args.method, batch_size=args.batch_size)
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
    monitor = Monitor(
        estimator.fit(predictor, val), args.chunk_size, out=out, overwrite=args.overwrite
    )
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


COMMAND = {  # `peg monitor`'s entry in `peg.apps.cli.COMMANDS`
    "help": "estimate a deployed model's accuracy without labels, chunk by chunk, with alerts",
    "description": DESCRIPTION,
    "arguments": arguments,
    "run": run,
}
