"""The output folders of `peg bench` and `peg paper-tables`, claimed before any work
(`peg.apps.results.claim`): a non-empty folder the command did not make is the user's, refused
unless `overwrite` (`--overwrite`); a folder it marked (`.peg-bench`, `.peg-paper-tables`)
reruns.

- `peg bench` writes `OUT/<name>/` (results.json, results.md and the figures; `OUT/uci/` for
  the UCI benchmark): that folder is claimed, not OUT, which the commands share (`results` by
  default). An earlier version's folder, without the mark, counts as peg's where its
  results.json is one peg bench wrote.
- `peg paper-tables` writes `OUT/paper-tables-<preset>.{json,md}` beside the benchmarks' folders
  in OUT: OUT is claimed, and counts as peg's where it holds an earlier version's tables or
  only folders that a peg application marked (`peg bench` then `peg paper-tables` into the
  default `results`).
"""

from __future__ import annotations

from pathlib import Path

from peg import distributed
from peg.apps.results import RESULTS, claim, earlier_results, peg_folder

FIGURES = ("reliability-test.png", "risk-coverage-test.png")
# what a results.json of peg bench holds (a spec's and the UCI benchmark's alike)
BENCH_KEYS = ("command", "commit", "machine", "datasets")
PAPER_KEYS = ("preset", "seeds", "entries", "tables")


def claim_bench(
    out: str | Path, name: str, overwrite: bool, files: tuple[str, ...] = FIGURES
) -> Path:
    """Claim `out/name` for peg bench (`results.claim`) before any work; under torchrun rank 0
    claims it and every rank learns whether it could (`distributed.guarded`)."""
    folder = Path(out) / name

    def ours(f: Path) -> bool:
        return earlier_results(f / "results.json", BENCH_KEYS)

    def mark() -> None:
        if distributed.world()[0] == 0:
            claim(
                folder,
                "bench",
                overwrite,
                writes="results.json, results.md and the figures",
                files=(*RESULTS, *files),
                ours=ours,
            )

    distributed.guarded(mark, "out")
    return folder


def claim_paper(out: str | Path, preset: str, overwrite: bool) -> Path:
    """Claim `out` for peg paper-tables (`results.claim`) before any work."""
    stem = f"paper-tables-{preset}"

    def ours(folder: Path) -> bool:
        tables = sorted(folder.glob("paper-tables-*.json"))[:10]
        if any(earlier_results(p, PAPER_KEYS) for p in tables):
            return True
        return all(peg_folder(p) for p in folder.iterdir())

    return claim(
        out,
        "paper-tables",
        overwrite,
        writes=f"{stem}.json and {stem}.md",
        files=(f"{stem}.json", f"{stem}.md"),
        ours=ours,
    )
