"""The site's Reference pages, written from the code itself: one per public class and function
of `peg.__all__` and one per `peg` command. scripts/mkdocs_hooks.py adds them to the build as
generated files (docs/reference/ holds none on disk, so they cannot drift from the code);
mkdocs.yml's nav lists each, and tests/test_reference.py checks that it does.

A class's page: its signature, its docstring's summary (the formula and the paper, where the
docstring gives them), one table of its arguments (the default from the signature, what is
accepted from its `parameter_constraints`, the meaning from the docstring's `Args:`), the rest
of the docstring (its `Examples:` as a console session, which tests/test_reference.py runs as
doctests; its `See Also:` as links to the pages named), and its public methods, those of peg's
own plumbing (`INTERNAL`) left out. A command's page: what `peg NAME --help` prints, the
options as a table. `python scripts/reference_pages.py DIR` writes the pages to DIR to read.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FOLDER = "reference"  # under docs/: reference/PEG.md, reference/cli/select.md, ...
SECTION = re.compile(r"^([A-Z][\w' -]*(?:\([^)]*\))?):$")  # "Args (all keyword-only):"
ARGS = ("Args", "Arguments", "Parameters")
ITEM = re.compile(r"^(\*{0,2}[A-Za-z_][\w]*(?:, *\*{0,2}[A-Za-z_]\w*)*):\s*(.*)$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+\1")
# the objects returned by public ones, with a page of their own: {name: module}
RETURNED = {
    "Estimate": "peg.methods.estimation",
    "ChunkResult": "peg.apps.monitor",
    "Alert": "peg.apps.monitor",
}
# public methods that are peg's own plumbing, not the user's (by where they are defined):
# the calibrators' map of logits, the conformal sets' pieces, the monitor's streamed estimate
INTERNAL = {
    "Calibrator.scale",
    "ConformalClassifier.label_scores",
    "ConformalClassifier.sets_fn",
    "ConformalClassifier.sets_of",
    "Laplace.posterior_tensors",
    "PerformanceEstimator.add",
    "PerformanceEstimator.batches",
    "PerformanceEstimator.read",
    "PerformanceEstimator.summary",
    "PerturbationEnsemble.searches",
    "SWAG.method_name",
    "ScaleSearch.criterion_name",
    "ScaleSearch.recorded",
}
SEE_ALSO = re.compile(r"^(peg\.(\w+)|docs/([\w./-]+\.md)(#[\w-]+)?)\s*:\s*(.*)$")


def public() -> dict[str, Any]:
    """`peg.__all__`'s classes and functions by name (modules and `__version__` aside)."""
    import peg

    return {
        name: obj
        for name in peg.__all__
        if inspect.isclass(obj := getattr(peg, name)) or inspect.isfunction(obj)
    }


def returned() -> dict[str, Any]:
    """`RETURNED`'s classes by name."""
    import importlib

    return {name: getattr(importlib.import_module(m), name) for name, m in RETURNED.items()}


def dotted(name: str) -> str:
    """How a page names its object: `peg.NAME`, or its module's path for a returned object."""
    return f"{RETURNED[name]}.{name}" if name in RETURNED else f"peg.{name}"


