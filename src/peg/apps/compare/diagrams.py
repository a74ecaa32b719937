"""`Comparison`'s reliability diagrams: one per labelled set some method was scored on, as PNG
files of a results folder (`figure_name`: one safe file name per set) and embedded in its HTML
page."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from peg import plots
from peg.apps.html import figure_html, paragraph, section
from peg.utils import html as _html

Curves = Mapping[str, Mapping[str, Any]]  # data set → method name → reliability data


def _drawn(curves: Curves, sets: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, Any, str]]:
    """(set, its curves, the figure's title) of every set with a curve: a set where every method
    failed has no figure to draw."""
    for name, drawn in curves.items():
        if drawn and name in sets:
            yield name, drawn, f"Reliability on {name} ({sets[name]['points']} points)"


def plot(curves: Curves, sets: Mapping[str, Mapping[str, Any]], folder: str | Path) -> list[Path]:
    """`folder/<figure_name(set)>` per labelled set (`peg.plots.reliability_diagram`); the
    paths."""
    return [
        plots.reliability_diagram(drawn, Path(folder) / figure_name(name), title=title)
        for name, drawn, title in _drawn(curves, sets)
    ]


def embedded(curves: Curves, sets: Mapping[str, Mapping[str, Any]]) -> list[_html.Markup]:
    """The reliability diagrams of every labelled set, embedded: one HTML section, or none."""
    parts = [
        figure_html(lambda c=drawn, t=title: plots.reliability_diagram(c, title=t), title)
        for _, drawn, title in _drawn(curves, sets)
    ]
    if not parts:
        return []
    said = (
        "Before: Model, the model as it is; after: every other method."
        if any("Model" in c for c in curves.values())
        else "One panel per method."
    )
    return [section("Reliability diagrams", paragraph(said), *parts)]


def figure_name(name: str) -> str:
    """The file name of the reliability diagram of set `name`, one per name: a plain name
    (lower-case ASCII letters, digits, `-_.`) as it is; any other (`a/b` next to `a_b`, `A`
    next to `a` on a disk that ignores case, a long name) shortened and made safe, with a
    hash of the whole name after it."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in name)
    if safe == name.lower() == name and 0 < len(name) <= 64:
        return f"reliability-{name}.png"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"reliability-{safe[:64]}-{digest}.png"
