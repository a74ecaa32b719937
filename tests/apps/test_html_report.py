"""`Comparison` and `AutoSelect` outside a terminal: one self-contained HTML file (rendered by
a real headless browser, its screenshot checked), notebook display, data frames, CSV and JSON,
and `peg compare/select --html --format`."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.apps.cli import main
from peg.apps.compare import Comparison, compare
from peg.apps.results import json_ready
from peg.apps.select import AutoSelect
from peg.errors import NotFittedError

HOSTILE = '<img src=x onerror="alert(1)">'  # a name that would be markup if not escaped
# a resource fetched from the network: src= or href= to http(s) or a protocol-relative URL
NETWORK = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def _problem(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g)
    return X, (X[:, 0] + 0.5 * X[:, 1] > 0).long() + (X[:, 2] > 0.8).long()


@pytest.fixture(scope="module")
def overconfident() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[-4.0, -2, 0, 0], [4, 2, -6, 0], [0, 0, 9, 1]]))
    return model.eval()


@pytest.fixture(scope="module")
def comparison(overconfident) -> Comparison:
    return compare(
        overconfident, _problem(400, 1), _problem(400, 2), ["Model", "TS"],
        shifted={"noisy": (_problem(200, 3)[0] * 2, _problem(200, 3)[1])},
        conformal={"alpha": [0.1]}, say=None, progress=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def selector(overconfident) -> AutoSelect:
    X, y = _problem(450, 4)
    with torch.no_grad():
        logits = overconfident(X)  # over-confident saved logits
    return AutoSelect(candidates=["TS", "Vector scaling"], cv=3, max_fit_seconds=None,
                      progress=False).fit(nn.Identity(), (logits, y))  # fmt: skip


def _synthetic() -> Comparison:
    """A Comparison as peg.compare makes one, with hostile method and set names."""
    curve = peg.metrics.reliability(torch.softmax(torch.randn(50, 3), -1), torch.arange(50) % 3)
    table = [
        {"method": HOSTILE, "base": "model", "fit_seconds": 0.1, "forwards": 1.0,
         "memory_mb": 0.1, "predict_seconds": 0.1, "chosen": "T = 2 & <b>", "nll": 0.5,
         "error": 0.1, "nll (a&b)": 0.7},
        {"method": "ok", "base": "model", "failed": {"type": "ValueError",
         "message": "</table><script>x()</script>", "hint": "<b>"}},
    ]  # fmt: skip
    sets = {"test": {"points": 50, "kind": "test"}, "a&b": {"points": 50, "kind": "shifted"}}
    return Comparison(table, {}, {"test": {HOSTILE: curve}}, {"<i>": "why <u>"}, sets,
                      metrics=("nll", "error"))  # fmt: skip


def _self_contained(text: str) -> None:
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert '<meta charset="utf-8">' in text
    assert not NETWORK.search(text), NETWORK.search(text)
    assert "<script" not in text.lower() and "<link" not in text.lower()  # no JS, no CSS file
    assert "@import" not in text and "url(" not in text  # nor fetched from the style


def test_comparison_to_html_is_one_self_contained_file(comparison) -> None:
    text = comparison.to_html()
    _self_contained(text)
    # the tables (a row per method), conformal coverage, the diagrams of both labelled sets
    assert text.count("<td>Model</td>") >= 3 and text.count("<td>TS</td>") >= 3
    assert "Conformal prediction" in text and "Coverage % (α=0.1)" in text
    assert text.count('src="data:image/png;base64,') == 2
    assert "Before: Model, the model as it is" in text


def test_every_name_is_escaped() -> None:
    result = _synthetic()
    for text in (result.to_html(), result._repr_html_()):
        assert HOSTILE not in text and "<script>x()" not in text and "<u>" not in text
        assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in text
        assert "a&amp;b" in text and "T = 2 &amp; &lt;b&gt;" in text
    assert "&lt;/table&gt;&lt;script&gt;" in result.to_html()  # the failure, said as text
    img = re.search(r'<img alt="([^"]*)"', result.to_html())
    assert img is not None and "<" not in img.group(1)  # the figure's alt text too


def test_to_html_writes_one_utf8_file(comparison, tmp_path) -> None:
    path = comparison.to_html(tmp_path / "report.html")
    assert path == tmp_path / "report.html"
    text = path.read_text(encoding="utf-8")
    _self_contained(text)
    assert "α=0.1" in text  # UTF-8 throughout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary left
    (tmp_path / "folder.html").mkdir()
    with pytest.raises(IsADirectoryError, match="^path: .*folder.html is a folder"):
        comparison.to_html(tmp_path / "folder.html")
    with pytest.raises(TypeError, match="^path: expected a file path or None"):
        comparison.to_html(3)


def test_the_file_is_utf8_whatever_the_locale(tmp_path) -> None:
    """Under an ASCII locale (no UTF-8 mode), the report's α and ± are written all the same."""
    code = (
        "import sys; from peg.apps.compare import Comparison\n"
        "c = Comparison([{'method': 'TS', 'base': 'model', 'nll': 0.5}], {}, {}, {},\n"
        "               {'test': {'points': 10, 'kind': 'test'}})\n"
        "c.to_html(sys.argv[1])"
    )
    env = {"LC_ALL": "POSIX", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0",
           "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}  # fmt: skip
    path = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-X", "utf8=0", "-c", code, str(path)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "10^-4" in path.read_bytes().decode("utf-8") and "10 points" in path.read_text("utf-8")
    assert "–" in path.read_text(encoding="utf-8")  # an en dash: not ASCII


def test_the_report_renders_in_a_real_browser(comparison, selector, tmp_path) -> None:
    """Chromium, headless, draws each page; the screenshots are kept in the test's folder and
    must not be blank."""
    browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                    if shutil.which(b)), None)  # fmt: skip
    if browser is None:
        pytest.skip("no chromium binary on PATH (scripts/setup.sh installs Debian's chromium)")
    from PIL import Image

    for name, result in (("compare", comparison), ("select", selector)):
        page = result.to_html(tmp_path / f"{name}.html")
        shot = tmp_path / f"{name}.png"
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
             "--window-size=1200,1600", page.resolve().as_uri()],
            capture_output=True, timeout=180, check=False,
        )  # fmt: skip
        assert shot.is_file(), f"chromium wrote no screenshot of {page}"
        pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
        assert pixels.shape == (1600, 1200)
        inked = (pixels < 200).mean()  # text, table rules, the figures' bars
        assert pixels.var() > 100 and inked > 0.01, (name, pixels.var(), inked)
        # the answer first: the verdict's box, its strong green left border (a real
        # improvement here; no other green on the page is that strong above the figures), is
        # drawn at the top of the page, under the title
        rgb = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
        green = (rgb[..., 1] - rgb[..., 0] > 60) & (rgb[..., 1] - rgb[..., 2] > 50)
        rows = np.flatnonzero(green[:, :200].sum(1) >= 3)  # the 5 px border, at the left
        assert rows.size > 10 and rows[0] < 150, (name, rows[:5])
        said = result.verdict_ if name == "select" else result.verdict()
        assert "a real improvement" in said.text()


