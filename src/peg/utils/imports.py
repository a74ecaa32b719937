"""A heavy dependency imported on first use, for a module that calls it in many places.

`import peg` imports torch and numpy and nothing heavier (tests/test_imports.py): scikit-learn,
SciPy, matplotlib, transformers and laplace-torch are imported inside the functions that use
them. Where one module calls a dependency from many functions (`scipy.ndimage` in the image
corruptions), `ndimage = lazy_module("scipy.ndimage")` stands for it instead: the module is
imported when an attribute is first asked for (Python caches it, so later calls cost a lookup).
"""

from __future__ import annotations

import importlib
from typing import Any


class lazy_module:
    """Module `name`, imported when one of its attributes is first asked for."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"lazy_module({self._name!r})"