def kind(obj: Any) -> str:
    """The nav group of a public name: errors, functions and classes apart."""
    if inspect.isclass(obj) and issubclass(obj, Exception):
        return "Exceptions"
    return "Functions" if inspect.isfunction(obj) else "Classes"


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every `peg` command's own parser, in `peg --help`'s order."""
    from peg.apps.cli import COMMANDS, parser

    top = parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub.choices[name] for name in COMMANDS}


def page_path(name: str) -> str:
    return f"{FOLDER}/{name}.md"


def command_path(name: str) -> str:
    return f"{FOLDER}/cli/{name}.md"


def pages() -> dict[str, str]:
    """Every reference page: its path under docs/ and its Markdown."""
    from peg.apps.cli import COMMANDS

    out = {page_path(name): object_page(name, obj) for name, obj in (public() | returned()).items()}
    for name, p in commands().items():
        out[command_path(name)] = command_page(name, COMMANDS[name].help, p)
    out[f"{FOLDER}/index.md"] = index_page()
    return out


# ----------------------------------------------------------------------------- docstrings
def escape(text: str) -> str:
    """Markdown-safe prose: `<` outside code spans is not an HTML tag (`<name>.txt`)."""
    parts, last = [], 0
    for m in CODE_SPAN.finditer(text):
        parts += [text[last : m.start()].replace("<", "&lt;"), m.group(0)]
        last = m.end()
    return "".join(parts) + text[last:].replace("<", "&lt;")


def cell(text: str) -> str:
    """One table cell: one line, its `|` escaped."""
    return escape(" ".join(text.split())).replace("|", "\\|") or " "


def split_doc(doc: str) -> tuple[list[str], dict[str, str], list[tuple[str, list[str]]]]:
    """A docstring as (summary lines, {argument: meaning}, [(section title, its lines)]).

    The summary runs to the first blank line; `Args:`-like sections become the meanings (one
    item, `a, b: meaning`, names several arguments); every other section keeps its lines, the
    prose between sections a section titled ""."""
    from peg.methods.base import ACCEPTED

    # the table itself is rendered from `parameter_constraints`: its section dropped, not what
    # follows it (sections added to the docstring after the class was made: examples)
    head, found, tail = doc.partition(ACCEPTED)
    rest = tail.splitlines()[1:]
    while found and rest and (not rest[0].strip() or rest[0].startswith(" " * 8)):
        rest.pop(0)
    doc = head.rstrip(" ") + "\n".join(rest)
    first, _, rest = doc.strip("\n").partition("\n")
    lines = [first.strip(), *textwrap.dedent(rest).splitlines()]
    end = lines.index("") if "" in lines else len(lines)
    summary, body = lines[:end], lines[end:]
    meanings: dict[str, str] = {}
    sections: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(body):
        m = SECTION.match(body[i])
        if not m:
            if not sections or sections[-1][0]:
                sections.append(("", []))
            sections[-1][1].append(body[i])
            i += 1
            continue
        j = i + 1
        while j < len(body) and (not body[j].strip() or body[j].startswith(" ")):
            j += 1
        inner = textwrap.dedent("\n".join(body[i + 1 : j])).splitlines()
        if m.group(1).split(" (")[0] in ARGS:
            meanings.update(items(inner))
        else:
            sections.append((m.group(1), inner))
        i = j
    return summary, meanings, sections


def items(lines: list[str]) -> dict[str, str]:
    """`name: meaning` items (continuation lines indented), each name of `a, b: ...` apart."""
    out: dict[str, str] = {}
    names: list[str] = []
    for line in lines:
        m = ITEM.match(line)
        if m and not line.startswith(" "):
            names = [n.strip().lstrip("*") for n in m.group(1).split(",")]
            for n in names:
                out[n] = m.group(2).strip()
        elif line.strip():
            for n in names:
                out[n] += " " + line.strip()
    return out


def prose(lines: list[str]) -> str:
    return escape(textwrap.dedent("\n".join(lines)).strip("\n"))


def section(lines: list[str]) -> str:
    """A titled section: its `name: meaning` items as a list, or its prose as it is."""
    listed = items(lines)
    if not listed or not all(ITEM.match(x) for x in lines if x.strip() and not x[0].isspace()):
        return prose(lines)
    return "\n".join(
        f"- `{name}`: {escape(' '.join(text.split()))}" for name, text in listed.items()
    )


# ----------------------------------------------------------------------------- classes
def parameter(p: inspect.Parameter) -> str:
    """`name: annotation = default`, the annotation as written (not a quoted string)."""
    text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
    if p.annotation is not p.empty:
        ann = p.annotation
        text += f": {ann if isinstance(ann, str) else inspect.formatannotation(ann)}"
    return text if p.default is p.empty else f"{text} = {default(p)}"


def default(p: inspect.Parameter) -> str:
    """A default as written: a dataclass field's factory as the value it makes."""
    if repr(p.default) == "<factory>" and p.annotation is not p.empty:
        return f"{str(p.annotation).split('[')[0]}()"
    return repr(p.default)


