"""HTML without a template engine: every piece of text goes through `text` (`html.escape`,
quotes included) where it is put into the page, so a method, data set, class or metric name
never becomes markup; the few pieces of markup made here are built from escaped parts.

A block (`block`: a notebook's `_repr_html_`) carries its own `<style>`, every rule scoped to
the block's unique id (`new_id`), so two blocks, or a block and the notebook's own CSS, never
restyle each other. Colours are inherited or half-transparent greys and tints, readable on
light and dark themes alike (scikit-learn's display was unreadable in dark themes, its
#30357); figures are PNGs with their own white background. `page` is a whole standalone
document: UTF-8, no network (no external CSS, script, font or image), `color-scheme: light
dark`. `md` is the one escaping of a name put into markdown (a table cell, a line): every
character markdown reads as markup backslash-escaped, line breaks as spaces, so a name never
adds a row, a column or emphasis. `doc_link` is the "?" of a notebook block (as scikit-learn's):
the class's reference page under `DOCS_URL`.
"""

from __future__ import annotations

import base64
import html
import os
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

STYLE = """
#{id} {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; font-size: 13px;
  line-height: 1.45; color: inherit; }}
#{id} h1 {{ font-size: 1.5em; margin: 0.4em 0; }}
#{id} h2 {{ font-size: 1.2em; margin: 1.2em 0 0.4em; }}
#{id} .peg-head {{ font-size: 1.1em; margin-bottom: 0.4em; }}
#{id} .peg-name {{ font-weight: 600; font-family: ui-monospace, Menlo, Consolas, monospace; }}
#{id} .peg-badge {{ display: inline-block; padding: 0 0.5em; margin-left: 0.5em;
  border-radius: 0.8em; font-size: 0.85em; border: 1px solid; }}
#{id} .peg-fitted {{ background: rgba(46, 160, 67, 0.18); border-color: rgba(46, 160, 67, 0.7); }}
#{id} .peg-unfitted {{ background: rgba(210, 153, 34, 0.18);
  border-color: rgba(210, 153, 34, 0.8); }}
#{id} table.peg-table {{ border-collapse: collapse; margin: 0.4em 0 0.8em; color: inherit;
  background: transparent; }}
#{id} table.peg-table caption {{ text-align: left; font-weight: 600; padding: 0.2em 0;
  white-space: nowrap; }}
#{id} details summary {{ cursor: pointer; margin: 0.3em 0; }}
#{id} table.peg-table th, #{id} table.peg-table td {{ padding: 0.25em 0.7em;
  border: 1px solid rgba(127, 127, 127, 0.35); vertical-align: top; text-align: left; }}
#{id} table.peg-table th {{ background: rgba(127, 127, 127, 0.14); }}
#{id} table.peg-table td.peg-num {{ text-align: right; font-variant-numeric: tabular-nums;
  white-space: nowrap; }}
#{id} table.peg-table tr.peg-chosen td {{ background: rgba(46, 160, 67, 0.14); }}
#{id} table.peg-table tr.peg-alert td {{ background: rgba(218, 54, 51, 0.16); }}
#{id} .peg-set {{ font-weight: 600; }}
#{id} .peg-verdict {{ font-size: 1.1em; font-weight: 600; padding: 0.5em 0.8em;
  margin: 0.4em 0 0.8em; border-radius: 4px; border-left: 5px solid rgba(46, 160, 67, 0.9);
  background: rgba(46, 160, 67, 0.16); max-width: 70em; }}
#{id} .peg-verdict.peg-same {{ border-left-color: rgba(210, 153, 34, 0.9);
  background: rgba(210, 153, 34, 0.16); }}
#{id} .peg-verdict.peg-worse {{ border-left-color: rgba(218, 54, 51, 0.95);
  background: rgba(218, 54, 51, 0.16); }}
#{id} a.peg-doc {{ display: inline-block; width: 1.2em; height: 1.2em; line-height: 1.2em;
  margin-left: 0.5em; text-align: center; border-radius: 50%; border: 1px solid;
  font-size: 0.8em; text-decoration: none; color: inherit; opacity: 0.7; }}
#{id} .peg-note {{ opacity: 0.85; max-width: 60em; }}
#{id} .peg-figure {{ margin: 0.5em 0 1em; }}
#{id} .peg-figure img {{ max-width: 100%; height: auto; border-radius: 4px; }}
#{id} details pre {{ white-space: pre-wrap; font-size: 0.9em; padding: 0.6em;
  background: rgba(127, 127, 127, 0.1); border-radius: 4px; }}
"""


class Markup(str):
    """HTML made here from escaped parts: put into a page as it is (any other `str` is text)."""


def text(value: Any) -> str:
    """`value` as text safe anywhere in HTML, in an element or an attribute."""
    return html.escape(str(value), quote=True)


def inline(value: Any) -> str:
    """`value` as HTML: markup as it is, anything else escaped."""
    return value if isinstance(value, Markup) else text(value)


