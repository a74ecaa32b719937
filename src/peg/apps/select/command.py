"""`peg select`: `AutoSelect` on the command line: the report printed; with `--save DIR`,
DIR/results.json (the report, the choice, its scores, provenance), DIR/results.md and the chosen
predictor's archive DIR/chosen.peg (`peg.load(DIR/chosen.peg, model)`; fitted on saved logits,
`--logits`, the chosen map alone: `peg.load(DIR/chosen.peg)`, or `peg apply DIR --logits
new.npy --out probs.npy` on the command line); DIR is refused where it is a non-empty folder
peg select did not make, unless `--overwrite` (`peg.apps.results.claim`). `--format csv|json`
prints the report in that form (csv also as DIR/results.csv), `--html` writes DIR/report.html
(`peg.apps.html`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torch import nn

from peg._env import git_commit, machine
from peg.apps import html
from peg.apps.compare import sources
from peg.apps.results import RESULTS, claim, write_results
from peg.apps.select.auto import AutoSelect


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    html.check_options(args, args.save, "--save")
    if args.save:  # before any work: never a folder of the user's (unless --overwrite)
        claim(args.save, "select", getattr(args, "overwrite", False), argument="--save",
              override="--overwrite", writes="results.json, results.md and chosen.peg",
              files=(*RESULTS, "chosen.peg"))  # fmt: skip
    model, val = _model_and_data(args)
    selector = AutoSelect(
        candidates=args.candidates, cv=args.cv, criterion=args.criterion,
        max_forwards=args.max_forwards, max_fit_seconds=fit_budget(args.max_fit_seconds),
        one_se=not args.best, seed=args.seed, progress=progress, nested=args.nested,
        batch_size=args.batch_size,
    )  # fmt: skip
    text = selector.fit(model, val).to_markdown()
    print(selector.to_text(args.format))
    if args.save:
        folder = Path(args.save)
        results = {"command": command, "commit": git_commit(), "machine": machine(),
                   **selector.meta_}  # fmt: skip
        markdown = f"Command: `{command}`; machine: {results['machine']}\n\n{text}"
        paths = write_results(folder, results, markdown)
        # with --logits: the map alone (no weights), `peg.load(DIR/chosen.peg)` or `peg apply`
        archive = selector.save(folder / "chosen.peg")
        print(f"select: wrote {', '.join(str(p) for p in paths)} and {archive}")
        html.write_options(selector, args.save, args, "select")
    return 0


def fit_budget(text: str) -> float | str | None:
    """`--max-fit-seconds`: "auto", "none" (None) or seconds (checked by AutoSelect)."""
    if text.lower() in ("auto", "none"):
        return None if text.lower() == "none" else "auto"
    try:
        return float(text)
    except ValueError:
        return text  # AutoSelect names it


def _model_and_data(args: argparse.Namespace) -> tuple[nn.Module, Any]:
    """(`--model`, `--val`), or saved logits (`--logits`, `--labels`) read through
    `nn.Identity()`; a ValueError naming the options otherwise."""
    if args.logits is not None or args.labels is not None:
        if args.logits is None or args.labels is None or args.model or args.val:
            raise ValueError(
                "--logits: give --logits and --labels together, without --model and --val"
            )
        return nn.Identity(), sources.saved_logits(args.logits, args.labels)
    if args.model is None or args.val is None:
        raise ValueError("--model: give --model and --val (or --logits and --labels)")
    return sources.model(args.model), sources.data(args.val, "--val")
