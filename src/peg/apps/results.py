"""The results writer of the applications: JSON and markdown, each written atomically
(`peg._io.atomic_write_text`: a crash mid-write leaves the previous file intact)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from peg._io import atomic_write_text


def json_ready(obj: Any) -> Any:
    """Plain JSON data: tensors and arrays as lists, non-finite floats as None (null)."""
    if isinstance(obj, Tensor):
        obj = obj.detach().cpu().tolist()
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, Mapping):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def to_json(
    obj: Any,
    *,
    indent: int = 2,
    default: Callable[[Any], Any] | None = None,
    strict: bool = False,
) -> str:
    """`obj` as indented JSON text ending in a newline.

    `default` converts what JSON cannot hold (e.g. `str`); `strict=True` passes `obj` through
    `json_ready` first and refuses NaN and infinities (written as null instead).
    """
    if strict:
        return json.dumps(json_ready(obj), indent=indent, allow_nan=False) + "\n"
    return json.dumps(obj, indent=indent, default=default) + "\n"


def write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (parent folders created); returns the path."""
    atomic_write_text(path, text)
    return Path(path)


def write_json(path: str | Path, obj: Any, **options: Any) -> Path:
    """Write `obj` as JSON (`to_json(obj, **options)`) to `path` atomically; returns the path."""
    return write_text(path, to_json(obj, **options))


def write_results(
    folder: str | Path, results: Any, markdown: str, stem: str = "results", **options: Any
) -> tuple[Path, Path]:
    """`folder/<stem>.json` (`to_json(results, **options)`) and `folder/<stem>.md`."""
    folder = Path(folder)
    return (
        write_json(folder / f"{stem}.json", results, **options),
        write_text(folder / f"{stem}.md", markdown),
    )
