"""Conformal prediction in `peg bench` (spec field `conformal:`) and `peg.compare`
(`conformal=`): coverage and set size per method, calibrated on half the test set, on the other
half and on the shifted sets (`peg.apps.conformal`)."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch

import peg
from bad_inputs import raises_test
from peg.apps.bench.spec import parse_spec
from peg.apps.conformal import ConformalSpec, conformal_cells, halves, parse_conformal
from peg.errors import SpecError

from conftest import mlp, moons, overfit, run_bench

SPEC = {
    "name": "tiny-conformal",
    "data": "digits",
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"epochs": 2, "lr": 0.05, "batch_size": 64},
    "seeds": [0],
    "score_points": None,
    "methods": ["Single", "Temp-scaled", "PEG-4"],
    "shift": {"rotations": [30]},
    "conformal": {"alpha": [0.1, 0.05], "score": "aps", "columns": ["Single", "PEG-4"]},
}


def test_cells_cover_on_the_held_out_half_and_name_each_level():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4000, 5, generator=g) * 2
    y = torch.multinomial(logits.softmax(-1).mean(0), 1, generator=g)[:, 0]
    spec = ConformalSpec(alphas=(0.1, 0.05), score="lac")
    shifted = logits + 3 * torch.randn(3, 4000, 5, generator=g)  # the same rows, noisier
    cells = conformal_cells({"test": logits, "noisy": shifted, "x (OOD)": logits}, y, spec)
    assert set(cells) == {"test", "noisy"}
    assert set(cells["test"]) == {"coverage@0.1", "set_size@0.1", "coverage@0.05", "set_size@0.05"}
    assert abs(cells["test"]["coverage@0.1"] - 0.9) < 0.03
    assert cells["test"]["set_size@0.05"] > cells["test"]["set_size@0.1"]
    assert cells["noisy"]["coverage@0.1"] < cells["test"]["coverage@0.1"] - 0.05
    cal, rest = halves(4000, 0)
    assert len(set(cal.tolist()) | set(rest.tolist())) == 4000 and len(cal) == 2000


def test_bench_tables_show_coverage_and_size_for_the_chosen_columns(tmp_path):
    spec = parse_spec(SPEC)
    results = run_bench(spec, tmp_path)
    saved = json.loads((tmp_path / "tiny-conformal" / "results.json").read_text())
    for dataset in ("test", "rotate-30"):
        cells = saved["datasets"][dataset]
        for column in ("Single", "PEG-4"):
            assert {"coverage@0.1", "set_size@0.05"} <= set(cells[column])
        assert "coverage@0.1" not in cells["Temp-scaled"]
    test = results["per_seed"]["test"]["Single"]
    assert 0.8 < test["coverage@0.1"][0] <= 1.0
    text = (tmp_path / "tiny-conformal" / "results.md").read_text()
    assert "| Coverage % (α=0.1, aps) |" in text and "| Set size (α=0.05, aps) |" in text


def test_compare_adds_a_coverage_and_size_pair_per_method():
    X, y = moons(900, 0, noise=0.3)
    model = overfit(mlp(0, hidden=16), X[:200], y[:200], steps=300)
    shifted = (X[600:] + 0.5, y[600:])
    result = peg.compare(
        model,
        (X[200:400], y[200:400]),
        (X[400:], y[400:]),
        methods=["Model", "TS"],
        shifted={"moved": shifted},
        conformal={"alpha": 0.1, "score": "lac"},
        say=None,
        progress=False,
    )
    for row in result.table:
        assert 0.75 < row["coverage@0.1"] <= 1.0 and row["set_size@0.1"] > 0.5
        assert "coverage@0.1 (moved)" in row and "set_size@0.1 (moved)" in row


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    (
        "conformal",
        "a bench spec's conformal level outside (0, 1)",
        lambda: parse_spec({**SPEC, "conformal": {"alpha": [0.1, 1.5]}}),
        SpecError,
        r"spec.conformal.alpha: expected a miscoverage level in \(0, 1\), got 1.5",
    ),
    (
        "conformal",
        "a bench spec's conformal columns not in the spec",
        lambda: parse_spec({**SPEC, "conformal": {"columns": ["Single", "Nope"]}}),
        SpecError,
        r"spec.conformal.columns: .* unknown \['Nope'\]",
    ),
    (
        "conformal",
        "an unknown field of a bench spec's conformal",
        lambda: parse_conformal({"level": 0.1}, "spec.conformal", []),
        SpecError,
        r"spec.conformal: unknown field\(s\) \['level'\]",
    ),
    (
        "conformal",
        "an unknown conformal score",
        lambda: parse_conformal({"score": "naive"}, "conformal", []),
        SpecError,
        r"conformal.score: expected one of \['lac', 'aps', 'raps'\], got 'naive'",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
