"""`peg select`: `AutoSelect` on the command line: the report printed; with `--save DIR`,
DIR/results.json (the report, the choice, its scores, provenance), DIR/results.md and the chosen
predictor's archive DIR/chosen.peg (`peg.load(DIR/chosen.peg, model)`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from peg._env import git_commit, machine
from peg.apps.compare import sources
from peg.apps.results import write_results
from peg.apps.select.auto import AutoSelect


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    model = sources.model(args.model)
    val = sources.data(args.val, "--val")
    selector = AutoSelect(
        candidates=args.candidates, cv=args.cv, criterion=args.criterion,
        max_forwards=args.max_forwards, max_fit_seconds=args.max_fit_seconds,
        one_se=not args.best, seed=args.seed, progress=progress, nested=args.nested,
        batch_size=args.batch_size,
    )  # fmt: skip
    text = selector.fit(model, val).to_markdown()
    print(text)
    if args.save:
        folder = Path(args.save)
        results = {"command": command, "commit": git_commit(), "machine": machine(),
                   **selector.meta_}  # fmt: skip
        markdown = f"Command: `{command}`; machine: {results['machine']}\n\n{text}"
        paths = write_results(folder, results, markdown)
        archive = selector.save(folder / "chosen.peg")
        print(f"select: wrote {', '.join(str(p) for p in paths)} and {archive}")
    return 0
