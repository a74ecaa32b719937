"""`peg.load`: an archive back into an ensemble (members stored, or rebuilt from a recipe).

The file format is `peg.archive`'s; a recipe archive (PEG/PEP's default `save`) is rebuilt by the
method that wrote it, found in `peg.recipe`'s registry, which method classes join when they are
defined. A calibrated archive (its meta has `"calibration": {"method": NAME, ...}`, e.g.
`TemperatureScaling.save`) is handed, once its ensemble is loaded, to the calibrator registered
here under NAME (`CALIBRATORS`, filled where each calibrator is defined), with the map's
arrays the archive holds (`archive.read_calibration`): nothing here knows a method.

A file in another of peg's formats (a `peg.utils.io.save_tree` file whose `"format"` is
registered in `FORMATS`, e.g. `peg.Laplace.save`'s) is handed to the reader registered for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg import archive, recipe
from peg._load_checks import (
    check_calibrated,
    check_calibration_entry,
    check_calibration_tensors,
    check_device,
)
from peg._wrappers import around
from peg.ensemble import Ensemble
from peg.errors import ArchiveError
from peg.output import PREFIX
from peg.source._devices import model_device, move
from peg.source.batches import BatchFn
from peg.utils import io as _io
from peg.utils.registry import Registry

__all__ = [
    "CALIBRATORS",
    "FORMATS",
    "calibrator_for",
    "load",
    "register_calibrator",
    "register_format",
]

# ------------------------------------------------------------------------- calibrators
# name → `rebuild(ensemble, params, tensors)`: the fitted calibrator around a loaded ensemble,
# from the archive meta's `"calibration"` entry (`params`, which names it under "method") and the
# map's arrays stored beside the members (`tensors`, CPU; `{}` when there are none).
Calibrator = Callable[[Ensemble, dict[str, Any], dict[str, Tensor]], Any]
CALIBRATORS: Registry[Calibrator] = Registry("calibrator")


def register_calibrator(name: str, rebuild: Calibrator) -> None:
    """Make archives whose meta has `"calibration": {"method": name, ...}` load, through
    `rebuild(ensemble, calibration, tensors)`, as the calibrator it returns
    (`CALIBRATORS.add(name, rebuild)`)."""
    CALIBRATORS.add(name, rebuild)


# ------------------------------------------------------------------------- other formats
# format name → `read(path, model, device, batch_fn)`: the fitted method a file of that format
# holds (registered where the method is defined, as the calibrators are)
Reader = Callable[[Path, nn.Module, Any, Any], Any]
FORMATS: Registry[Reader] = Registry("format")


def register_format(name: str, read: Reader) -> None:
    """Make `peg.load` read files `peg.utils.io.save_tree` wrote with `"format": name` through
    `read(path, model, device, batch_fn)` (`FORMATS.add(name, read)`)."""
    FORMATS.add(name, read)


def calibrator_for(calibration: Any) -> Calibrator:
    """The registered `rebuild` for an archive meta's `"calibration"` entry (ArchiveError if
    its kind is unknown)."""
    name = calibration.get("method") if isinstance(calibration, dict) else None
    if not isinstance(name, str) or name not in CALIBRATORS:
        raise ArchiveError(
            f"calibration: unknown kind {name!r} (known: {sorted(CALIBRATORS)}); the archive "
            "was written by a calibrator this version of peg does not have"
        )
    return CALIBRATORS[name]


def _needs_val(path: Path, header: dict[str, Any]) -> str:
    """The message for a recipe archive loaded without its validation data."""
    meta = header.get("meta") or {}
    made = meta["recipe"]
    name = f"{made.get('method', 'PEG/PEP')}-{made.get('members', '?')}"
    points = made.get("data_points", (meta.get("validation_points") or {}).get("total"))
    which = (
        f"the {points:,} validation points" if isinstance(points, int) else "the validation data"
    )
    return (
        f"val: {path} is a {name} recipe (base weights + how the members were made, not the "
        f"members); pass {which} it was built from, in the same order, to rebuild them: "
        "peg.load(path, model, val=(X_val, y_val)); to load without data, save the ensemble "
        "with save(path, materialize=True)"
    )


def load(
    path: str | os.PathLike[str],
    model: nn.Module | None = None,
    device: str | torch.device | None = None,
    val: Any = None,
    batch_fn: BatchFn | None = None,
) -> Any:
    """Load an ensemble saved by `Ensemble.save` (or a method's `save`).

    Returns an `Ensemble`; for a calibrated archive (`TemperatureScaling.save`, any calibrator's
    `save`), the fitted calibrator around it (a `TemperatureScaling`, a `DirichletCalibration`,
    ...); for a file `Laplace.save` wrote, the fitted `Laplace`. A map fitted on saved logits
    (a calibrator, a conformal predictor, AutoSelect's choice fitted on `nn.Identity()`) holds
    no weights: `peg.load(path)` gives it back around `nn.Identity()`, to apply to logits. A map
    fitted on another module without weights (`5 * x`) holds none either, but acts on that
    module's outputs: it loads with an instance of it only (`model` of the architecture and
    `repr` the archive records; any other is an `ArchiveError` naming `model`).

    Args:
        path: the archive.
        model: any instance of the architecture the ensemble was built from; it supplies the
            forward pass (its weights are not used). None: only for a map over saved logits.
            Its state-dict names and shapes must match.
            A model wrapped with `peg.with_output` loads archives saved from the same wrapper,
            or from the bare model (whose entries then get the wrapper's `model.` prefix).
        device: where to put the member weights; None (default): the device of `model`'s
            weights, so an archive written on a GPU loads on the CPU and the reverse (the
            calibration map and everything predicted follow). A device this process cannot
            allocate on ("cuda" without a GPU, "CPU", "") is a ValueError naming `device`.
        val: for a PEG/PEP recipe (the default way those save: base weights + how the members
            were made), the validation data the ensemble was built from, as it was given to
            `fit`: the members are rebuilt from it and checked against the recorded
            fingerprints. Required for a recipe (an `ArchiveError` says so before any work);
            ignored for an archive that stores its members (`Ensemble.save`, other methods'
            `save`, or PEG/PEP's `save(path, materialize=True)`).
        batch_fn: the `batch_fn` the recipe's ensemble was fitted with, for `val` batches of
            another shape (`peg.source.batches`; a callable is not stored in the recipe); for a
            saved `Laplace`, the one it predicts with.
    """
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(
            "model: expected an nn.Module of the archive's architecture, got "
            f"{type(model).__name__}"
        )
    path = Path(path)
    device = None if device is None else check_device(device)  # before the file is read
    kind = _io.tree_format(path) if path.is_file() else None
    if kind in FORMATS:
        model = _need_model(model, path, kind)
        return FORMATS[kind](path, model, _device(model, device), batch_fn)
    header = archive.read_header(path)
    if (header.get("meta") or {}).get("inputs") in archive.WEIGHTLESS:
        return _weightless_map(path, header, model, device)
    model = _need_model(model, path, header.get("architecture"))
    device = _device(model, device)
    made = recipe.of_meta(header.get("meta") or {}, str(path))
    if made is not None:
        recipe.check(made, str(path))
    if made is not None and val is None:
        raise ArchiveError(_needs_val(path, header))
    calibration = (header.get("meta") or {}).get("calibration")
    if calibration is not None:  # an unknown or malformed map refused before the tensors are read
        calibrator_for(calibration)
        check_calibration_entry(path, calibration)
    stacked, shared = archive.read_tensors(path, header)  # CPU; moved below with the model
    got = {k: tuple(v.shape[1:]) for k, v in stacked.items()} | {
        k: tuple(v.shape) for k, v in shared.items()
    }
    model = around(model, header.get("meta") or {}, got, str(path))  # "TS → PEG": Scaled(model)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if expected != got:
        if {PREFIX + k: v for k, v in expected.items()} == got:
            raise ArchiveError(
                f"model: {path} was saved from a model wrapped with peg.with_output (entries "
                f"prefixed {PREFIX!r}); load it with the same wrapper: "
                "peg.load(path, peg.with_output(model, output_fn))"
            )
        if {PREFIX + k: v for k, v in got.items()} == expected:  # saved bare, loaded wrapped
            stacked = {PREFIX + k: v for k, v in stacked.items()}
            shared = {PREFIX + k: v for k, v in shared.items()}
            got = expected
    if expected != got:
        diff = sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
        raise ArchiveError(
            f"model: does not match the archive's architecture ({header.get('architecture')}); "
            f"entries differing in name or shape: {diff[:5]}"
        )
    _check_dtypes(path, model, stacked, shared)
    meta = {k: v for k, v in (header.get("meta") or {}).items() if k != "calibration"}
    ensemble = Ensemble(model, stacked, shared, meta)
    if made is None:
        loaded = ensemble.to(device)
    else:
        rebuild = recipe.rebuilder(made, ensemble, str(path))  # the recipe's own checks first
        loaded = rebuild(ensemble.to(device), made, val, batch_fn).ensemble()
        loaded.meta = {k: v for k, v in ensemble.meta.items() if k != "recipe"}
    if calibration is None:
        return loaded
    return _calibrated(path, header, calibration, loaded, device)


def _calibrated(
    path: Path, header: dict[str, Any], calibration: dict[str, Any], loaded: Any,
    device: torch.device,
) -> Any:  # fmt: skip
    """The calibrator `calibration` names, fitted around `loaded` with the archive's map arrays
    on `device`: the arrays and the rebuilt map checked (`_load_checks`) before it is returned."""
    tensors = archive.read_calibration(path, header)
    check_calibration_tensors(path, tensors)
    try:
        fitted = calibrator_for(calibration)(loaded, calibration, move(tensors, device))
    except ArchiveError as e:  # a calibrator's own checks name the field; here, the file too
        raise ArchiveError(e.args[0] if str(path) in str(e) else f"{path}: {e}") from None
    check_calibrated(path, fitted, device)
    return fitted


def _device(model: nn.Module, device: torch.device | None) -> torch.device:
    return model_device(model) if device is None else device


def _need_model(model: nn.Module | None, path: Path, what: Any) -> nn.Module:
    """`model`, or a TypeError for an archive with weights loaded without one."""
    if model is None:
        raise TypeError(
            f"model: {path} holds the weights of a {what or 'model'}; pass an instance of its "
            "architecture: peg.load(path, model) (only a map fitted on saved logits loads "
            "without one)"
        )
    return model


def _weightless_map(
    path: Path, header: dict[str, Any], model: nn.Module | None, device: Any
) -> Any:  # fmt: skip
    """The fitted map of an archive without weights (`archive.WEIGHTLESS`) around `model`: a
    module of the recorded architecture without parameters (None: `nn.Identity()`, for a map
    over saved logits only); its arrays on `device` (None: the CPU; they follow the logits)."""
    meta = header["meta"]
    recorded = header.get("architecture")
    # archives written before `archive.MODULE` said "logits" over any weightless module: theirs
    # is the architecture they record
    logits = meta.get("inputs") == archive.LOGITS and recorded in archive.LOGITS_MODULES
    if model is None and not logits:
        raise TypeError(
            f"model: {path} holds a map fitted on the outputs of a {recorded or 'module'} (a "
            "module without weights, not saved logits); pass an instance of it: "
            "peg.load(path, model)"
        )
    model = nn.Identity() if model is None else model
    if next(model.parameters(), None) is not None or next(model.buffers(), None) is not None:
        raise ArchiveError(
            f"model: {path} is a calibration map fitted on saved logits (no weights); load it "
            f"with peg.load(path) and apply it to the logits, not to a {type(model).__name__} "
            "with parameters"
        )
    _check_module(path, model, recorded, meta.get("module"))
    calibration = meta.get("calibration")
    if calibration is None:
        raise ArchiveError(f"{path}: an archive over saved logits without a calibration map")
    check_calibration_entry(path, calibration)
    where = torch.device("cpu") if device is None else device
    return _calibrated(path, header, calibration, model, where)


def _check_module(path: Path, model: nn.Module, recorded: Any, described: Any) -> None:
    """An ArchiveError naming `model` unless it is of the architecture the weightless map was
    fitted on (its class name, and its `repr` where the archive records one): the map acts on
    that module's outputs (an archive over saved logits loaded around `nn.Softmax(-1)`, or one
    over `5 * x` around `nn.Identity()`, loaded and predicted other probabilities)."""
    given = type(model).__name__
    shown = repr(model)[: archive.MODULE_REPR] if isinstance(described, str) else None
    same = given == recorded or {given, recorded} <= set(archive.LOGITS_MODULES)
    if not same or (shown is not None and shown != described):
        logits = recorded in archive.LOGITS_MODULES and shown is None
        what = f"the outputs of {described or recorded}"
        what = "saved logits (nn.Identity())" if logits else what
        raise ArchiveError(
            f"model: {path} holds a map fitted on {what}; got {repr(model)[:200]}, another "
            "architecture: pass the module it was fitted on"
            + (" or none: peg.load(path)" if logits else "")
        )


def _check_dtypes(
    path: Path, model: nn.Module, stacked: dict[str, Tensor], shared: dict[str, Tensor]
) -> None:
    """ArchiveError unless every entry has the dtype of the model's (F64 or I32 where F32 was
    saved would load, and fail later blaming the inputs)."""
    wrong = [
        f"{k} ({tensors[k].dtype} in the archive, {v.dtype} in the model)"
        for k, v in model.state_dict().items()
        for tensors in (stacked, shared)
        if k in tensors and tensors[k].dtype != v.dtype
    ]
    if wrong:
        raise ArchiveError(
            f"{path}: tensors of another dtype than the model's: {wrong[:3]}; load it with a "
            "model of the dtype it was saved from (e.g. model.float())"
        )
