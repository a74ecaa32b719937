"""Every method shows itself in a notebook: its class, fitted or not, its arguments and its
fitted values, as HTML (escaped, styled by CSS scoped to the block, readable on dark themes)
and as markdown; `repr` stays the constructor call."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.methods._display import summary
from peg.methods.base import Method
from peg.utils import html as _html


def _logits(n: int = 300, classes: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    z = torch.randn(n, classes, generator=g)
    z[torch.arange(n), y] += 2.0
    return 3 * z, y


PUBLIC = sorted(
    (name for name in peg.__all__
     if inspect.isclass(getattr(peg, name)) and issubclass(getattr(peg, name), Method)),
)  # fmt: skip


def test_every_public_method_class_has_the_display() -> None:
    assert {"TemperatureScaling", "PEG", "ConformalClassifier", "AutoSelect"} <= set(PUBLIC)
    shown = 0
    for name in PUBLIC:
        try:
            method = getattr(peg, name)()
        except TypeError:  # a required argument (none today but the ones tested below)
            continue
        html, markdown = method._repr_html_(), method._repr_markdown_()
        assert f'<span class="peg-name">{name}</span>' in html, name
        assert "peg-unfitted" in html and "Not fitted: call fit(...) first." in html
        assert markdown.startswith(f"**{name}** (not fitted")
        shown += 1
    assert shown >= 15


def test_a_fitted_calibrator_shows_its_fitted_values() -> None:
    z, y = _logits()
    ts = peg.TemperatureScaling(max_iter=50).fit(nn.Identity(), (z, y))
    html = ts._repr_html_()
    assert "peg-fitted" in html and ">fitted<" in html
    assert f"<td>temperature_</td><td>{ts.temperature_:.4g}</td>" in html
    # the argument set away from its default first, every argument folded under it
    assert "<caption>Arguments set</caption>" in html and "<td>max_iter</td><td>50</td>" in html
    assert "<summary>All 8 arguments</summary>" in html
    markdown = ts._repr_markdown_()
    assert "| **max_iter** | `50` |" in markdown and "| bounds | `(0.001, 1000.0)` |" in markdown
    assert f"| temperature_ | {ts.temperature_:.4g} |" in markdown
    assert repr(ts) == "TemperatureScaling(max_iter=50)"  # the plain-text form, unchanged


def test_arrays_modules_and_ensembles_are_summarised(overfit_mlp, moons_data) -> None:
    z, y = _logits(600, 12)
    matrix = peg.MatrixScaling().fit(nn.Identity(), (z, y))
    rows = dict(re.findall(r"<tr><td>(\w+_)</td><td>([^<]*)</td></tr>", matrix._repr_html_()))
    assert rows["weights_"].startswith("array [12, 12] float")  # 144 numbers: by shape
    assert rows["bias_"].startswith("array [12]") and rows["predictor_"].startswith("Identity")
    vector = peg.VectorScaling().fit(nn.Identity(), _logits())
    bias = vector.bias_.tolist()
    assert f"[{', '.join(f'{b:.4g}' for b in bias)}]" in vector._repr_html_()  # 4: in full
    fitted = peg.PEG(n_members=3, grad_batch_size=32).fit(overfit_mlp, moons_data["val"])
    html = fitted._repr_html_()
    assert f"<td>eta_</td><td>{fitted.eta_:.4g}</td>" in html
    assert "<td>members</td><td>3</td>" in html and "Ensemble (3 members)" in html


def test_names_and_values_are_escaped_and_the_css_is_scoped() -> None:
    ts = peg.TemperatureScaling(batch_fn=lambda batch: batch)  # repr "<function <lambda> ...>"
    html = ts._repr_html_()
    assert "<function" not in html and "&lt;function" in html
    ids = re.findall(r'<div id="(peg-[0-9a-f]{12})"><style>', html)
    assert len(ids) == 1
    rules = re.findall(r"^(#[^ {]+)", html.split("<style>")[1].split("</style>")[0], re.M)
    assert rules and set(rules) == {f"#{ids[0]}"}  # every rule under the block's own id
    assert ids[0] not in peg.TemperatureScaling()._repr_html_()  # another block, another id
    style = html.split("<style>")[1].split("</style>")[0]
    # readable on dark themes: the text colour is inherited, never a fixed one
    assert "color: inherit" in style and not re.search(r"(?<![-\w])color:\s*(#|black|white)", style)
    assert _html.md("a|b\nc") == "a\\|b c"  # a markdown cell stays one cell


def test_summary() -> None:
    assert summary(0.123456) == "0.1235" and summary(3) == "3" and summary(True) == "True"
    assert summary(torch.tensor([1.0, 2.5])) == "[1, 2.5]" and summary(np.float32(2)) == "2"
    assert summary(torch.zeros(3, 5)) == "array [3, 5] float32, 0 … 0"
    assert summary(torch.ones(20, dtype=torch.bfloat16)) == "array [20] bfloat16, 1 … 1"
    assert summary(torch.zeros(2, device="meta")) == "tensor [2] float32"
    assert summary({"a": 1.0, 2.0: None}) == "a: 1, 2: None"
    assert summary(list(range(20))) == "list of 20"
    assert summary(nn.Linear(2, 3)) == "Linear (9 parameters)"
    assert summary("x" * 500).endswith("…") and len(summary("x" * 500)) == 160


@pytest.mark.parametrize("fitted", [False, True])
def test_label_shift_and_conformal(fitted: bool) -> None:
    z, y = _logits()
    shift = peg.LabelShift()
    conformal = peg.ConformalClassifier(alpha=0.2)
    if fitted:
        shift.fit(nn.Identity(), (z, y), target=z[:100])
        conformal.fit(nn.Identity(), (z, y))
        assert "<td>priors_</td><td>[" in shift._repr_html_()
        assert f"<td>quantile_</td><td>{conformal.quantile_:.4g}</td>" in conformal._repr_html_()
    else:
        assert "<td>priors_</td>" not in shift._repr_html_()
        assert "quantile_" not in conformal._repr_markdown_()


def test_the_question_mark_links_to_the_reference_page(monkeypatch) -> None:
    """As scikit-learn's display: a "?" to the class's reference page (mkdocs.yml:
    reference/<Name>.html), under `peg.utils.html.DOCS_URL` (PEG_DOCS_URL: the served site)."""
    html = peg.TemperatureScaling()._repr_html_()
    assert 'class="peg-doc" href="reference/TemperatureScaling.html"' in html
    monkeypatch.setattr(_html, "DOCS_URL", "https://docs.example/peg")
    assert 'href="https://docs.example/peg/LabelShift.html"' in peg.LabelShift()._repr_html_()

    class Private(peg.TemperatureScaling):  # no reference page: no link
        pass

    assert 'class="peg-doc"' not in Private()._repr_html_()


def test_markdown_values_stay_in_their_cell() -> None:
    """A value with a backtick, `|` or a line break neither closes its code span nor adds a
    cell or a row."""
    assert _html.md_code("a`b|c\nd") == "``a`b\\|c d``"
    assert _html.md_code("`x`") == "`` `x` ``"
    ts = peg.TemperatureScaling(batch_fn=None)
    ts.__dict__["max_iter"] = "1 | 2\n| x | y |`"
    text = ts._repr_markdown_()
    assert "\n| x | y |" not in text
    assert all(r.replace("\\|", "").count("|") == 3 for r in text.splitlines() if r.startswith("|"))
