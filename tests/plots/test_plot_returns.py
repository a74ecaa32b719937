"""Every figure of `peg.plots` without a path is a Figure (written nowhere, shown once in a
notebook), draws into a given Axes (figures of several panels in its place; a reliability
diagram on it), and a reliability diagram draws straight
from probabilities and labels."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from peg import metrics, plots

PNG = b"\x89PNG\r\n\x1a\n"


def _probs(n: int = 300, c: int = 4, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(n, c, generator=g), -1)


def _labels(n: int = 300, c: int = 4) -> torch.Tensor:
    return torch.randint(0, c, (n,), generator=torch.Generator().manual_seed(1))


def _searched() -> Any:
    """What `scale_search` reads of a fitted PEG: the scores of the scales it tried."""
    scores = {0.01: 0.9, 0.1: 0.7, 1.0: 0.8}
    return SimpleNamespace(search_=scores, search_predicted_={}, scale_name="eta", eta_=0.1,
                           meta_={"criterion": "nll"})  # fmt: skip


def _matrix() -> np.ndarray:
    return np.eye(3) * 0.5 + 0.5


def _cut() -> dict[str, Any]:
    xs, ys = np.linspace(-1, 2, 5), np.linspace(-1, 1, 4)
    z = np.full((4, 5), 0.5)
    return {"x": xs, "y": ys, "accuracy": z, "agreement_1": z, "agreement_2": z,
            "optima": np.array([[0.0, 0.0], [1.0, 0.0]])}  # fmt: skip


def _boundaries() -> tuple[Any, ...]:
    X = torch.randn(30, 2, generator=torch.Generator().manual_seed(0))
    y = (X[:, 0] > 0).long()
    return {"p": lambda pts: torch.softmax(pts @ torch.eye(2), -1)}, X, y


# (name, call with path and ax as keywords, panels: one Axes or several in its place)
CALLS: list[tuple[str, Any, bool]] = [
    ("reliability_diagram", lambda **kw: plots.reliability_diagram(_probs(), _labels(), **kw),
     False),
    ("reliability_diagram (curves)", lambda **kw: plots.reliability_diagram(
        {"m": metrics.reliability(_probs(), _labels())}, **kw), False),
    ("binary_reliability_diagram", lambda **kw: plots.binary_reliability_diagram(
        _probs(c=2)[:, 1], _labels(c=2), **kw), False),
    ("multilabel_reliability_diagram", lambda **kw: plots.multilabel_reliability_diagram(
        _probs(), _labels(1200, 2).reshape(300, 4), **kw), False),
    ("multilabel_reliability_diagram (per label)", lambda **kw: (
        plots.multilabel_reliability_diagram(
            _probs(), _labels(1200, 2).reshape(300, 4), per_label=True, **kw)), False),
    ("dense_reliability_diagram", lambda **kw: plots.dense_reliability_diagram(
        torch.randn(3, 4, 10, 10), _labels(300).reshape(3, 10, 10), **kw), False),
    ("risk_coverage", lambda **kw: plots.risk_coverage(
        {"m": metrics.risk_coverage_curve(_probs(), _labels())}, **kw), False),
    ("decision_boundaries", lambda **kw: plots.decision_boundaries(
        *_boundaries(), resolution=8, **kw), False),
    ("corruption_grid", lambda **kw: plots.corruption_grid(
        torch.rand(1, 8, 8), names=["contrast"], severities=(1,), **kw), True),
    ("similarity_matrices", lambda **kw: plots.similarity_matrices(
        {"a": _matrix(), "b": _matrix()}, label="cosine", **kw), True),
    ("radial_landscape", lambda **kw: plots.radial_landscape(_cut(), **kw), True),
    ("prediction_map", lambda **kw: plots.prediction_map(
        np.random.default_rng(0).normal(size=(4, 2)), np.array([0, 0, 1, 1]),
        ["checkpoint", "PEG"] * 2, **kw), False),
    ("diversity_accuracy_plane", lambda **kw: plots.diversity_accuracy_plane(
        {"PEG": {"accuracy": [0.8, 0.82], "diversity": [0.1, 0.2]}}, reference_accuracy=0.85,
        **kw), False),
    ("ensemble_size_curves", lambda **kw: plots.ensemble_size_curves(
        {"PEG": {"size": [1, 2, 3], "accuracy": [0.8, 0.82, 0.83], "nll": [0.5, 0.45, 0.44]}},
        **kw), True),
    ("scale_search", lambda **kw: plots.scale_search(_searched(), **kw), False),
]  # fmt: skip
IDS = [c[0] for c in CALLS]


def _user_figure(columns: int = 2) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 * columns, 4))
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, columns)


@pytest.mark.parametrize(("name", "call", "several"), CALLS, ids=IDS)
def test_without_a_path_a_figure_is_returned_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, call: Any, several: bool
) -> None:
    from matplotlib.figure import Figure

    monkeypatch.chdir(tmp_path)
    fig = call()
    assert isinstance(fig, Figure) and fig.axes  # drawn, not an empty canvas
    assert fig._repr_png_()[:8] == PNG  # what a notebook without a backend shows
    assert list(tmp_path.iterdir()) == []  # written nowhere


@pytest.mark.parametrize(("name", "call", "several"), CALLS, ids=IDS)
def test_with_a_path_the_png_is_written_as_before(
    tmp_path: Path, name: str, call: Any, several: bool
) -> None:
    out = call(path=tmp_path / "f" / "x.png")
    assert (tmp_path / "f" / "x.png").read_bytes()[:8] == PNG
    if name == "risk_coverage":
        assert out.get_legend() is not None  # its Axes, as it always returned
    else:
        assert out == tmp_path / "f" / "x.png"


@pytest.mark.parametrize(("name", "call", "several"), CALLS, ids=IDS)
def test_drawn_into_a_given_axes_of_the_callers_figure(
    tmp_path: Path, name: str, call: Any, several: bool
) -> None:
    from matplotlib.figure import SubFigure

    fig, (left, right) = _user_figure()
    right.plot([0, 1], [1, 0])  # the caller's own panel stays as it is
    drawn = call(ax=left, path=tmp_path / "mine.png")
    if several:  # its panels in the place of `left`, which is gone
        assert isinstance(drawn, SubFigure) and drawn.axes
        assert left not in fig.axes and all(a in fig.get_children()[-1].axes for a in drawn.axes)
    else:
        assert drawn is left and left.has_data()
    assert right in fig.axes and len(right.get_lines()) == 1
    assert (tmp_path / "mine.png").read_bytes()[:8] == PNG  # the caller's whole figure


def test_a_figure_of_several_panels_needs_an_axes_on_a_grid(tmp_path: Path) -> None:
    fig, _ = _user_figure()
    placed = fig.add_axes((0.1, 0.1, 0.3, 0.3))
    with pytest.raises(ValueError, match="^ax: this figure has several panels"):
        plots.similarity_matrices({"a": _matrix(), "b": _matrix()}, ax=placed)
    with pytest.raises(ValueError, match="^ax: expected a matplotlib Axes"):
        plots.ensemble_size_curves({"m": {"size": [1], "accuracy": [1], "nll": [1]}}, ax="left")
    with pytest.raises(ValueError, match="^ax: expected a matplotlib Axes"):
        plots.scale_search(_searched(), ax=3)


def _inside(child: Any, ax: Any) -> bool:
    """`child`'s drawing area within `ax`'s, as drawn (an inset is placed at draw time)."""
    ax.figure.canvas.draw()
    box, outer = child.get_window_extent(), ax.get_window_extent()
    return (
        box.x0 >= outer.x0 - 0.5
        and box.x1 <= outer.x1 + 0.5
        and box.y0 >= outer.y0 - 0.5
        and box.y1 <= outer.y1 + 0.5
    )


def test_a_reliability_diagram_is_drawn_on_the_given_axes() -> None:
    """As scikit-learn's CalibrationDisplay and netcal: on `ax` itself, not elsewhere in the
    figure; the share of points in an inset of `ax`, inside its area; several methods on one
    Axes a line each, or one Axes per method."""
    fig, (left, right) = _user_figure()
    assert plots.reliability_diagram(_probs(), _labels(), ax=left) is left
    assert fig.axes == [left, right] and not fig.subfigs  # no new panel elsewhere
    assert len(left.patches) >= 5 and left.get_lines()  # the bars, the diagonal
    (band,) = left.child_axes
    assert band.patches and _inside(band, left)  # the share of points, within `ax`
    two = {"raw": _probs(), "sharp": _probs(scale=6.0)}
    assert plots.reliability_diagram(two, _labels(), ax=right) is right
    assert {t.get_text().split(" (")[0] for t in right.get_legend().get_texts()} >= set(two)
    fig, axes = _user_figure()
    assert plots.reliability_diagram(two, _labels(), ax=axes) is axes
    assert list(fig.axes) == list(axes) and all(a.patches and a.child_axes for a in axes)
    with pytest.raises(ValueError, match=r"^ax: expected one Axes or one per method \(2\), got 3"):
        plots.reliability_diagram(two, _labels(), ax=[*axes, axes[0]])


# figures of several panels in a row: (name, call, panels)
ROWS: list[tuple[str, Any, int]] = [
    ("decision_boundaries", lambda **kw: plots.decision_boundaries(
        {**_boundaries()[0], "q": lambda pts: torch.softmax(-pts @ torch.eye(2), -1)},
        *_boundaries()[1:], resolution=8, **kw), 2),
    ("similarity_matrices", lambda **kw: plots.similarity_matrices(
        {"a": _matrix(), "b": _matrix()}, label="cosine", **kw), 2),
    ("radial_landscape", lambda **kw: plots.radial_landscape(_cut(), **kw), 3),
    ("ensemble_size_curves", lambda **kw: plots.ensemble_size_curves(
        {"PEG": {"size": [1, 2], "accuracy": [0.8, 0.82], "nll": [0.5, 0.45]}}, **kw), 2),
]  # fmt: skip


@pytest.mark.parametrize(("name", "call", "n"), ROWS, ids=[r[0] for r in ROWS])
def test_one_axes_per_panel_is_drawn_on(name: str, call: Any, n: int) -> None:
    """Given one Axes per panel, each panel is drawn on its Axes, which stay where they are
    (colour bars aside); the Axes are returned. A count that is not the panels' is refused."""
    fig, axes = _user_figure(n)
    assert call(ax=axes) is axes
    assert all(a in fig.axes and a.has_data() for a in axes) and not fig.subfigs
    assert all(a.get_label() == "<colorbar>" for a in fig.axes if a not in list(axes))
    with pytest.raises(ValueError, match=rf"^ax: expected one Axes, or {n} \(one per panel\)"):
        call(ax=list(_user_figure(n + 1)[1]))