def signature(name: str, obj: Any) -> str:
    try:
        values = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return f"{dotted(name)}(...)"
    params: list[str] = []
    for i, p in enumerate(values):
        if p.kind is p.KEYWORD_ONLY and (i == 0 or values[i - 1].kind is p.POSITIONAL_OR_KEYWORD):
            params.append("*")
        params.append(parameter(p))
    one = f"{dotted(name)}({', '.join(params)})"
    return (
        one
        if len(one) <= 88
        else f"{dotted(name)}(\n" + "".join(f"    {p},\n" for p in params) + ")"
    )


def arguments(obj: Any, meanings: dict[str, str]) -> list[str]:
    """The argument table: default (signature), accepts (`parameter_constraints`), meaning."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        params = [
            p
            for p in inspect.signature(target).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    table = getattr(obj, "parameter_constraints", {}) if inspect.isclass(obj) else {}
    if not params and not meanings:
        return []
    head = ["| Argument | Default | Accepts | Meaning |", "|---|---|---|---|"]
    if not table:
        head = ["| Argument | Default | Meaning |", "|---|---|---|"]
    rows, seen = [], set()
    for p in params:
        seen.add(p.name)
        default_ = "required" if p.default is p.empty else f"`{default(p)}`"
        accepts = [cell(str(table[p.name]))] if p.name in table else ([" "] if table else [])
        rows.append([f"`{p.name}`", default_, *accepts, cell(meanings.get(p.name, ""))])
    for n, meaning in meanings.items():  # named in the docstring, not in the signature
        if n not in seen:
            rows.append([f"`{n}`", " ", *([" "] if table else []), cell(meaning)])
    return ["## Arguments", "", *head, *("| " + " | ".join(r) + " |" for r in rows), ""]


def methods(obj: Any) -> Iterator[str]:
    """`- name(signature)`: the first line of each public method's docstring."""
    for n, member in inspect.getmembers(obj):
        if n.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        defined = member.fget if isinstance(member, property) else member
        if getattr(defined, "__qualname__", "") in INTERNAL:
            continue
        doc = (inspect.getdoc(member) or "").strip().split("\n\n")[0].replace("\n", " ")
        if isinstance(member, property):
            yield f"- `{n}` (property): {escape(doc)}"
            continue
        try:
            params = list(inspect.signature(member).parameters.values())[1:]
            args = ", ".join(parameter(p) for p in params)
        except (TypeError, ValueError):
            args = "..."
        yield f"- `{n}({args})`" + (f": {escape(doc)}" if doc else "")


def object_page(name: str, obj: Any) -> str:
    summary, meanings, sections = split_doc(obj.__doc__ or "")
    if dataclasses.is_dataclass(obj) and not meanings:  # its fields are its arguments
        fields = [lines for title, lines in sections if title == "Attributes"]
        meanings = items(textwrap.dedent("\n".join(fields[0])).splitlines()) if fields else {}
        sections = [(t, lines) for t, lines in sections if t != "Attributes"]
    module = getattr(obj, "__module__", "peg")
    out = [f"# {dotted(name)}", "", "```python", signature(name, obj), "```", ""]
    what = {"Classes": "class", "Functions": "function", "Exceptions": "exception"}[kind(obj)]
    out += [f"*{what} in `{module}`*", "", prose(summary), ""]
    if name in RETURNED:
        by = [f"`peg.{n}`" for n, o in public().items() if name in _returns(o)]
        out += [f"Returned by {', '.join(by)}.", ""] if by else []
    out += arguments(obj, meanings)
    for title, lines in sections:
        if title == "Examples":
            out += [
                "## Examples",
                "",
                "```pycon",
                textwrap.dedent("\n".join(lines)).strip(),
                "```",
                "",
            ]
        elif title == "See Also":
            out += ["## See also", "", see_also(lines), ""]
        elif text := section(lines) if title else prose(lines):
            out += ([f"**{escape(title)}:**", ""] if title else []) + [text, ""]
    if inspect.isclass(obj) and not issubclass(obj, Exception):
        listed = list(methods(obj))
        if listed:
            out += ["## Methods", "", *listed, ""]
    return "\n".join(out)


