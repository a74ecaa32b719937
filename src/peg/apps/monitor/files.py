"""The Monitor's results folder: results.json / .md / .csv rewritten (atomically) as each chunk
ends; results.json, written first, is the source of truth (a kill between the writes leaves .md
/ .csv a chunk behind): an earlier run's chunks there are replaced only with `overwrite`, or
taken back with `resume` (.md / .csv rewritten from them). `monitor` below: a `Monitor` (its
module imports this one)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from peg.apps import results
from peg.apps.html import to_csv
from peg.apps.monitor import report
from peg.apps.monitor.records import ChunkResult

FILES = ("results.json", "results.md", "results.csv")
WRITES = "results.json, results.md and results.csv"  # a refused folder's message says so


def claim(out: str | os.PathLike[str], overwrite: bool) -> Path:
    """`out` claimed as the monitor's folder (`peg.apps.results.claim`)."""
    return results.claim(out, "monitor", overwrite, files=FILES, writes=WRITES)


def earlier_run(folder: Path, overwrite: bool, resume: bool, argument: str = "out") -> Any:
    """The results.json of an earlier run in `folder` to resume (None: none, or to replace);
    a FileExistsError naming `argument` where one holds chunks and neither is asked for."""
    path = folder / "results.json"
    try:
        earlier = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (ValueError, OSError) as e:
        earlier = {"chunks": [f"unreadable: {e}"]}  # refused as a run of unknown chunks
    if overwrite or not isinstance(earlier, dict) or not earlier.get("chunks"):
        return None
    if not resume:
        raise FileExistsError(
            f"{argument}: {folder} holds the {len(earlier['chunks'])} chunks of an earlier "
            "monitor run (results.json; results.md and .csv may be a chunk behind it if that "
            "run was killed); this run would replace them: pass resume=True (peg.Monitor) to "
            "continue it, overwrite=True (--overwrite) to replace it, or a new folder"
        )
    return earlier


def resume(monitor: Any, earlier: dict[str, Any]) -> None:
    """The earlier run's chunks and reference chunks' summaries back into `monitor` from its
    results.json; .md / .csv rewritten from them (a kill between the writes left them a chunk
    behind)."""
    settings, reference = earlier.get("settings"), earlier.get("reference")
    if settings != monitor._settings() or not isinstance(reference, dict):
        raise ValueError(
            f"resume: the run in {monitor.out} had settings {settings}, this one "
            f"{monitor._settings()}; resume with the same, or pass overwrite=True"
        )
    monitor.chunks = [ChunkResult.from_dict(row) for row in earlier["chunks"]]
    monitor.references = {
        int(k): (float(m), float(s), float(d)) for k, (m, s, d) in reference.items()
    }
    monitor._write()


def write(monitor: Any, out: Path) -> None:
    """results.json (first: the source of truth), then results.md and results.csv."""
    state = {
        "chunks": [c.to_dict() for c in monitor.chunks],
        "settings": monitor._settings(),
        # per chunk size: the reference chunks' (mean, sd, dispersion), kept to resume
        "reference": {str(k): list(v) for k, v in sorted(monitor.references.items())},
    }
    results.write_json(out / "results.json", state)
    results.write_text(out / "results.md", report.markdown(monitor))
    results.write_text(out / "results.csv", to_csv(report.records(monitor)))