def test_a_notebook_shows_the_tables(comparison) -> None:
    html = comparison._repr_html_()
    ids = re.findall(r'<div id="(peg-[0-9a-f]{12})"><style>', html)
    assert len(ids) == 1 and f"#{ids[0]} table.peg-table" in html  # CSS scoped to the block
    assert ids[0] not in comparison._repr_html_()  # a new id each time
    assert "<table" in html and "<img" not in html  # the figures are the file's (slow to draw)
    assert comparison._repr_markdown_() == comparison.to_markdown() == str(comparison)
    said = repr(comparison)
    assert said.startswith("<Comparison: 2 methods on test (test, ") and "\n" not in said


def test_the_table_as_csv_json_and_markdown(comparison) -> None:
    rows = list(csv.DictReader(io.StringIO(comparison.to_text("csv"))))
    assert [r["method"] for r in rows] == ["Model", "TS"]
    for row, r in zip(rows, comparison.table, strict=True):
        assert float(row["nll"]) == r["nll"] and float(row["nll (noisy)"]) == r["nll (noisy)"]
        assert float(row["coverage@0.1"]) == r["coverage@0.1"]
    printed = json.loads(comparison.to_text("json"))
    assert [r["method"] for r in printed] == ["Model", "TS"]
    assert [r["choice"] for r in printed] == ["baseline", "best"]  # the verdict's marks
    assert printed[1]["fitted_scale"] == comparison.row("TS")["chosen"]
    assert "chosen" not in printed[1]
    assert printed[1]["nll"] == json_ready(comparison.table)[1]["nll"]
    assert comparison.to_text("md") == comparison.to_markdown()
    with pytest.raises(ValueError, match=r"^format: expected one of \['md', 'csv', 'json'\]"):
        comparison.to_text("xlsx")
    failed = _synthetic().to_text("csv")
    assert "ValueError" in failed.splitlines()[2]  # a failure flattened to its message


