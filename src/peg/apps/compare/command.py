"""`peg compare`: `compare` on the command line: the table printed (`--format`), the results
folder `--out` (results.json, results.md, figures; `--html`: report.html); exit 0, or 3 when
some methods failed (each said on stderr, the table has the others)."""

from __future__ import annotations

import argparse
import sys

from peg import distributed
from peg.apps import html
from peg.apps.compare import compare, sources


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    html.check_options(args, args.out, "--out")
    model, val, test = sources.compared(args, print)
    result = compare(
        model, val, test, args.methods,
        shifted=sources.named(args.shifted, "--shifted", labelled=True),
        ood=sources.named(args.ood, "--ood", labelled=False), ood_score=args.ood_score,
        metrics=args.metrics, seed=args.seed, batch_size=args.batch_size, progress=progress,
        out=args.out, command=command, resume=args.resume, overwrite=args.overwrite,
    )  # fmt: skip
    if distributed.world()[0] != 0:  # under torchrun every rank has the table: one prints it
        return 0
    print()
    print(result.to_text(args.format))
    html.write_options(result, args.out, args, "compare")
    return status(result)


def status(result: object) -> int:
    """0, or 3 when some methods failed (each said on stderr; the table has the others)."""
    failed = getattr(result, "failed", {})
    for name, error in failed.items():
        sys.stderr.write(f"peg compare: {name} failed: {error['type']}: {error['message']}\n")
    return 3 if failed else 0
