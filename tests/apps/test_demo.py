"""The `peg demo` command end to end on toy data (fast), through the CLI entry point."""

from __future__ import annotations

import json

from peg.apps.cli import main


def test_demo_on_two_moons_writes_table_json_and_figures(tmp_path, capsys):
    assert (
        main(["demo", "--data", "moons", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    )
    printed = capsys.readouterr().out
    assert "| NLL |" in printed and "PEG-5" in printed and "PEP-5" in printed
    result = json.loads((tmp_path / "results.json").read_text())
    assert set(result["metrics"]) == {"Base", "Temp-scaled", "PEP-5", "PEG-5"}
    for column in result["metrics"].values():
        assert {"nll", "error", "brier", "ece", "mce"} <= set(column)
    assert result["chosen"]["eta"] > 0 and result["chosen"]["sigma"] > 0
    assert result["command"].startswith("peg demo")
    for name in ("reliability.png", "decision_boundaries.png", "results.md"):
        assert (tmp_path / name).stat().st_size > 0


def test_the_readme_shows_what_the_demo_wrote():
    """README's "Results, in short" figures are those `peg demo --out docs/demo` wrote: its
    table is results.json's metrics as the demo renders them (and results.md holds), its sizes
    and seconds are results.json's. Changing the demo's numbers means rerunning it."""
    from pathlib import Path

    from peg.apps.bench.tables import markdown_table

    root = Path(__file__).resolve().parents[2]
    results = json.loads((root / "docs/demo/results.json").read_text())
    table = markdown_table(results["metrics"])
    readme = (root / "README.md").read_text()
    assert table in (root / "docs/demo/results.md").read_text()
    assert table in readme, "README.md: the results table differs from docs/demo/results.json"
    sizes, seconds = results["sizes"], round(results["seconds"]["total"])
    assert f"({seconds} s)" in readme and results["command"] == "peg demo --out docs/demo"
    assert f"{sizes['train']:,} " in readme and f"{sizes['test']:,} test" in readme