def test_to_pandas_or_a_clear_error(comparison, selector, monkeypatch) -> None:
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass
    else:
        frame = comparison.to_pandas()
        assert list(frame.index) == ["Model", "TS"] and frame.loc["TS", "nll"] == (
            comparison.row("TS")["nll"])  # fmt: skip
        assert list(selector.to_pandas().index) == ["Uncalibrated", "TS", "Vector scaling"]
    monkeypatch.setitem(sys.modules, "pandas", None)  # as where pandas is not installed
    with pytest.raises(ImportError, match=r"^Comparison.to_pandas needs pandas.*pip install"):
        comparison.to_pandas()


def test_autoselect_report_has_its_reasoning_and_the_diagrams(selector) -> None:
    text = selector.to_html()
    _self_contained(text)
    assert f"Chosen: {selector.chosen_}, by 3-fold cross-validation" in text
    assert text.count('<tr class="peg-chosen">') == 1
    assert "Cost: " in text and "no budget (max_fit_seconds=None)" in text
    assert "<summary>As text</summary>" in text  # to_markdown() as it prints
    assert text.count('src="data:image/png;base64,') == 1
    before, after = selector.reliability_.values()
    assert int(before["count"].sum()) == int(after["count"].sum()) == 450
    ece = peg.metrics.calibration.binned_ece
    assert ece(after["confidence"], after["accuracy"], after["count"]) < ece(
        before["confidence"], before["accuracy"], before["count"])  # fmt: skip
    assert selector._repr_markdown_() == selector.to_markdown()
    frame = [r["candidate"] for r in csv.DictReader(io.StringIO(selector.to_text("csv")))]
    assert frame == ["Uncalibrated", "TS", "Vector scaling"]  # the baseline first


def test_an_autoselect_not_fitted_shows_itself_as_a_method() -> None:
    unfitted = AutoSelect(candidates=["TS"])
    assert "not fitted" in unfitted._repr_html_() and "(not fitted" in unfitted._repr_markdown_()
    with pytest.raises(NotFittedError, match="before reporting"):
        unfitted.to_html()


# ---------------------------------------------------------------- the command line
def test_peg_select_html_and_csv(overconfident, tmp_path, monkeypatch, capsys) -> None:
    X, y = _problem(300, 5)
    with torch.no_grad():
        np.save(tmp_path / "v.npy", overconfident(X).numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    monkeypatch.chdir(tmp_path)
    argv = ["select", "--logits", "v.npy", "--labels", "y.npy", "--candidates", "TS", "--cv",
            "2", "--no-progress", "--save", "out", "--format", "csv", "--html"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("candidate,base,forwards,") and "report.html" in err  # stdout: the CSV
    _self_contained((tmp_path / "out" / "report.html").read_text(encoding="utf-8"))
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open(encoding="utf-8")))
    assert rows[0]["candidate"] == "Uncalibrated" and rows[0]["status"] == "baseline"
    assert rows[1]["candidate"] == "TS" and rows[1]["status"] == "chosen"
    assert (tmp_path / "out" / "results.md").is_file()  # as without the options


def test_peg_select_html_needs_a_folder_and_refuses_one_in_the_way(tmp_path, capsys) -> None:
    """Both before any work: the logits named are not even read."""
    with pytest.raises(SystemExit) as stopped:
        main(["select", "--logits", "v.npy", "--labels", "y.npy", "--html"])
    assert stopped.value.code == 2
    assert "--html: needs --save DIR" in capsys.readouterr().err
    (tmp_path / "out" / "report.html").mkdir(parents=True)
    with pytest.raises(SystemExit) as stopped:
        main(["select", "--logits", "v.npy", "--labels", "y.npy", "--save",
              str(tmp_path / "out"), "--html"])  # fmt: skip
    assert stopped.value.code == 2
    assert re.search(r"--html: .*report.html is a folder", capsys.readouterr().err)


MODULE = """
import torch
from torch import nn

def build():
    model = nn.Linear(4, 3)
    model.load_state_dict(torch.load("weights.pt", weights_only=True))
    return model.eval()
"""


def test_peg_compare_html_and_json(overconfident, tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "usermodel_html.py").write_text(MODULE)
    torch.save(overconfident.state_dict(), tmp_path / "weights.pt")
    for name, seed in (("val", 1), ("test", 2)):
        X, y = _problem(300, seed)
        np.savez(tmp_path / f"{name}.npz", x=X.numpy(), y=y.numpy())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "usermodel_html", raising=False)
    argv = ["compare", "--model", "usermodel_html:build", "--val", "val.npz", "--test",
            "test.npz", "--methods", "Model", "TS", "--out", "out", "--no-progress",
            "--format", "json", "--html"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    printed = json.loads(out)  # the progress on stderr
    assert [r["method"] for r in printed] == ["Model", "TS"]
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    _self_contained(page)
    assert page.count('src="data:image/png;base64,') == 1
    assert not (tmp_path / "out" / "results.csv").exists()  # only with --format csv