def test_no_figure_enters_pyplots_registry() -> None:
    """pyplot shows the figures it holds at the end of a notebook cell: a returned figure it
    held would be shown twice (netcal #45)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    for _, call, _ in CALLS:
        call()
    assert plt.get_fignums() == before


def test_reliability_from_probabilities_is_the_metrics_diagram() -> None:
    p, y = _probs(), _labels()
    direct = plots.reliability_diagram(p, y, bins=10)
    curves = plots.reliability_diagram({"m": metrics.reliability(p, y, bins=10)})
    title = direct.axes[0].get_title()
    assert title == f"ECE {100 * metrics.ece(p, y, bins=10):.2f}%"
    assert curves.axes[0].get_title() == f"m\n{title}"
    heights = [b.get_height() for b in direct.axes[0].patches]
    assert heights == [b.get_height() for b in curves.axes[0].patches]
    # numpy in, member logits in, a dict of methods: a panel each
    logits = torch.randn(3, 300, 4, generator=torch.Generator().manual_seed(2))
    both = plots.reliability_diagram({"before": p.numpy(), "after": logits}, y.numpy(), title="t")
    tops = [a.get_title() for a in both.axes if a.get_title()]
    assert tops[0].startswith("before\nECE") and tops[1].startswith("after\nECE")
    assert tops[1].endswith(f"{100 * metrics.ece(logits, y):.2f}%")


def test_reliability_keeps_its_positional_curves_form(tmp_path: Path) -> None:
    curves = {"m": metrics.reliability(_probs(), _labels())}
    out = plots.reliability_diagram(curves, tmp_path / "r.png", "a title", 3)
    assert out == tmp_path / "r.png" and out.read_bytes()[:8] == PNG
    out = plots.reliability_diagram(_probs(), _labels(), tmp_path / "p.png", "a title")
    assert out == tmp_path / "p.png"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: plots.reliability_diagram(_probs()), ValueError, "^labels: expected the labels"),
        (lambda: plots.reliability_diagram(_probs(), _labels()[:10]), ValueError,
         r"^labels: expected 300 labels \(N of data\)"),
        (lambda: plots.reliability_diagram({"m": _probs() * math.nan}, _labels()), ValueError,
         r"^data\['m'\]: expected finite"),
        (lambda: plots.reliability_diagram(_probs()[:, 0], _labels()), ValueError, "^data:"),
        (lambda: plots.reliability_diagram(
            {"m": metrics.reliability(_probs(), _labels())}, labels=_labels()), ValueError,
         "^labels: reliability data"),
        (lambda: plots.reliability_diagram(_probs(), _labels(), bins=0), ValueError, "^bins"),
        (lambda: plots.reliability_diagram(_probs(), _labels(), None, None, 5, 1), TypeError,
         "at most 5 positional"),
        (lambda: plots.reliability_diagram(_probs(), _labels(), "a.png", path="b.png"),
         TypeError, "multiple values for argument 'path'"),
        (lambda: plots.diversity_accuracy_plane({"m": {"accuracy": [1], "diversity": [0]}}),
         ValueError, "^reference_accuracy"),
    ],
)  # fmt: skip
def test_reliability_from_probabilities_refuses_bad_input(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


def test_matplotlib_is_not_loaded_with_peg_plots() -> None:
    """In a fresh Python (tests/fresh_imports.py, shared with the other import tests)."""
    from fresh_imports import modules_after

    loaded = modules_after()["import peg.data, peg.metrics, peg.plots"]
    assert "peg.plots" in loaded and "matplotlib" not in loaded
