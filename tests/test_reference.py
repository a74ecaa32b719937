"""The site's Reference: a page per public class and function (`peg.__all__`) and per `peg`
command, written from the code by scripts/reference_pages.py, each listed in mkdocs.yml's nav,
each argument in its table; and the site, those pages included, builds with --strict."""

from __future__ import annotations

import doctest
import importlib.util
import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import peg
from peg.apps.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "reference_pages", ROOT / "scripts/reference_pages.py"
)
assert _spec is not None and _spec.loader is not None
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

PAGES = reference.pages()
NAV = set(re.findall(r":\s*(reference/\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
PUBLIC = [
    name
    for name in peg.__all__
    if inspect.isclass(getattr(peg, name)) or inspect.isfunction(getattr(peg, name))
]


def test_every_public_class_and_function_has_a_page_in_the_nav():
    assert {"PEG", "TemperatureScaling", "AutoSelect", "compare", "Monitor"} <= set(PUBLIC)
    for name in PUBLIC:
        path = reference.page_path(name)
        assert path in PAGES, f"peg.{name}: no reference page"
        assert path in NAV, f"peg.{name}: {path} is not in mkdocs.yml's Reference nav"


def test_every_command_has_a_page_in_the_nav():
    for name in COMMANDS:
        path = reference.command_path(name)
        assert path in PAGES, f"peg {name}: no reference page"
        assert path in NAV, f"peg {name}: {path} is not in mkdocs.yml's Reference nav"


def test_the_objects_public_ones_return_have_a_page_in_the_nav():
    for name in reference.RETURNED:
        path = reference.page_path(name)
        assert path in PAGES and path in NAV, f"{name}: no reference page in the nav"
    assert "Returned by `peg.PerformanceEstimator`" in PAGES[reference.page_path("Estimate")]


def test_the_nav_lists_no_page_that_is_not_made():
    assert set(PAGES) >= NAV, f"in the nav, not made: {sorted(NAV - set(PAGES))}"


@pytest.mark.parametrize("name", ["PEG", "TemperatureScaling", "ConformalClassifier", "evaluate"])
def test_a_page_has_every_argument_with_its_default_and_meaning(name):
    obj = getattr(peg, name)
    target = obj.__init__ if inspect.isclass(obj) else obj
    text = PAGES[reference.page_path(name)]
    table = getattr(obj, "parameter_constraints", {})
    for p in inspect.signature(target).parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        row = next((r for r in text.splitlines() if r.startswith(f"| `{p.name}` |")), None)
        assert row is not None, f"peg.{name}: no row for {p.name}"
        default = "required" if p.default is p.empty else f"`{p.default!r}`"
        assert f"| {default} |" in row, f"peg.{name}.{p.name}: default {default} not in {row}"
        if p.name in table:  # what the class's own check accepts, as it says it
            assert reference.cell(str(table[p.name])) in row


MAIN = [  # (name, its paper, a piece of its formula)
    ("PEG", "PEG paper", "θ − η·∇L(θ; Bᵢ)"),
    ("PEP", "Mehrtash", "θ + σ·εᵢ"),
    ("TemperatureScaling", "Guo et al. 2017", "softmax(log p̄ / T)"),
    ("ConformalClassifier", "Angelopoulos", "(1 − α)"),
    ("AutoSelect", "one-SE rule", "one paired standard error"),
]


@pytest.mark.parametrize(("name", "paper", "formula"), MAIN)
def test_the_main_classes_give_their_formula_and_paper(name, paper, formula):
    summary = PAGES[reference.page_path(name)].split("## Arguments")[0]
    assert paper in summary and formula in summary, f"peg.{name}: no formula or paper"


EXAMPLED = ["TemperatureScaling", "AutoSelect", "compare", "PEG", "PerformanceEstimator",
            "Monitor", "ConformalClassifier", "Estimate"]  # fmt: skip


@pytest.mark.parametrize("name", EXAMPLED)
def test_the_main_pages_have_an_example_and_links_to_see(name):
    text = PAGES[reference.page_path(name)]
    example = text.split("## Examples")[1].split("```")[1]
    assert example.startswith("pycon\n>>> "), f"{name}: no example"
    see = text.split("## See also")[1].split("##")[0]
    assert re.search(r"^- \[`peg\.\w+`\]\(\w+\.md\): \w", see, re.M), f"{name}: no see also"
    assert re.search(r"^- \[\w+ guide\]\(\.\./[\w-]+\.md", see, re.M) or name == "Estimate"


def test_the_docstring_examples_run_as_shown(tmp_path, monkeypatch):
    """Every `>>>` example of a reference page's docstring, as doctest runs it, without a
    warning (an example shows the use that needs none)."""
    monkeypatch.chdir(tmp_path)  # any file an example writes
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    said: list[str] = []
    ran = set()
    for name, obj in (reference.public() | reference.returned()).items():
        for test in finder.find(obj, name, globs={}):
            if test.examples:
                ran.add(name)
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    runner.run(test, out=said.append)
    assert runner.failures == 0, "".join(said)[-4000:]
    assert ran >= set(EXAMPLED)


def test_no_internal_method_and_none_without_its_meaning():
    """The methods listed are the user's (peg's plumbing, `INTERNAL`, left out), each with the
    first line of its docstring."""
    defined = set()
    for obj in (reference.public() | reference.returned()).values():
        for _, member in inspect.getmembers(obj):
            f = member.fget if isinstance(member, property) else member
            defined.add(getattr(f, "__qualname__", ""))
    assert defined >= reference.INTERNAL, sorted(reference.INTERNAL - defined)  # none stale
    for path, text in PAGES.items():
        listed = text.split("## Methods")[1] if "## Methods" in text else ""
        for line in listed.strip().splitlines():
            assert re.match(r"^- `[^`]+`( \(property\))?: \S", line), f"{path}: {line}"
        for hidden in reference.INTERNAL:
            owner, method = hidden.split(".")
            assert f"- `{method}(" not in listed or path != reference.page_path(owner)
    estimator = PAGES[reference.page_path("PerformanceEstimator")].split("## Methods")[1]
    assert "`estimate(" in estimator and "`add(" not in estimator and "`read(" not in estimator


def test_a_command_page_has_every_option():
    parsers = reference.commands()
    for name, p in parsers.items():
        text = PAGES[reference.command_path(name)]
        for action in p._actions:
            for option in set(action.option_strings) - {"-h", "--help"}:
                assert f"`{option}`" in text, f"peg {name}: {option} not on its page"


def test_a_docstring_section_is_not_taken_for_arguments():
    """`Args:` items become the table; prose after it stays prose (TemperatureScaling's
    `After fit(...)` paragraph), and the constraints section is the table's, not repeated."""
    text = PAGES[reference.page_path("TemperatureScaling")]
    assert "After `fit(predictor, val)`" in text.split("## Arguments")[1]
    assert "Arguments accepted" not in text


def test_the_site_builds(tmp_path):
    """`mkdocs build --strict` (mkdocs.yml): every page in the nav, every anchor found, no
    warning, offline (the built-in theme); the reference pages among the built ones. Skipped
    where mkdocs is not installed (it is in the dev extra)."""
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (site / "index.html").exists() and (site / "glossary.html").exists()
    for path in PAGES:
        assert (site / path).with_suffix(".html").exists(), path
    _no_dead_link(site)
    home = (site / "index.html").read_text(encoding="utf-8")
    first = re.search(r'<a href="([^"]+)">README', home)  # "Where to start": the quick starts
    assert first and first.group(1) == "repo/index.html#quick-start-saved-logits"


HREF = re.compile(r"""<(?:a|img|link|script)\b[^>]*?\b(?:href|src)=["']([^"']+)["']""")


def _no_dead_link(site: Path) -> None:
    """Every relative link of every built page reaches a file of the site, and its anchor an
    element of that page (the README's and results/' links included: copied into the site)."""
    ids: dict[Path, set[str]] = {}
    for page in sorted(set(site.rglob("*.html")) - {site / "404.html"}):  # the theme's, rooted
        for link in HREF.findall(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:|^//", link, re.I) or link.startswith("#"):
                continue
            file, _, anchor = link.partition("#")
            target = (page.parent / file).resolve()
            assert target.is_file(), f"{page.relative_to(site)}: dead link {link!r}"
            if anchor and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text("utf-8")))
                assert anchor in ids[target], f"{page.relative_to(site)}: no anchor {link!r}"


def test_strict_builds_fail_on_dead_links():
    """mkdocs.yml makes every dead link, anchor and unrecognised link a warning (and so an
    error of `mkdocs build --strict`), not an info line."""
    yaml = pytest.importorskip("yaml")
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=loader)
    links = config["validation"]["links"]
    for check in ("not_found", "anchors", "absolute_links", "unrecognized_links"):
        assert links[check] == "warn", f"validation.links.{check}: {links[check]}"
