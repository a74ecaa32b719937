"""What `peg.load` checks beyond the file format: the `device` argument, and a calibrated
archive's map (finite, and not degenerate) before it is handed back.

Why: `load(device="CPU")`, `""` or `"cuda"` on a build without CUDA failed with torch's raw
RuntimeError / AssertionError naming no argument; and a calibration map holding ±inf (Dirichlet
weights) or a degenerate value (a temperature of 1e-300) loaded, then predicted NaN for every
input (NaN itself was refused, inf was not).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from peg.errors import ArchiveError


def check_device(device: Any) -> torch.device:
    """`device` as a `torch.device` this build of torch can allocate on (a ValueError or
    TypeError naming `device` otherwise, before the archive is read)."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device: expected a torch.device or a string such as 'cpu' or 'cuda:0', got "
            f"{type(device).__name__}"
        )
    try:
        found = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"device: expected a device such as 'cpu', 'cuda' or 'cuda:1' (lower case), got "
            f"{device!r}"
        ) from None
    if found.type == "meta":
        raise ValueError("device: 'meta' holds shapes without values; load on 'cpu' or a GPU")
    try:
        torch.empty(0, device=found)
    except (RuntimeError, AssertionError) as e:  # a CPU build, a missing GPU or index
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"device: {str(found)!r} is not available in this process ({reason}); pass "
            "device='cpu', or None for the model's device"
        ) from None
    return found


def check_calibration_entry(path: Path, calibration: Any) -> None:
    """Every number in the archive meta's "calibration" entry finite (JSON's `Infinity` and
    `NaN` parse as floats; no calibrator writes them)."""
    bad = _non_finite(calibration, "meta.calibration")
    if bad is not None:
        name, value = bad
        raise ArchiveError(f"{path}: header field {name!r}: expected a finite number, got {value}")


def _non_finite(value: Any, name: str) -> tuple[str, float] | None:
    if isinstance(value, float) and not math.isfinite(value):
        return name, value
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(
        value, list
    ) else ()  # fmt: skip
    for key, v in items:
        found = _non_finite(v, f"{name}.{key}")
        if found is not None:
            return found
    return None


def check_calibration_tensors(path: Path, tensors: Mapping[str, Tensor]) -> None:
    """No ±inf in the map's arrays (NaN is each calibrator's own matter: histogram binning's
    empty bins hold it; the others refuse it in `stored`)."""
    for name, t in tensors.items():
        if t.is_floating_point() and bool(torch.isinf(t).any()):
            raise ArchiveError(
                f"{path}: damaged peg archive (calibration tensor {name!r} holds inf)"
            )


def check_calibrated(
    path: Path, fitted: Any, tensors: Mapping[str, Tensor], device: torch.device
) -> None:
    """The loaded calibrator's prediction is a distribution on probe logits `[1, 3, C]`
    (uniform, moderate, saturated at 50): a degenerate map (T = 1e-300: scores of -1e300, a
    probability of exactly 0 to every class but the top) is refused here.

    C is the map's own (`_fitted_classes`) or, for a map without arrays (temperature
    scaling), 3; a map of unknown C with arrays (`tensors`, the archive's: binning, isotonic)
    is not probed (its arrays are bounded by `check_calibration_tensors` and its own checks)."""
    classes = fitted._fitted_classes()
    if classes is None:
        if tensors:
            return
        classes = 3
    grid = torch.arange(classes, dtype=torch.float32, device=device)
    saturated = 50.0 * (grid == 0).float()
    probe = torch.stack([torch.zeros_like(grid), grid / max(classes - 1, 1), saturated])[None]
    try:  # a probability of exactly 0 here: the map stretched ordinary logits past float32
        log_p = fitted.scale(probe).double().log_softmax(-1)
        degenerate = not bool(torch.isfinite(log_p).all())
    except FloatingPointError:  # a map giving NaN on finite logits (`in_float32`)
        degenerate = True
    if degenerate:
        raise ArchiveError(
            f"{path}: the calibration map ({type(fitted).__name__}) is degenerate: it predicts "
            f"NaN or a probability of exactly 0 on ordinary logits; its stored values are "
            f"{_described(fitted)}"
        )


def _described(fitted: Any) -> str:
    entry = {k: v for k, v in fitted._entry().items() if not isinstance(v, list)}
    return str(entry) if entry else "in its arrays"
