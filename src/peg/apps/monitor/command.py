"""`peg monitor`: a `PerformanceEstimator` fitted on saved reference logits and labels, then a
`Monitor` over saved target logits (one chunk per file, or `--chunk-size` points); DIR gets
results.json / .md / .csv as each chunk ends (`--html`: report.html); exit 0, or 4 with
`--fail-on-alert` when any chunk alerts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from peg.apps import html
from peg.apps.compare.sources import read_npy, saved_logits
from peg.source.batches import from_numpy

ALERT_STATUS = 4
DESCRIPTION = (
    "Fit peg.PerformanceEstimator on reference logits and labels, run peg.Monitor over the "
    "target logits (one chunk per file, or --chunk-size points) and write results.{json,md,csv} "
    "in --out as each chunk ends; exit 4 with --fail-on-alert when a chunk alerts. See "
    "docs/monitor.md."
)


def arguments(p: Any) -> None:
    p.add_argument(
        "--reference-logits", required=True, help="source validation logits [N, C] (.npy)"
    )
    p.add_argument("--reference-labels", required=True, help="their labels [N] (.npy)")
    p.add_argument(
        "--logits", required=True, nargs="+", help="target logits [N_i, C] (.npy), in order"
    )
    p.add_argument("--out", required=True, help="results folder")
    p.add_argument(
        "--chunk-size", type=int, default=None, help="points per chunk (default: one per file)"
    )
    p.add_argument("--method", default="auto", help="the estimator (default: auto)")
    p.add_argument("--fail-on-alert", action="store_true", help="exit 4 when any chunk alerts")
    p.add_argument(
        "--overwrite", action="store_true", help="write into a folder peg monitor did not make"
    )
    p.add_argument("--html", action="store_true", help="also write report.html in --out")


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    import peg
    from peg.apps.monitor import Monitor

    V, VL = saved_logits(args.reference_logits, args.reference_labels,
                         ("--reference-logits", "--reference-labels"))  # fmt: skip
    targets = [read_npy(path, "--logits", mmap=True) for path in args.logits]  # checked first
    for path, X in zip(args.logits, targets, strict=True):
        if X.ndim != 2 or X.shape[1] != V.shape[1]:
            raise ValueError(
                f"--logits: expected logits [N, {V.shape[1]}] (the classes of "
                f"--reference-logits) in {path}, got shape {X.shape}"
            )
    if args.html:
        html.check_target(Path(args.out) / html.REPORT, "--html")
    estimator = peg.PerformanceEstimator(args.method).fit(V, VL)
    monitor = Monitor(estimator, args.chunk_size, out=args.out, overwrite=args.overwrite)
    for path, X in zip(args.logits, targets, strict=True):
        monitor.update(from_numpy(X))
        print(f"{path}: {len(X)} points, {len(monitor.chunks)} chunks so far")
    monitor.close()
    print()
    print(monitor.to_text("md"))
    if args.html:
        monitor.to_html(Path(args.out) / html.REPORT)
    return ALERT_STATUS if args.fail_on_alert and monitor.alerts else 0


COMMAND = {  # `peg monitor`'s entry in `peg.apps.cli.COMMANDS`
    "help": "estimate a deployed model's accuracy without labels, chunk by chunk, with alerts",
    "description": DESCRIPTION,
    "arguments": arguments,
    "run": run,
}
