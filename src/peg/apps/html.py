"""What `peg.compare`'s `Comparison` and `AutoSelect` share to be read outside a terminal: in a
notebook (`_repr_html_`, `_repr_markdown_`), as a data frame (`to_pandas`), as a table of text
(`to_text`: markdown, CSV or JSON: `peg compare/select --format`) and as one file to send
(`to_html`: `peg compare/select --html`'s `report.html`).

Each class says what it shows once, as a `Report` (`_report()`): its title, its markdown, its
rows as flat records, and the HTML of its sections, with or without figures; the rest is here.
The one-file report is `peg.utils.html.page`: its figures embedded as PNG (`data:` URIs), no
network, no script, every name escaped; a notebook's block is the same sections without the
figures (drawing them takes a while, and `peg.plots` draws them on demand).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peg.apps.results import json_ready
from peg.utils import html as _html
from peg.utils.html import Markup
from peg.utils.io import atomic_write_text

FORMATS = ("md", "csv", "json")  # `--format`
REPORT = "report.html"  # `--html`'s file, in the results folder
CSV = "results.csv"  # `--format csv`'s


@dataclass
class Report:
    """What a result shows: `title`, `markdown` (its `to_markdown()`), `records` (one flat
    dict per row, keyed by `index`'s column first), `sections(figures) -> [HTML]`, `doc` (the
    reference page the notebook's "?" links to) and `verdict` (the answer, where there is one:
    `peg.apps.verdict.Verdict`; a data frame's `attrs["verdict"]`)."""

    title: str
    markdown: str
    records: list[dict[str, Any]]
    index: str
    sections: Callable[[bool], list[Markup]]
    doc: str | None = None
    verdict: Any = None


def verdict_html(said: Any) -> Markup:
    """The verdict line (`peg.apps.verdict.Verdict`) as the report's first paragraph, tinted by
    what it says: green a real improvement, amber no real difference, red worse."""
    tint = {"worse": " peg-worse", "same": " peg-same", "unknown": " peg-same"}
    return paragraph(said.text(), "peg-verdict" + tint.get(said.judgement(), ""))


class Reported:
    """`_repr_html_`, `_repr_markdown_`, `to_pandas`, `to_text` and `to_html` from `_report()`
    (see the module doc); where `_reportable()` is False (an AutoSelect not fitted yet) the
    notebook forms are those of the next class in line."""

    def _report(self) -> Report:
        raise NotImplementedError

    def _reportable(self) -> bool:
        return True

    def _repr_html_(self) -> str:
        if not self._reportable():
            return str(super()._repr_html_())  # the next class's (a method's: `Display`)
        report = self._report()
        title = _html.element("h2", report.title)
        if report.doc is not None:  # the "?" to the reference page, as scikit-learn's
            title = _html.element("h2", _html.join([report.title, _html.doc_link(report.doc)]))
        return str(_html.block([title, *report.sections(False)]))

    def _repr_markdown_(self) -> str:
        if not self._reportable():
            return str(super()._repr_markdown_())
        return self._report().markdown

    def to_pandas(self) -> Any:
        """The table as a `pandas.DataFrame`, a row per record, indexed by the report's index
        column (a method for `compare` and AutoSelect, a chunk for `Monitor`), NaN wherever a
        value is missing, the verdict (where there is one) in `frame.attrs["verdict"]`; pandas is
        not a dependency of peg: an ImportError saying how to install it where it is missing."""
        try:
            import pandas
        except ImportError:
            raise ImportError(
                f"{type(self).__name__}.to_pandas needs pandas, which is not installed: "
                "pip install pandas (or use .to_text('csv'), .to_markdown(), .table)"
            ) from None
        report = self._report()
        frame = pandas.DataFrame.from_records(report.records).set_index(report.index)
        # one missing value, NaN (None in a text column too), numbers as numbers
        frame = frame.astype(object).where(frame.notna(), float("nan")).infer_objects()
        if report.verdict is not None:
            frame.attrs["verdict"] = report.verdict.text()
        return frame

    def to_text(self, format: str = "md") -> str:
        """The table as text: "md" (`to_markdown()`), "csv" (a row per record, every column,
        fractions as in results.json) or "json" (those rows as a JSON list)."""
        if format not in FORMATS:
            raise ValueError(f"format: expected one of {list(FORMATS)}, got {format!r}")
        report = self._report()
        if format == "md":
            return report.markdown
        if format == "json":
            return json.dumps(json_ready(report.records), indent=2, allow_nan=False) + "\n"
        return to_csv(report.records)

    def to_html(self, path: str | os.PathLike[str] | None = None) -> str | Path:
        """One self-contained HTML file: the tables, the reliability diagrams (PNG embedded),
        the notes; nothing it needs is fetched (no network, no external CSS or script).

        Args:
            path: where to write it (UTF-8, atomically: `peg.utils.io`), or None.

        Returns:
            the HTML text when `path` is None, else `Path(path)`.
        """
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a file path or None, got {type(path).__name__}")
        if path is not None:
            check_target(Path(path), "path")  # before drawing the figures
        report = self._report()
        text = _html.page(report.title, [_html.element("h1", report.title), *report.sections(True)])
        if path is None:
            return text
        atomic_write_text(path, text)
        return Path(path)


def to_csv(records: Sequence[Mapping[str, Any]]) -> str:
    """Records as CSV: every key any record has, in the order first met; empty cells where a
    record lacks one or holds None; lists and dicts as JSON; every text cell (the header
    included) through `csv_text`, numbers as they are."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([csv_text(str(k)) for k in columns])
    for r in records:
        writer.writerow([_csv_cell(r.get(k)) for k in columns])
    return out.getvalue()


# what a spreadsheet reads as the start of a formula (OWASP's CSV injection list)
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_text(text: str) -> str:
    """A text cell a spreadsheet will not run: one that begins as a formula (`FORMULA`) is
    prefixed with a single quote (OWASP's neutralisation); other text as it is."""
    return "'" + text if text.startswith(FORMULA) else text


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(json_ready(value), allow_nan=False)
    if isinstance(value, str):
        return csv_text(value)
    return value


def check_target(path: Path, argument: str) -> Path:
    """`path` where a file can be written: an IsADirectoryError naming `argument` where it is a
    folder (checked before any work by the command line's `--html`)."""
    if path.is_dir():
        raise IsADirectoryError(
            f"{argument}: {path} is a folder, where the report would be written: move it away "
            "or give another folder"
        )
    return path


def figure_html(draw: Callable[[], Any], alt: str) -> Markup:
    """A figure drawn by `draw()` (a `peg.plots` function returning a new Figure), embedded."""
    from peg.plots._figure import png_bytes

    return _html.png(png_bytes(draw()), alt)


def paragraph(text: Any, css: str = "peg-note") -> Markup:
    return _html.element("p", text, css)


def section(title: str, *parts: Any) -> Markup:
    """A heading and its parts (HTML, or text to escape)."""
    return _html.join([_html.element("h2", title), *parts], "\n")


# ---------------------------------------------------------------- the command line's options
def add_options(parser: Any, folder: str) -> None:
    """`--format` and `--html` of `peg compare` and `peg select` (`folder`: their results
    folder's option)."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="md",
        help=f"the table printed; csv also writes it as {CSV} in {folder} (default: md)",
    )
    parser.add_argument(
        "--html",
        action="store_true",
        help=f"also write {REPORT} in {folder}: one self-contained file (tables, figures), to "
        "open in a browser or send",
    )


def check_options(args: Any, folder: str | None, option: str) -> None:
    """`--html` and `--format csv` checked before any work: a folder to write in (`option`),
    and no folder where their files go."""
    if args.html and folder is None:
        raise ValueError(f"--html: needs {option} DIR, the folder report.html is written in")
    wanted = ((args.html, REPORT, "--html"), (args.format == "csv", CSV, "--format"))
    for asked, name, flag in wanted:
        if asked and folder is not None:
            check_target(Path(folder) / name, flag)


def write_options(result: Reported, folder: str | None, args: Any, application: str) -> None:
    """What `--format csv` and `--html` write in `folder` (atomically, UTF-8), said."""
    if folder is None:
        return
    written = []
    if args.format == "csv":
        written.append(Path(folder) / CSV)
        atomic_write_text(written[-1], result.to_text("csv"))
    if args.html:
        written.append(Path(result.to_html(Path(folder) / REPORT)))
    if written:
        print(f"{application}: wrote {', '.join(str(p) for p in written)}")
