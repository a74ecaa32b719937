"""`peg bench-perf`: run the performance benchmarks of a peg checkout and keep their output.

The scripts live in the checkout's `benchmarks/` folder (inference strategies, PEG creation
cost, streaming metrics, memory, Packed-Ensembles speed); each prints ratios measured in one
run and the machine it ran on. This runs them one after another in fresh processes (so one's
threads or memory never touch another's), shows their output as it comes, and writes each
transcript atomically to `results/benchmarks/<name>.txt` headed by the command and the commit.
`quick=True` passes `--quick` to every script (a smoke run) and writes nothing unless asked.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from peg.apps.results import write_text
from peg.utils.env import git_commit


def scripts(folder: str | Path = "benchmarks") -> dict[str, Path]:
    """Benchmark name → script, for every `*.py` in `folder` (sorted by name)."""
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(
            f"dir: {str(path)!r} is not a folder; bench-perf runs the benchmarks/ scripts of a "
            f"peg checkout: run it from the checkout's root or pass --dir"
        )
    found = {p.stem: p for p in sorted(path.glob("*.py")) if not p.stem.startswith("_")}
    if not found:
        raise FileNotFoundError(f"dir: no benchmark scripts (*.py) in {str(path)!r}")
    return found


def run_benchmarks(
    names: Sequence[str] | None = None,
    folder: str | Path = "benchmarks",
    out: str | Path | None = "results/benchmarks",
    quick: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, int]:
    """Run the named benchmarks (default: all); return name → exit status.

    Every name is checked before the first script starts. With `out`, each transcript goes to
    `out/<name>.txt` (a failed script's too, so its error is kept, but only after it ends).
    """
    found = scripts(folder)
    chosen = list(found) if not names else list(names)
    unknown = [n for n in chosen if n not in found]
    if unknown:
        raise ValueError(f"names: unknown benchmark(s) {unknown}; known: {list(found)}")
    status = {}
    for name in chosen:
        argv = [str(found[name])] + (["--quick"] if quick else [])
        shown = f"$ python {' '.join(argv)}"
        say(shown)
        lines = [shown, f"commit: {git_commit() or 'unknown'}"]
        with subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                say(line.rstrip("\n"))
                lines.append(line.rstrip("\n"))
        status[name] = proc.returncode
        if proc.returncode:
            say(f"{name}: failed with exit status {proc.returncode}")
        if out is not None:
            write_text(Path(out) / f"{name}.txt", "\n".join(lines) + "\n")
    return status
