"""`import peg` (and `peg --help`) load torch and numpy, nothing heavier: scikit-learn, SciPy,
matplotlib, transformers and laplace-torch are imported where they are used (issue 41; the
time it saves: benchmarks/import_time.py)."""

from __future__ import annotations

import pytest

from fresh_imports import STATEMENTS, modules_after
from peg.utils.imports import lazy_module

# lightning, pytorch_lightning, accelerate: only peg.integrations' framework modules import them
HEAVY = [
    "sklearn",
    "scipy",
    "matplotlib",
    "transformers",
    "laplace",
    "pandas",
    "lightning",
    "pytorch_lightning",
    "accelerate",
]


def _loaded_after(statement: str) -> list[str]:
    """The HEAVY packages in `sys.modules` of a fresh Python after `statement` (and the
    statements before it in tests/fresh_imports.py, run in the same process)."""
    return sorted(m for m in HEAVY if m in modules_after()[statement])


@pytest.mark.parametrize("statement", STATEMENTS[:5])
def test_importing_peg_loads_no_heavy_dependency(statement):
    assert _loaded_after(statement) == []


def test_the_heavy_dependency_is_there_once_used():
    """The check above can fail: using what needs scikit-learn loads it in the same way."""
    assert "sklearn" in _loaded_after("peg.metrics.auroc([0.1, 0.2], [0.9, 0.3])")


def test_a_lazy_module_imports_on_first_attribute():
    json = lazy_module("json")
    assert json.dumps([1]) == "[1]"
    assert "json" in repr(json)
    with pytest.raises(AttributeError):
        json.no_such_function  # noqa: B018


def test_importing_peg_loads_no_torch():
    """`import peg` is lazy (PEP 562): the `peg` command's `--help` starts without torch
    (tests/apps/test_cli_start.py runs it)."""
    assert "torch" not in modules_after()["import peg"]


def test_every_public_name_and_peg_plots_after_import_peg_alone():
    """`peg.plots` raised AttributeError in a script unless something had imported it first;
    every name of `peg.__all__`, `from peg import *` and `peg.evaluate` (a function, though
    peg's own modules import the module `peg.evaluate`) in a fresh process."""
    import subprocess
    import sys

    code = (
        "import peg\nassert callable(peg.plots.reliability_diagram)\n"
        "import peg.evaluate\nassert callable(peg.evaluate)\n"
        "missing = [n for n in peg.__all__ if getattr(peg, n, None) is None]\n"
        "assert not missing, missing\n"
        "namespace = {}\nexec('from peg import *', namespace)\n"
        "assert set(peg.__all__) <= set(namespace)\nassert namespace['evaluate'] is peg.evaluate\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
