"""`AutoSelect`'s ties go to the simpler map (issue 49, 3): a paired difference below
`folds.TIE` is a tie whatever its SE, an affine map shrunk to its simpler parent on every fold is
that parent, and a candidate raced out after k folds says its score is on those folds only."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from peg.apps.bench.spec import MethodSpec
from peg.apps.select import AutoSelect
from peg.apps.select.folds import TIE, beyond
from peg.apps.select.report import SIMPLICITY, choose, row_cells
from peg.methods.calibration._affine_select import reduces_to


def exact_ts_logits(n: int = 1500, classes: int = 10, seed: int = 6):
    """Logits where temperature scaling is exact: z = 3·N(0, 1) + 4·one-hot(y) (seed 6: vector
    scaling 2.2e-9 ± 1.3e-9 below TS, chosen before issue 49)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    z = 3 * torch.randn(n, classes, generator=g) + 4 * nn.functional.one_hot(y, classes)
    return z, y


def test_a_map_shrunk_to_ts_on_every_fold_is_ts_whichever_rule():
    """Vector scaling whose λ search chose ∞ on every fold is TS's map (its CV NLL 1e-9 from
    TS's): left out of the choice, saying so; TS chosen by the one-SE rule and by the best."""
    z, y = exact_ts_logits()
    for one_se in (True, False):
        sel = AutoSelect(candidates=["TS", "Vector scaling"], max_fit_seconds=None,
                         one_se=one_se, progress=False).fit(z, y)  # fmt: skip
        rows = {r["candidate"]: r for r in sel.report_}
        assert sel.chosen_ == "TS", (one_se, sel.to_markdown())
        assert rows["Vector scaling"]["equal_to"] == "TS"
        assert (
            "equal to TS: on every fold cross-validation shrank it to temperature"
            in (rows["Vector scaling"]["why"])
        )
        assert abs(rows["Vector scaling"]["diff"]) < TIE  # the tie the issue measured


def test_the_strengths_say_which_simpler_map_a_fit_is():
    assert reduces_to({"k_diagonal": None}, full=False) == "temperature"
    assert reduces_to({"k_diagonal": 3.0}, full=False) is None
    assert reduces_to({"k_diagonal": None, "k_off": None}, full=True) == "temperature"
    assert reduces_to({"k_diagonal": 10.0, "k_off": None}, full=True) == "diagonal"
    assert reduces_to({"k_diagonal": None, "k_off": 1.0}, full=True) is None
    assert reduces_to(None, full=True) is None  # fixed strengths: no claim


def _cross(points: dict[str, torch.Tensor], dropped: dict[str, str] | None = None,
           folds: dict[str, int] | None = None) -> SimpleNamespace:  # fmt: skip
    """What `choose` reads of a `CrossFit`."""
    folds = folds or {}
    return SimpleNamespace(
        points=points,
        dropped=dropped or {},
        gaps={},
        forwards={},
        reduced={},
        seconds={n: [0.01] * folds.get(n, 5) for n in points},
    )


def test_a_difference_below_the_floor_is_a_tie_and_the_simpler_map_wins():
    """Vector scaling 1.4e-9 below TS with an SE of 1e-12: 'beyond one SE' but not beyond the
    numerical floor: a tie, and the one-SE rule takes TS (the simpler)."""
    assert not beyond(1.4e-9, 1.3e-9) and beyond(2e-6, 1e-7) and not beyond(0.01, 0.01)
    g = torch.Generator().manual_seed(0)
    ts = torch.rand(200, generator=g, dtype=torch.float64)
    vs = ts - 1.4e-9 + 1e-12 * torch.rand(200, generator=g, dtype=torch.float64)
    specs = [MethodSpec("TS", "temperature", "model"),
             MethodSpec("Vector scaling", "vector-scaling", "model")]  # fmt: skip
    every = torch.arange(200)
    rows, chosen = choose(_cross({"TS": ts, "Vector scaling": vs}), specs, every, True, {})
    assert chosen == "TS" and rows[0]["diff"] > rows[0]["diff_se"]  # within the floor only
    _, chosen = choose(_cross({"TS": ts, "Vector scaling": vs - 1e-3}), specs, every, True, {})
    assert chosen == "Vector scaling"  # a real difference still counts


def test_a_candidate_raced_out_says_its_score_is_on_those_folds_only(tmp_path):
    """A partial mean (0.1446 on 443 points beside the chosen 0.1720) is not comparable: its
    cell says on how many folds, in the markdown and on the HTML page."""
    g = torch.Generator().manual_seed(0)
    ts = torch.rand(100, generator=g, dtype=torch.float64)
    model = torch.full((100,), float("nan"), dtype=torch.float64)
    model[:40] = ts[:40] + 0.5
    specs = [MethodSpec("TS", "temperature", "model"), MethodSpec("Model", "base", "model")]
    rows, _ = choose(_cross({"TS": ts, "Model": model}, {"Model": "raced out after fold 2"},
                            {"Model": 2}), specs, torch.arange(100), True, {})  # fmt: skip
    assert rows[1]["partial_folds"] == 2
    assert "on 2 folds only, 40 pts)" in row_cells(rows[1])[1]
    z, y = exact_ts_logits(900, 4)
    sel = AutoSelect(candidates=["Model", "TS"], cv=5, progress=False).fit(z * 3.0, y)
    assert sel.chosen_ == "TS" and "on 2 folds only" in sel.to_markdown()
    page = sel.to_html(tmp_path / "r.html")
    assert "on 2 folds only" in (tmp_path / "r.html").read_text() or "on 2 folds only" in str(page)


def test_the_docs_state_the_code_s_simplicity_order():
    """docs/select.md's stated order of the maps is `SIMPLICITY`'s."""
    from pathlib import Path

    text = " ".join((Path(__file__).parents[2] / "docs" / "select.md").read_text().split())
    named = ["TS", "Ensemble TS", "Order-preserving", "Spline", "Vector scaling", "Dirichlet",
             "Matrix scaling"]  # fmt: skip
    assert [n for n in SIMPLICITY if n in named] == named
    stated = ("then the simplest (`SIMPLICITY`): TS, ensemble TS, order-preserving, spline, "
              "vector scaling, Dirichlet, matrix scaling,")  # fmt: skip
    assert stated in text
