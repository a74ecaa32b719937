"""`import peg` (and `peg --help`) load torch and numpy, nothing heavier: scikit-learn, SciPy,
matplotlib, transformers and laplace-torch are imported where they are used (issue 41; the
time it saves: benchmarks/import_time.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from peg._imports import lazy_module

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
    """The HEAVY packages in `sys.modules` of a fresh Python after `statement`."""
    code = f"import sys; {statement}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(done.stdout.strip())  # a list of names, printed by the line above


@pytest.mark.parametrize(
    "statement",
    [
        "import peg",
        "import peg.data, peg.metrics, peg.plots",
        "import peg.apps.cli",  # what `peg --help` loads
        "import peg.integrations",  # the package; each framework's module imports its own
    ],
)
def test_importing_peg_loads_no_heavy_dependency(statement):
    assert _loaded_after(statement) == []


def test_the_heavy_dependency_is_there_once_used():
    """The check above can fail: using what needs scikit-learn loads it in the same way."""
    assert "sklearn" in _loaded_after("import peg; peg.metrics.auroc([0.1, 0.2], [0.9, 0.3])")


def test_a_lazy_module_imports_on_first_attribute():
    json = lazy_module("json")
    assert json.dumps([1]) == "[1]"
    assert "json" in repr(json)
    with pytest.raises(AttributeError):
        json.no_such_function  # noqa: B018
