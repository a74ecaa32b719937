"""`peg.Laplace`'s file: the options, the model's weights and laplace-torch's `state_dict()` as
safetensors + JSON (`peg.utils.io.save_tree`; nothing is pickled), and the helpers that look into a
laplace-torch object (knowing only its attributes: laplace-torch is imported by the caller)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg import archive
from peg._schema import Fields
from peg._version import __version__
from peg.errors import ArchiveError
from peg.utils.io import load_tree, save_tree

FORMAT = "peg-laplace"


def last_layer(la: Any) -> str | None:
    """The name of the module laplace-torch treats as the last layer (None for "all")."""
    return getattr(la.model, "_last_layer_name", None) if hasattr(la.model, "last_layer") else None


def network(la: Any) -> nn.Module:
    """The model inside laplace-torch's object (the FeatureExtractor's for the last layer)."""
    return la.model.model if hasattr(la.model, "last_layer") else la.model


def leaves(tree: Any) -> list[Tensor]:
    """The tensors of a nested state (dicts, lists, tuples)."""
    if isinstance(tree, Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in leaves(v)]
    return []


def to_device(tree: Any, device: torch.device) -> Any:
    """Every tensor of a nested state moved to `device` (lists stay lists: laplace-torch
    updates its Kronecker factors in place)."""
    if isinstance(tree, Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device) for v in tree)
    return tree


def write(
    path: str | os.PathLike[str], la: Any, params: dict[str, Any], meta: dict[str, Any]
) -> str:
    """Save a fitted laplace-torch object with the method's `params` and `meta`, atomically.
    laplace-torch keeps the first data batch to find the last layer again; the layer's name is
    stored instead, so no data is written."""
    state = dict(la.state_dict())
    name = last_layer(la)
    if "data" in state:
        state["data"], state["_last_layer_name"] = None, name
    tree = {
        "format": FORMAT,
        "format_version": 1,
        "peg_version": __version__,
        "params": params,
        "meta": meta,
        "last_layer": name,
        "weights": network(la).state_dict(),
        "laplace": state,
    }
    save_tree(path, tree)
    return str(path)


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What `write` stored; an ArchiveError for any other file (a pointer to `peg.load` for an
    ensemble archive)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"path: no saved Laplace approximation at {path}")
    try:
        archive.read_header(path)
    except ArchiveError:
        pass
    else:
        raise ArchiveError(
            f"{path}: an ensemble archive, not a saved peg.Laplace; load it with "
            "peg.load(path, model)"
        )
    try:
        tree = load_tree(path)
    except ValueError as e:
        raise ArchiveError(f"{e}; expected a file peg.Laplace.save wrote") from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise ArchiveError(f"{path}: not a saved peg.Laplace (format {FORMAT!r} expected)")
    fields = Fields(tree, str(path), what="Laplace file")
    fields.integer("format_version", minimum=1, maximum=1)
    fields.object("params")
    fields.object("meta")
    fields.get("last_layer", lambda v: v is None or isinstance(v, str), "a module name or null")
    fields.get(
        "weights",
        lambda v: isinstance(v, dict) and all(isinstance(t, Tensor) for t in v.values()),
        "a state dict of tensors",
    )
    fields.object("laplace")
    weights = tree["weights"].items()
    bad = [k for k, t in weights if t.is_floating_point() and not t.isfinite().all()]
    if bad:
        raise ArchiveError(f"{path}: Laplace file field 'weights': {bad[:3]} hold NaN or inf")
    return tree


def rebuilt(cls: type, tree: dict[str, Any], path: Path, batch_fn: Any) -> Any:
    """The method `cls` with the file's options (an ArchiveError naming the field for options
    it refuses)."""
    try:
        return cls(**tree["params"], batch_fn=batch_fn)
    except (TypeError, ValueError) as e:
        raise ArchiveError(f"{path}: Laplace file field 'params': {e}") from None


def restore(la: Any, tree: dict[str, Any], device: torch.device, path: Path) -> None:
    """laplace-torch's state put back into `la` (an ArchiveError for a state it refuses)."""
    try:
        la.load_state_dict(to_device(tree["laplace"], device))
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        detail = f"{type(e).__name__}: {e}"
        raise ArchiveError(f"{path}: Laplace file field 'laplace': {detail}") from None


def weights(model: nn.Module, tree: dict[str, Any], device: str | torch.device) -> nn.Module:
    """A copy of `model` holding the saved weights, on `device`, in eval mode."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    copied = copy.deepcopy(model)
    try:
        copied.load_state_dict(tree["weights"])
    except RuntimeError as e:
        detail = str(e).splitlines()[0]
        raise ArchiveError(f"model: does not match the saved weights ({detail})") from None
    return copied.to(device).eval()
