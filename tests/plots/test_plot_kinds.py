"""Reliability diagrams of binary scorers, multi-label heads and dense predictions: the bins and
ECE of their metrics, the axes named for the kind, a panel per label."""

from __future__ import annotations

import pytest
import torch

from peg import metrics, plots


def _titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_title()]


def _multilabel(n: int = 300, k: int = 3):
    g = torch.Generator().manual_seed(0)
    p = torch.rand(n, k, generator=g, dtype=torch.float64)
    return p, (torch.rand(n, k, generator=g, dtype=torch.float64) < p**2).long()


def test_binary_diagram_shows_the_binary_ece_on_axes_named_for_p():
    p, y = _multilabel()
    p, y = p[:, 0], y[:, 0]
    fig = plots.binary_reliability_diagram(p, y, bins=10)
    assert f"ECE {100 * metrics.binary_ece(p, y, bins=10):.2f}%" in _titles(fig)[0]
    names = {ax.get_xlabel() for ax in fig.axes} | {ax.get_ylabel() for ax in fig.axes}
    assert {"P(y = 1)", "fraction of 1s"} <= names and "accuracy" not in names
    entries = [
        t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()
    ]
    assert "fraction of 1s" in entries and "accuracy" not in entries


def test_multilabel_diagram_pooled_and_a_panel_per_label():
    p, y = _multilabel()
    pooled = plots.multilabel_reliability_diagram(p, y)
    assert f"ECE {100 * metrics.multilabel_ece(p, y):.2f}%" in _titles(pooled)[0]
    per = plots.multilabel_reliability_diagram(p, y, per_label=True, label_names=["a", "b", "c"])
    titles = _titles(per)
    each = metrics.label_ece(p, y)
    assert len(titles) == 3
    for title, name, ece in zip(titles, "abc", each.tolist(), strict=True):
        assert title.startswith(name) and f"ECE {100 * ece:.2f}%" in title
    with pytest.raises(ValueError, match="label_names: expected 3 names"):
        plots.multilabel_reliability_diagram(p, y, per_label=True, label_names=["a"])


def test_dense_diagram_is_the_reliability_of_the_positions_not_ignored():
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(2, 4, 8, 8, generator=g)
    y = torch.randint(0, 4, (2, 8, 8), generator=g)
    y[:, :2] = -100
    fig = plots.dense_reliability_diagram({"model": logits}, y)
    ece = metrics.dense_metrics(logits, y)["ece"]
    assert _titles(fig)[0] == f"model\nECE {100 * ece:.2f}%"
