"""What `peg.load` checks beyond the file format: the `device` argument, and a calibrated
archive's map (finite, and not degenerate) before it is handed back; and a torch file read with
`torch.load(weights_only=True)`, whose refusals are said in peg's words (`torch_file`).

Why: `load(device="CPU")`, `""` or `"cuda"` on a build without CUDA failed with torch's raw
RuntimeError / AssertionError naming no argument; and a calibration map holding ±inf (Dirichlet
weights) or a degenerate value (a temperature of 1e-300) loaded, then predicted NaN for every
input (NaN itself was refused, inf was not); a conformal predictor's inner temperature of
1e-300 loaded, and `predict_set` blamed `X`.
"""

from __future__ import annotations

import math
import pickle
import re
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
    items = (
        value.items()
        if isinstance(value, Mapping)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
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


# the probe's width for a map whose arrays do not fix C (temperature, ETS, spline, order-
# preserving): a header's C is not allocated for (2e8 classes: a raw allocator error at load)
PROBE_CLASSES = 4096
BIG = 1e4  # the magnitude of the probe's large logits (what ImageNet-scale models reach)
ORDINARY = 3  # the probe's first rows (zero, moderate, saturated at 50): no class gets 0 there


def check_calibrated(
    path: Path, fitted: Any, device: torch.device, field: str = "meta.calibration"
) -> None:
    """The loaded calibrator's prediction is a distribution on probe logits `[1, 5, W]`: zero,
    moderate, saturated at 50, spread over ±1e4 and one-hot at ±1e4 (the magnitudes a map will
    meet, not only 0…50); a degenerate map (T = 1e-300: every score -inf; slopes × 1e300: NaN)
    is refused here, naming the field, rather than predicting NaN for every input. A calibrator
    inside it (a conformal predictor's or `LabelShift`'s `predictor_`) is probed as well.

    W is the map's C (`_fitted_classes`), at most `PROBE_CLASSES` for a map whose arrays do not
    fix C (a larger header's C is not allocated for), 3 for a map of unknown C (an archive
    written before C was recorded)."""
    classes = fitted._fitted_classes()
    if classes is None:
        classes = 3
    elif _one_map(fitted)._classes_of(vars(_one_map(fitted))) is None:
        classes = min(classes, PROBE_CLASSES)
    grid = torch.arange(classes, dtype=torch.float32, device=device)
    top = (grid == 0).float()
    probe = torch.stack(
        [
            torch.zeros_like(grid),
            grid / max(classes - 1, 1),
            50.0 * top,
            torch.linspace(-BIG, BIG, classes, device=device),
            BIG * (2 * top - 1),
        ]
    )[None]
    try:
        log_p = fitted._mapped(probe).double().log_softmax(-1)[0]  # [5, W]
        # NaN anywhere, no finite top class, or a probability of exactly 0 on the ordinary
        # rows (T = 1e-300 stretches them past float32: every class but the top gets 0)
        degenerate = (
            bool(log_p.isnan().any())
            or not bool(torch.isfinite(log_p.max(-1).values).all())
            or not bool(torch.isfinite(log_p[:ORDINARY]).all())
        )
    except FloatingPointError:  # a map giving NaN on finite logits (`in_float32`)
        degenerate = True
    if degenerate:
        where = "" if field == "meta.calibration" else f" under {field!r}"
        raise ArchiveError(
            f"{path}: the calibration map ({type(fitted).__name__}{where}) is degenerate: it "
            f"predicts NaN, or a probability of exactly 0 on ordinary logits, on logits of "
            f"magnitudes 0 to {BIG:g}; its stored values: {_described(fitted, field)}"
        )
    inner = getattr(fitted, "predictor_", None)
    if hasattr(inner, "_fitted_classes") and hasattr(inner, "_mapped"):
        check_calibrated(path, inner, device, f"{field}.inner")


def _one_map(fitted: Any) -> Any:
    """`fitted`, or the map of its first label where it holds one map per label (their arrays,
    not its own, fix C)."""
    maps = vars(fitted).get("label_maps_")
    return maps[0] if maps else fitted


def _described(fitted: Any, field: str) -> str:
    # `_map_entry`: a per-label map's entries are its labels' (a list, not shown)
    entry = {k: v for k, v in fitted._map_entry().items() if not isinstance(v, (list, dict))}
    shown = ", ".join(f"{field}.{k} = {v!r}" for k, v in entry.items())
    return shown or "in its arrays"


# torch's own advice in a refusal, never relayed: it suggests unpickling the file with code
_ADVICE = ("weights_only", "Weights only load failed", "Check the documentation", "Please file")
_GLOBAL = re.compile(r"GLOBAL\s+([\w.]+)")


def torch_file(
    path: Path,
    where: str,
    kind: str = "PyTorch checkpoint",
    written_by: str = "torch.save(model.state_dict(), path), or a .safetensors file",
) -> Any:
    """`torch.load(path, map_location="cpu", weights_only=True)`: tensors and containers, no
    object whose unpickling runs code. A ValueError naming `where` and the file otherwise ("not
    a `kind`", and what writes one: `written_by`): the global torch's weights-only unpickler
    blocked (the function or class a pickle would have called; nothing of it ran), or the
    reason torch could not read the bytes (a text file named .pt gave a raw KeyError or
    IndexError). torch's advice to retry with `weights_only=False`, which would run the file's
    code, is never passed on."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        blocked = _GLOBAL.search(str(e))
        if blocked is None:
            raise _unread(path, where, kind, written_by, e) from None
        raise ValueError(
            f"{where}: {path} is not a {kind}: it holds a pickled {blocked.group(1)}, code "
            "rather than tensors, refused unread (peg reads torch files with torch.load("
            "weights_only=True): tensors and containers only; nothing in the file ran); "
            f"expected a file written by {written_by}"
        ) from None
    except OSError as e:
        raise ValueError(f"{where}: {path} could not be read ({e})") from None
    except Exception as e:  # bytes that are not torch.save's: KeyError, IndexError, EOFError...
        raise _unread(path, where, kind, written_by, e) from None


def _unread(path: Path, where: str, kind: str, written_by: str, error: Exception) -> ValueError:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if not any(a in line for a in _ADVICE)]
    reason = said[0].split(". This is an internal", 1)[0] if said else ""
    reason = f"{type(error).__name__}: {reason}" if reason else type(error).__name__
    return ValueError(
        f"{where}: {path} is not a {kind} (torch.load could not read it: {reason}); expected "
        f"a file written by {written_by}"
    )
