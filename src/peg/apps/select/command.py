"""`peg select`: `AutoSelect` on the command line: the report printed; with `--save DIR`,
DIR/results.json (the report, the choice, its scores, provenance), DIR/results.md and the chosen
predictor's archive DIR/chosen.peg (`peg.load(DIR/chosen.peg, model)`; fitted on saved logits,
`--val-logits`, the chosen map alone: `peg.load(DIR/chosen.peg)`, or `peg apply DIR --logits
new.npy --out probs.npy` on the command line); DIR is refused where it is a non-empty folder
peg select did not make, unless `--overwrite` (`peg.apps.results.claim`). `--format csv|json`
prints the report in that form (csv also as DIR/results.csv), `--html` writes DIR/report.html
(`peg.apps.html`).

What is printed, the answer last: the table (a short status per candidate), the cost, then the
choice; without `--save` a line saying the fitted map is not kept. Why each candidate was
dropped is in `--verbose`'s table and in DIR/results.md. Progress goes to stderr only: on a
terminal a bar and a line per fold; in a log (stderr not a terminal) nothing unless
`--verbose` (then a line per step); `--no-progress` none. The answer on stdout is the same
either way."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from torch import nn

from peg.apps import html
from peg.apps.arguments import typed
from peg.apps.compare import sources
from peg.apps.input_checks import check_select
from peg.apps.results import RESULTS, claim, write_results
from peg.apps.select.auto import AutoSelect
from peg.apps.select.report import cost_line, header, row_cells
from peg.utils.env import git_commit, machine

NOT_SAVED = "not saved: add --save DIR to keep the fitted map"


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    html.check_options(args, args.save, "--save")
    if args.save:  # before any work: never a folder of the user's (unless --overwrite)
        claim(
            args.save,
            "select",
            getattr(args, "overwrite", False),
            argument="--save",
            override="--overwrite",
            writes="results.json, results.md and chosen.peg",
            files=(*RESULTS, "chosen.peg"),
        )
    model, val = _model_and_data(args)
    if progress is None and not args.verbose and not _shown():
        progress = False  # a log or a pipe: the answer alone, unless --verbose
    selector = AutoSelect(
        candidates=args.candidates,
        cv=args.cv,
        criterion=args.criterion,
        max_forwards=args.max_forwards,
        max_fit_seconds=fit_budget(args.max_fit_seconds),
        one_se=not args.best,
        seed=args.seed,
        progress=progress,
        nested=args.nested,
        batch_size=args.batch_size,
        task=getattr(args, "task", "auto"),
        ignore_index=getattr(args, "ignore_index", -100),
    )
    text = selector.fit(model, val).to_markdown()
    if args.save:  # the files first, said on stderr: the answer is the last thing printed
        folder = Path(args.save)
        results = {
            "command": command,
            "commit": git_commit(),
            "machine": machine(),
            **selector.meta_,
        }
        markdown = f"Command: `{command}`; machine: {results['machine']}\n\n{text}"
        paths = write_results(folder, results, markdown)
        # with --val-logits: the map alone (no weights), `peg.load(DIR/chosen.peg)`, `peg apply`
        archive = selector.save(folder / "chosen.peg")
        _say(f"select: wrote {', '.join(str(p) for p in paths)} and {archive}")
        with contextlib.redirect_stdout(sys.stderr):  # its "wrote ..." line too
            html.write_options(selector, args.save, args, "select")
    if args.format != "md":
        print(selector.to_text(args.format), flush=True)
    else:
        print(text if args.verbose else short(selector), flush=True)
    if not args.save:
        _say(f"peg select: {NOT_SAVED}")
    return 0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _shown() -> bool:
    """Whether progress would show by default: stderr a terminal, or `PEG_PROGRESS` set."""
    return sys.stderr.isatty() or os.environ.get("PEG_PROGRESS") is not None


def short(selector: AutoSelect) -> str:
    """The report in short: the uncalibrated baseline's row, then a row per candidate with its
    status alone (why it was dropped: `--verbose`, results.md), the cost, then the answer: the
    verdict (the choice, before → after, whether the difference is real)."""
    rows = ["| " + " | ".join(header(selector.criterion)) + " |", "|---|---:|---:|---:|---:|---|"]
    baseline = getattr(selector, "baseline_", None)
    for r in [baseline] * (baseline is not None) + list(selector.report_):
        cells = row_cells({**r, "why": ""})
        cells[-1] = _status(r)
        rows.append("| " + " | ".join(cells) + " |")
    cost = cost_line(selector.cost_).split("; ")[0].strip()  # "Cost: 8.2 s = 51.5 × a TS fit"
    verdict = getattr(selector, "verdict_", None)
    answer = verdict.text() if verdict is not None else selector.to_markdown().splitlines()[-1]
    return "\n".join([*rows, "", cost.split(" (")[0], "", answer])


def _status(r: dict[str, Any]) -> str:
    """A row's status in a few words: chosen, kept, or why dropped in short."""
    why = str(r.get("why") or "")
    if r["status"] == "chosen":
        return "**chosen**"
    if r["status"] == "baseline":
        return "baseline"
    if r["status"] == "kept":
        return "kept (equal to TS)" if why.startswith("equal to") else "kept"
    for start, word in (
        ("raced out", "raced out"),
        ("over budget", "over budget"),
        ("not started", "not started: budget"),
    ):
        if why.startswith(start):
            return f"dropped: {word}"
    return "dropped: " + (why.split(":")[0].split(";")[0][:40] if why else "")


def fit_budget(text: str) -> float | str | None:
    """`--max-fit-seconds`: "auto", "none" (None) or seconds (checked by AutoSelect)."""
    if text.lower() in ("auto", "none"):
        return None if text.lower() == "none" else "auto"
    try:
        return float(text)
    except ValueError:
        return text  # AutoSelect names it


def _model_and_data(args: argparse.Namespace) -> tuple[nn.Module, Any]:
    """(`--model`, `--val`), or saved logits (`--val-logits`, `--val-labels`) read through
    `nn.Identity()`; a ValueError naming the options as typed otherwise."""
    check_select(args)
    logits, labels = typed(args, "val_logits"), typed(args, "val_labels")
    if args.val_logits is not None:
        read = {
            "task": getattr(args, "task", "auto"),
            "ignore_index": getattr(args, "ignore_index", -100),
        }
        return nn.Identity(), sources.saved_logits(
            args.val_logits, args.val_labels, (logits, labels), **read
        )
    return sources.model(args.model), sources.data(args.val, "--val")