def _returns(obj: Any) -> str:
    """The text of the return annotations of `obj` and of its methods."""
    found = [obj, *(m for _, m in inspect.getmembers(obj, inspect.isfunction))]
    return " ".join(str(getattr(f, "__annotations__", {}).get("return", "")) for f in found)


def see_also(lines: list[str]) -> str:
    """`See Also:` items, `peg.NAME: why` or `docs/PAGE.md#anchor: why`, as a list of links to
    those pages (from reference/NAME.md); any other line as it is."""
    out: list[str] = []
    for line in textwrap.dedent("\n".join(lines)).splitlines():
        m = SEE_ALSO.match(line)
        if line.startswith(" ") and out:
            out[-1] += " " + escape(line.strip())
        elif m and m.group(2):
            name = m.group(2)
            out.append(f"- [`{dotted(name)}`]({name}.md): {escape(m.group(5))}")
        elif m:
            title = m.group(3).removesuffix(".md")
            target = f"../{m.group(3)}{m.group(4) or ''}"
            out.append(f"- [{title} guide]({target}): {escape(m.group(5))}")
        elif line.strip():
            out.append(escape(line.strip()))
    return "\n".join(out)


# ----------------------------------------------------------------------------- commands
def command_page(name: str, help: str, p: argparse.ArgumentParser) -> str:
    """What `peg NAME --help` prints, its options as a table."""
    usage = p.format_usage().replace("usage: ", "", 1).strip()
    rows = []
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        flags = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.dest}` (positional)"
        shown = a.default is not None and a.default is not False and a.default != argparse.SUPPRESS
        default = f"`{a.default!r}`" if shown else ""
        choices = ", ".join(f"`{c}`" for c in a.choices) if a.choices else ""
        rows.append(f"| {flags} | {default or ' '} | {choices or ' '} | {cell(a.help or '')} |")
    return "\n".join([
        f"# peg {name}", "", escape(help[0].upper() + help[1:]) + ".", "",
        "```text", usage, "```", "", escape(p.description or ""), "",
        "## Options", "", "| Option | Default | Choices | Meaning |", "|---|---|---|---|", *rows,
        "", f"`peg {name} --help` prints the same.", "",
    ])  # fmt: skip


def index_page() -> str:
    out = [
        "# Reference",
        "",
        "Written from the code at each build: the docstrings, the argument tables the classes",
        "check (`parameter_constraints`) and the `peg` parsers. The guides say when and why.",
        "",
    ]
    groups: dict[str, list[str]] = {}
    for name, obj in (public() | returned()).items():
        line = (obj.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        group = "Returned objects" if name in RETURNED else kind(obj)
        groups.setdefault(group, []).append(f"- [{dotted(name)}]({name}.md): {escape(line)}")
    for title in ("Classes", "Functions", "Returned objects", "Exceptions"):
        out += [f"## {title}", "", *groups.get(title, []), ""]
    from peg.apps.cli import COMMANDS

    out += ["## Commands", ""]
    out += [f"- [peg {n}](cli/{n}.md): {escape(c.help)}" for n, c in COMMANDS.items()]
    return "\n".join([*out, ""])


def main(argv: list[str] | None = None) -> int:
    """Write the pages to a folder, to read them without building the site."""
    out = Path((argv if argv is not None else sys.argv[1:] or ["reference-pages"])[0])
    for path, text in pages().items():
        target = out / Path(path).relative_to(FOLDER)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    print(f"{len(pages())} pages in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
