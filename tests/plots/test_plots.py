"""Plots: both figures are written as non-empty PNGs, atomically, and bad input is refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from peg import metrics, plots
from peg.metrics.calibration import binned_ece

PNG = b"\x89PNG\r\n\x1a\n"
NAN = math.nan


def _curve() -> dict[str, torch.Tensor]:
    return {
        "edges": torch.linspace(0, 1, 6, dtype=torch.float64),
        "confidence": torch.tensor([NAN, 0.35, 0.5, 0.7, 0.95], dtype=torch.float64),
        "accuracy": torch.tensor([NAN, 0.5, 0.4, 0.6, 0.97], dtype=torch.float64),
        "count": torch.tensor([0, 10, 20, 30, 40]),
    }


def _written(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 1000
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_reliability_diagram(tmp_path: Path) -> None:
    probs = torch.softmax(torch.randn(300, 4) * 3, -1)
    y = torch.randint(0, 4, (300,))
    curves = {"fake": _curve(), "metrics": metrics.reliability(probs, y, bins=10)}
    out = plots.reliability_diagram(curves, tmp_path / "a" / "b" / "rel.png", title="test")
    assert out == tmp_path / "a" / "b" / "rel.png"
    _written(out)
    plots.reliability_diagram({"one": _curve()}, out)  # overwrites in place
    _written(out)


def test_reliability_diagram_wraps_rows(tmp_path: Path) -> None:
    from PIL import Image

    curves = {f"m{i}": _curve() for i in range(7)}
    wide = plots.reliability_diagram(curves, tmp_path / "wide.png", per_row=7)
    wrapped = plots.reliability_diagram(curves, tmp_path / "wrapped.png", per_row=3)
    (w1, h1), (w3, h3) = Image.open(wide).size, Image.open(wrapped).size
    assert w3 < w1 / 2 and h3 > 2.5 * h1  # 3 rows of 3 panels against 1 row of 7
    with pytest.raises(ValueError, match="per_row"):
        plots.reliability_diagram(curves, tmp_path / "x.png", per_row=0)


def test_reliability_ece_matches_the_definition() -> None:
    c = _curve()
    conf, acc, count = (c[k].numpy() for k in ("confidence", "accuracy", "count"))
    expected = (10 * 0.15 + 20 * 0.1 + 30 * 0.1 + 40 * 0.02) / 100
    assert binned_ece(conf, acc, count) == pytest.approx(expected)
    probs = torch.softmax(torch.randn(500, 3) * 2, -1)
    y = torch.randint(0, 3, (500,))
    r = metrics.reliability(probs, y, bins=15)
    ece = binned_ece(r["confidence"].numpy(), r["accuracy"].numpy(), r["count"].numpy())
    assert ece == metrics.ece(probs, y, bins=15)  # the diagram's title is the metric, exactly


def test_reliability_diagram_refuses_bad_curves(tmp_path: Path) -> None:
    path = tmp_path / "x.png"
    with pytest.raises(ValueError, match="curves"):
        plots.reliability_diagram({}, path)
    bad = _curve()
    bad["edges"] = bad["edges"][:-1]
    with pytest.raises(ValueError, match="edges"):
        plots.reliability_diagram({"m": bad}, path)
    with pytest.raises(ValueError, match="missing"):
        plots.reliability_diagram({"m": {"edges": torch.zeros(3)}}, path)
    empty = _curve()
    empty["count"] = torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError, match="count"):
        plots.reliability_diagram({"m": empty}, path)
    assert not path.exists()


def _risk_curves() -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """Curves of member logits `[3, 400, 4]` by their max probability and by a quantised
    score (a few tie groups), and the logits and labels."""
    g = torch.Generator().manual_seed(0)
    z, y = 2 * torch.randn(3, 400, 4, generator=g), torch.randint(0, 4, (400,), generator=g)
    quantised = (metrics.ensemble_probs(z).max(-1).values * 4).round()
    curves = {
        "ensemble": metrics.risk_coverage_curve(z, y),
        "quantised": metrics.risk_coverage_curve(z, y, confidence=quantised),
    }
    return curves, z, y


def test_risk_coverage_writes_a_png_and_labels_each_area(tmp_path: Path) -> None:
    curves, z, y = _risk_curves()
    path = tmp_path / "a" / "rc.png"
    ax = plots.risk_coverage(curves, path, title="test")
    _written(path)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == f"ensemble (AURC {100 * metrics.aurc(z, y):.2f}%)"
    line = ax.get_lines()[1]  # the quantised curve: r = g / c exactly between its points
    x, r = line.get_xdata(), line.get_ydata()
    pp = metrics.Predictive(z, y)
    quantised = (pp.top[0] * 4).round()
    for i in (100, 300, 500):
        want = metrics.risk_at_coverage(z, y, float(x[i]), confidence=quantised)
        assert r[i] == pytest.approx(want, rel=1e-9)
    fig = plots.risk_coverage(curves, generalized=True)  # no path: nothing written, the Figure
    (ax,) = fig.axes
    assert "AUGRC" in ax.get_legend().get_texts()[0].get_text()
    assert ax.get_lines()[0].get_xydata()[0].tolist() == [0.0, 0.0]


def test_risk_coverage_draws_into_a_given_axes(tmp_path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves = _risk_curves()[0]
    fig = Figure()
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    assert plots.risk_coverage(curves, ax=left) is left
    assert plots.risk_coverage(curves, tmp_path / "both.png", ax=right, generalized=True) is right
    assert len(left.get_lines()) == len(right.get_lines()) == 2
    _written(tmp_path / "both.png")  # the given Axes' figure, both panels


def test_risk_coverage_refuses_bad_input(tmp_path: Path) -> None:
    curves = _risk_curves()[0]
    with pytest.raises(ValueError, match="curves: expected a non-empty dict"):
        plots.risk_coverage({})
    with pytest.raises(ValueError, match=r"missing keys \['accepted'\]"):
        plots.risk_coverage({"m": {k: v for k, v in curves["ensemble"].items() if k != "accepted"}})
    bad = dict(curves["ensemble"], errors=curves["ensemble"]["errors"].flip(0))
    with pytest.raises(ValueError, match="'errors' grow"):
        plots.risk_coverage({"m": bad})
    with pytest.raises(ValueError, match="ax: expected a matplotlib Axes"):
        plots.risk_coverage(curves, ax="left")
    with pytest.raises(ValueError, match="path"):
        plots.risk_coverage(curves, 3)


def _linear_predictor(w: torch.Tensor):
    return lambda pts: torch.softmax(pts @ w, -1)


def test_decision_boundaries(tmp_path: Path) -> None:
    X = torch.randn(60, 2)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 1).long()
    predictors = {
        "sharp": _linear_predictor(torch.tensor([[-5.0, 5.0, 0.0], [0.0, 0.0, 5.0]])),
        "flat": _linear_predictor(torch.tensor([[-0.5, 0.5, 0.0], [0.0, 0.0, 0.5]])),
        "uniform": lambda pts: torch.full((len(pts), 3), 1 / 3),
    }
    out = plots.decision_boundaries(predictors, X, y, tmp_path / "d" / "db.png", "t", 40)
    _written(out)


def test_decision_boundaries_refuses_bad_input(tmp_path: Path) -> None:
    X, y = torch.randn(20, 2), torch.randint(0, 2, (20,))
    logits = {"logits": lambda pts: pts @ torch.tensor([[3.0, -3.0], [1.0, 2.0]])}
    with pytest.raises(ValueError, match="softmax"):
        plots.decision_boundaries(logits, X, y, tmp_path / "x.png", resolution=10)
    good = {"p": _linear_predictor(torch.eye(2))}
    with pytest.raises(ValueError, match="X"):
        plots.decision_boundaries(good, torch.randn(20, 3), y, tmp_path / "x.png")
    with pytest.raises(ValueError, match="y"):
        plots.decision_boundaries(good, X, y.float(), tmp_path / "x.png")
    with pytest.raises(ValueError, match="resolution"):
        plots.decision_boundaries(good, X, y, tmp_path / "x.png", resolution=1)
    with pytest.raises(ValueError, match="classes"):
        plots.decision_boundaries(good, X, y + 1, tmp_path / "x.png", resolution=10)
    assert not (tmp_path / "x.png").exists()
    assert list(tmp_path.iterdir()) == []


def test_scale_search(tmp_path: Path, overfit_mlp, moons_data) -> None:
    import peg

    fitted = peg.PEG(n_members=4, grad_batch_size=32).fit(overfit_mlp, moons_data["val"])
    _written(plots.scale_search(fitted, tmp_path / "s" / "eta.png", title="η"))
    golden = peg.PEP(n_members=4, search="golden").fit(overfit_mlp, moons_data["val"])
    _written(plots.scale_search(golden, tmp_path / "g" / "sigma.png"))  # no interpolant
    with pytest.raises(ValueError, match="searched"):
        plots.scale_search(peg.PEG(n_members=2, eta=0.1).fit(overfit_mlp, moons_data["val"]), "x")


def test_corruption_grid(tmp_path: Path) -> None:
    image = torch.rand(1, 28, 28)  # grey: every corruption but saturate applies
    names = ["fog", "glass_blur", "contrast"]
    out = plots.corruption_grid(image, tmp_path / "grid" / "c.png", names=names, columns=2)
    _written(out)
    rgb = torch.rand(1, 3, 32, 32)
    _written(plots.corruption_grid(rgb, tmp_path / "rgb" / "c.png", ["saturate"], (2,)))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"image": torch.rand(2, 3, 32, 32)}, "image"),
        ({"names": ["hail"]}, "name"),
        ({"names": ["saturate"], "image": torch.rand(1, 28, 28)}, "X"),
        ({"severities": (0,)}, "severity"),
        ({"columns": 0}, "columns"),
        ({"path": 3}, "path"),
    ],
)
def test_corruption_grid_refuses_bad_input(tmp_path: Path, kwargs, argument) -> None:
    call = {"image": torch.rand(3, 32, 32), "path": tmp_path / "c.png", **kwargs}
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        plots.corruption_grid(**call)
    assert not list(tmp_path.iterdir())  # refused before writing anything
