"""`peg paper-tables` on the seconds-sized digits preset: tables, files, cache, errors."""

from __future__ import annotations

import json

import pytest

from peg.apps.bench import bases, paper, runner
from peg.apps.bench.tables import markdown_table
from peg.apps.cli import main


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tables")
    payload = paper.run(
        "digits",
        seeds=[0],
        out=out,
        cache=out / "cache",
        tables=["1", "7"],
        progress=False,
        say=lambda _: None,
    )
    return out, payload


def test_tables_are_written_with_their_command_and_columns(digits_run):
    out, payload = digits_run
    text = (out / "paper-tables-digits.md").read_text()
    assert "## Table 1: SWA as the base solution" in text
    assert "| metric | PEG-15 | PEP-15 | PEG-30 | PEP-30 | SWA |" in text
    assert "| metric | PEG-15 | PEP-15 | SWAG-Diag | SWAG |" in text
    saved = json.loads((out / "paper-tables-digits.json").read_text())
    assert saved["preset"] == "digits" and saved["seeds"] == [0]
    assert saved["entries"].keys() == payload["entries"].keys()
    members = {k: v["info"][0]["members"] for k, v in saved["entries"].items()}
    assert members == {
        "swa/peg-15": 15,
        "swa/pep-15": 15,
        "swa/peg-30": 30,
        "swa/pep-30": 30,
        "swa": 1,
        "swag-diag/peg-15": 15,  # S=1 on each of 15 SWAG-Diag samples
        "swag-diag/pep-15": 15,
        "swag-diag": 15,
        "swag": 15,
    }
    for entry in saved["entries"].values():
        m = entry["metrics"][0]
        assert 0 <= m["error"] < 0.3 and m["nll"] > 0 and 0 <= m["ece"] <= 1


def test_a_rerun_reads_the_cache_and_trains_nothing(digits_run, monkeypatch):
    out, payload = digits_run

    def refuse(*args, **kwargs):
        raise AssertionError("a cached entry was rebuilt")

    monkeypatch.setattr(runner.SeedRun, "build", refuse)
    monkeypatch.setattr(bases.DeepEnsemble, "fit", refuse)
    monkeypatch.setattr(bases.SWAG, "fit", refuse)
    again = paper.run(
        "digits", [0], out, out / "cache", ["1", "7"], progress=False, say=lambda _: None
    )
    assert again["entries"] == payload["entries"]


def test_cli_runs_a_table(tmp_path, capsys):
    code = main(
        [
            "paper-tables",
            "--preset",
            "digits",
            "--seeds",
            "1",
            "--tables",
            "12",
            "--out",
            str(tmp_path),
            "--cache",
            str(tmp_path / "cache"),
            "--no-progress",
        ]
    )
    assert code == 0
    assert "| metric | PEG-Unbiased | PEG-30 | SWA |" in capsys.readouterr().out
    saved = json.loads((tmp_path / "paper-tables-digits.json").read_text())
    assert saved["command"].startswith("peg paper-tables --preset digits")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"preset": "imagenet"}, "preset"),
        ({"tables": ["2"]}, "tables"),
        ({"seeds": []}, "seeds"),
    ],
)
def test_bad_arguments_fail_before_any_work(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        paper.run(**{"preset": "digits", "out": tmp_path, "cache": tmp_path, **kwargs})
    assert not any(tmp_path.iterdir())


def test_markdown_table_prints_mean_and_std_and_bolds_the_best():
    cols = {
        "A": {"nll": [0.5, 0.7], "error": [0.1, 0.1], "brier": [0.2, 0.2], "ece": [0.05, 0.07]},
        "B": {"nll": 0.4, "error": 0.2, "brier": 0.1, "ece": 0.01},
    }
    text = markdown_table(cols)
    assert "| NLL | 0.6000 ± 0.1414 | **0.4000** |" in text
    assert "| Error % | **10.00 ± 0.00** | 20.00 |" in text


def test_every_table_column_names_a_known_entry():
    for _, columns in paper.TABLES.values():
        for _, key in columns:
            assert key in paper.ENTRIES
    assert paper.PAPER_GRID == (0.001, 0.01, 0.1, 1.0)
