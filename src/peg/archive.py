"""Ensembles on disk: one safetensors file whose header carries a JSON description.

Nothing is unpickled: tensors are safetensors, everything else is JSON stored under the
header's metadata key ``"peg"``::

    {"format": "peg-ensemble", "format_version": 1, "peg_version": ..., "torch_version": ...,
     "members": M, "stacked": [names], "shared": [names], "meta": {method, hyper-parameters,
     seed, ...}}

Tensor keys are ``stacked/<state-dict name>`` (`[M, *shape]`) and ``shared/<name>``. Writes go to
a temporary file in the same folder, then `os.replace`, so a crash never leaves half an archive
where a good one was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from peg._io import atomic_save_file
from peg.ensemble import Ensemble

FORMAT = "peg-ensemble"
FORMAT_VERSION = 1


class ArchiveError(ValueError):
    """A file is not a peg archive, is damaged, or does not fit the model given to load it."""


def save_ensemble(ensemble: Ensemble, path: str | os.PathLike[str]) -> str:
    """Write `ensemble` to `path` atomically; returns the path as a string."""
    from peg import __version__

    path = Path(path)
    tensors = {f"stacked/{k}": v.detach().cpu().contiguous() for k, v in ensemble.stacked.items()}
    tensors |= {
        f"shared/{k}": v.detach().cpu().contiguous().clone() for k, v in ensemble.shared.items()
    }
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "peg_version": __version__,
        "torch_version": torch.__version__,
        "architecture": type(ensemble.skeleton).__name__,
        "members": len(ensemble),
        "stacked": list(ensemble.stacked),
        "shared": list(ensemble.shared),
        "meta": ensemble.meta,
    }
    try:
        text = json.dumps(header, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"ensemble.meta: must be JSON-serialisable (finite numbers): {e}") from e
    atomic_save_file(tensors, {"peg": text}, path)
    return str(path)


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of a peg archive, without reading its tensors."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no peg archive at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise ArchiveError(f"{path}: not a peg archive (unreadable safetensors header: {e})") from e
    try:
        header = json.loads(metadata["peg"])
    except (KeyError, json.JSONDecodeError) as e:
        raise ArchiveError(f"{path}: not a peg archive (no 'peg' JSON header)") from e
    if header.get("format") != FORMAT:
        raise ArchiveError(f"{path}: not a peg archive (format {header.get('format')!r})")
    if header.get("format_version", 0) > FORMAT_VERSION:
        raise ArchiveError(
            f"{path}: archive format version {header['format_version']} is newer than this "
            f"peg reads ({FORMAT_VERSION}); upgrade peg"
        )
    return header


def recipe_needs_val(path: Path, header: dict[str, Any]) -> str:
    """The message for a recipe archive loaded without its validation data."""
    meta = header.get("meta") or {}
    recipe = meta["recipe"]
    name = f"{recipe.get('method', 'PEG/PEP')}-{recipe.get('members', '?')}"
    points = recipe.get("data_points", (meta.get("validation_points") or {}).get("total"))
    which = "the validation data"
    if isinstance(points, int):
        which = f"the {points:,} validation points"
    return (
        f"val: {path} is a {name} recipe (base weights + how the members were made, not the "
        f"members); pass {which} it was built from, in the same order, to rebuild them: "
        "peg.load(path, model, val=(X_val, y_val)); to load without data, save the ensemble "
        "with save(path, materialize=True)"
    )


def load(
    path: str | os.PathLike[str],
    model: nn.Module,
    device: str | torch.device = "cpu",
    val: Any = None,
) -> Ensemble:
    """Load an ensemble saved by `Ensemble.save` (or a method's `save`).

    Args:
        path: the archive.
        model: any instance of the architecture the ensemble was built from; it supplies the
            forward pass (its weights are not used). Its state-dict names and shapes must match.
            A model wrapped with `peg.with_output` loads archives saved from the same wrapper,
            or from the bare model (whose entries then get the wrapper's `model.` prefix).
        device: where to put the member weights.
        val: for a PEG/PEP recipe (the default way those save: base weights + how the members
            were made), the validation data the ensemble was built from, as it was given to
            `fit`: the members are rebuilt from it and checked against the recorded
            fingerprints. Required for a recipe (an `ArchiveError` says so before any work);
            ignored for an archive that stores its members (`Ensemble.save`, other methods'
            `save`, or PEG/PEP's `save(path, materialize=True)`).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            "model: expected an nn.Module of the archive's architecture, got "
            f"{type(model).__name__}"
        )
    path = Path(path)
    header = read_header(path)
    recipe = (header.get("meta") or {}).get("recipe")
    if recipe is not None and val is None:
        raise ArchiveError(recipe_needs_val(path, header))
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensors[key] = f.get_tensor(key)
    except Exception as e:
        raise ArchiveError(f"{path}: damaged or truncated peg archive ({e})") from e
    stacked = {k: tensors.get(f"stacked/{k}") for k in header["stacked"]}
    shared = {k: tensors.get(f"shared/{k}") for k in header["shared"]}
    lost = [k for k, v in (stacked | shared).items() if v is None]
    if lost:
        raise ArchiveError(f"{path}: damaged peg archive (tensors missing: {lost[:5]})")
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape[1:]) for k, v in stacked.items()} | {
        k: tuple(v.shape) for k, v in shared.items()
    }
    if expected != got:
        from peg.output import PREFIX

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
    ensemble = Ensemble(model, stacked, shared, header.get("meta"))
    if recipe is not None:
        from peg.methods._perturb import rebuild_recipe

        rebuilt = rebuild_recipe(ensemble.to(device), recipe, val).ensemble()
        rebuilt.meta = {k: v for k, v in ensemble.meta.items() if k != "recipe"}
        return rebuilt
    return ensemble.to(device)