def new_id(prefix: str = "peg") -> str:
    """An id no other block shares: its CSS applies to it alone."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def element(tag: str, content: Any, css: str = "") -> Markup:
    """`<tag class="css">content</tag>`, the content escaped unless it is `Markup`."""
    attributes = f' class="{text(css)}"' if css else ""
    return Markup(f"<{tag}{attributes}>{inline(content)}</{tag}>")


def strong(value: Any) -> Markup:
    return element("strong", value)


def join(parts: Iterable[Any], sep: str = "") -> Markup:
    """Parts (escaped unless `Markup`) one after the other."""
    return Markup(sep.join(inline(p) for p in parts))


def table(
    header: Sequence[Any],
    rows: Sequence[Sequence[Any]],
    *,
    numeric: Sequence[bool] | None = None,
    caption: Any = None,
    marked: Sequence[bool] | None = None,
    alerted: Sequence[bool] | None = None,
) -> Markup:
    """A table: `header` cells, then `rows` (each cell escaped unless `Markup`); `numeric`
    columns right-aligned; rows where `marked` is true highlighted green (a chosen candidate),
    rows where `alerted` is true red (a monitored chunk that alerted)."""
    numeric = numeric or [False] * len(header)
    lines = ['<table class="peg-table">']
    if caption is not None:
        lines.append(f"<caption>{inline(caption)}</caption>")
    lines.append("<thead><tr>" + "".join(f"<th>{inline(h)}</th>" for h in header) + "</tr></thead>")
    lines.append("<tbody>")
    for i, row in enumerate(rows):
        css = ' class="peg-chosen"' if marked is not None and marked[i] else ""
        css = ' class="peg-alert"' if alerted is not None and alerted[i] else css
        cells = "".join(
            f'<td class="peg-num">{inline(c)}</td>' if numeric[j] else f"<td>{inline(c)}</td>"
            for j, c in enumerate(row)
        )
        lines.append(f"<tr{css}>{cells}</tr>")
    lines.append("</tbody></table>")
    return Markup("\n".join(lines))


def png(data: bytes, alt: str) -> Markup:
    """An image embedded in the page itself (a `data:` URI: nothing fetched)."""
    encoded = base64.b64encode(data).decode("ascii")
    return Markup(
        f'<div class="peg-figure"><img alt="{text(alt)}" '
        f'src="data:image/png;base64,{encoded}"></div>'
    )


def block(body: Iterable[Any], block_id: str | None = None) -> Markup:
    """A self-styled block (a notebook cell's output): its CSS scoped to its own id."""
    block_id = block_id or new_id()
    style = STYLE.format(id=block_id)
    return Markup(
        f'<div id="{text(block_id)}"><style>{style}</style>\n{join(body, chr(10))}\n</div>'
    )


def page(title: str, body: Iterable[Any]) -> str:
    """A whole standalone HTML document (UTF-8; nothing outside it is loaded)."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="color-scheme" content="light dark">\n'
        f"<title>{text(title)}</title>\n"
        "<style>body { margin: 1.5em auto; max-width: 90em; padding: 0 1em; "
        "background: Canvas; color: CanvasText; }</style>\n"
        f"</head>\n<body>\n{block(body)}\n</body>\n</html>\n"
    )


# what markdown may read as markup anywhere in a line (GFM tables: `|`; `[` opens a link, `<`
# HTML or an autolink, `_` emphasis only where it can open one: not inside a word, as
# n_classes_); each is backslash-escaped, which every CommonMark reader shows as the character
MARKUP = re.compile(r"([\\`*\[<|~&]|(?<![0-9A-Za-z])_(?=\S))")
# the environment variable of `DOCS_URL`: where the documentation site is served
DOCS_ENV = "PEG_DOCS_URL"
# the reference pages' folder (mkdocs.yml: reference/<Name>.html, use_directory_urls: false);
# relative unless PEG_DOCS_URL names the served site
DOCS_URL = os.environ.get(DOCS_ENV, "reference/")


def md(value: Any) -> str:
    """`value` as text in markdown (a table cell, a line): its markup characters escaped, line
    breaks and tabs as spaces (a name with `|` or a newline never adds a column or a row)."""
    flat = " ".join(str(value).replace("\t", " ").splitlines())
    return MARKUP.sub(r"\\\1", flat)


def md_code(value: Any) -> str:
    """`value` as a code span in markdown: fenced by more backticks than any run inside it
    (padded where it begins or ends with one), `|` escaped (GFM splits a table's cells first),
    line breaks as spaces."""
    flat = " ".join(str(value).replace("\t", " ").splitlines()).replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall("`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def doc_link(page: str) -> Markup:
    """The "?" linking to the reference page `page` (e.g. "TemperatureScaling") under
    `DOCS_URL`."""
    base = DOCS_URL if DOCS_URL.endswith("/") else DOCS_URL + "/"
    href = f"{base}{page}.html"
    return Markup(
        f'<a class="peg-doc" href="{text(href)}" title="Documentation of {text(page)}" '
        'target="_blank" rel="noopener">?</a>'
    )
