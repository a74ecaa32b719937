"""`peg compare`: `compare` on the command line: the table printed (`--format`), the results
folder `--out` (results.json, results.md, figures; `--html`: report.html); exit 0, or 3 when
some methods failed (each said on stderr, the table has the others). Progress lines (each method
as it ends, the files written) go to stderr: stdout holds the table alone, so
`--format json` or `csv` output can be piped as it is."""

from __future__ import annotations

import argparse
import contextlib
import sys

from peg import distributed
from peg.apps import html
from peg.apps.compare import compare, sources


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    html.check_options(args, args.out, "--out")
    model, val, test = sources.compared(args, _say)
    result = compare(
        model,
        val,
        test,
        args.methods,
        shifted=sources.named(args.shifted, "--shifted", labelled=True),
        ood=sources.named(args.ood, "--ood", labelled=False),
        ood_score=args.ood_score,
        metrics=args.metrics,
        seed=args.seed,
        batch_size=args.batch_size,
        progress=progress,
        out=args.out,
        command=command,
        resume=args.resume,
        overwrite=args.overwrite,
        task=getattr(args, "task", "auto"),
        ignore_index=getattr(args, "ignore_index", -100),
        say=_say,
    )
    if distributed.world()[0] != 0:  # under torchrun every rank has the table: one prints it
        return 0
    print(result.to_text(args.format))
    with contextlib.redirect_stdout(sys.stderr):  # its "wrote ..." line is progress
        html.write_options(result, args.out, args, "compare")
    return status(result)


def _say(line: str) -> None:
    """A progress line: on stderr, flushed (stdout is the table's)."""
    print(line, file=sys.stderr, flush=True)


def status(result: object) -> int:
    """0, or 3 when some methods failed (each said on stderr; the table has the others)."""
    failed = getattr(result, "failed", {})
    for name, error in failed.items():
        sys.stderr.write(f"peg compare: {name} failed: {error['type']}: {error['message']}\n")
    return 3 if failed else 0
