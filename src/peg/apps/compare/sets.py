"""The sets `peg.compare` reads: val, test, the shifted sets (labelled) and the OOD sets (inputs),
each named by the argument it came from, checked before anything is fitted, and fingerprinted
for a resumed run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor, nn

from peg.apps.compare.report import TEST
from peg.apps.compare.state import fingerprint
from peg.methods._predictors import stateless
from peg.source import Data, Source, is_dataset_or_loader, is_pair


def read_sets(
    val: Data, test: Data, shifted: Any, ood: Any
) -> tuple[dict[str, Data], dict[str, Data]]:
    """The labelled sets `{"val", "test", shifted...}` and the OOD sets, checked; a shifted or
    OOD set named as another set (a shifted "test" would replace the test set) is refused."""
    labelled = {"val": as_labelled(val, "val"), TEST: as_labelled(test, TEST)}
    for name, data in by_name(shifted, "shifted").items():
        if name in labelled:  # it would replace the validation or the test set
            raise ValueError(
                f"shifted: the name {name!r} is taken by {name}; name the shifted set "
                "otherwise (NAME=DATA with --shifted)"
            )
        labelled[name] = as_labelled(data, f"shifted[{name!r}]")
    unlabelled = {n: as_inputs(d, f"ood[{n!r}]") for n, d in by_name(ood, "ood").items()}
    clash = sorted(set(labelled) & set(unlabelled))
    if clash:
        raise ValueError(f"ood: names {clash} are taken by val, test or a shifted set")
    return labelled, unlabelled


def fingerprints(
    model: nn.Module, val: Data, sets: Mapping[str, Data], batch_size: int
) -> dict[str, Any]:
    """The fingerprints of the weights, of `val` and of every other set (`state.fingerprint`:
    SHA-256 of their bytes, one streamed read of each set)."""
    return {
        "model": fingerprint(model),
        "val": fingerprint(val, batch_size),
        "sets": {n: fingerprint(d, batch_size) for n, d in sets.items()},
    }


def by_name(data: Any, default: str) -> dict[str, Data]:
    if data is None:
        return {}
    if isinstance(data, Mapping) and all(isinstance(k, str) for k in data):
        return dict(data)
    return {default: data}


def as_labelled(data: Data, name: str) -> Data:
    """`data` as labelled data: a pair as tensors (checked: `Source.xy`), a Dataset or DataLoader
    as it is (its first batch is read by `faults.check_data`)."""
    if is_pair(data):
        return Source(data, name=name).xy()
    if is_dataset_or_loader(data):
        return data
    raise TypeError(
        f"{name}: expected labelled data: a pair (X, y) of tensors or arrays, a Dataset or "
        f"a DataLoader, got {type(data).__name__}"
    )


def check_widths(
    model: nn.Module, labelled: dict[str, Data], ood: dict[str, Data], kind: Any = None
) -> None:
    """Saved logits (`model` stateless) held in memory with another number of columns
    (classes) than val's: a ValueError naming both counts, before any fitting (every method
    fitted on val failed on them, one row each)."""
    if not stateless(model):  # one model's outputs: one width
        return
    sets = [(argument(n), d) for n, d in labelled.items()]
    sets += [(f"ood[{n!r}]", d) for n, d in ood.items()]
    arrays = {n: d[0] if is_pair(d) else d for n, d in sets}
    axis = -1 if kind is None or kind.kind != "dense" else kind.class_dim  # the classes'
    if kind is not None and kind.kind == "binary":
        return  # one score a row
    widths = {n: a.shape[axis] for n, a in arrays.items() if isinstance(a, (Tensor, np.ndarray))}
    for name, width in widths.items():
        if "val" in widths and width != widths["val"]:
            raise ValueError(
                f"{name}: logits with {width} columns (classes), but val's have "
                f"{widths['val']}; every set must be the same model's logits (the same classes, "
                "in the same order)"
            )


def argument(name: str) -> str:
    """The argument a labelled set came from: val, test or shifted[name]."""
    return name if name in ("val", TEST) else f"shifted[{name!r}]"


def as_inputs(data: Data, name: str) -> Data:
    """OOD inputs: a tensor or array, the inputs of a pair, a Dataset or a DataLoader."""
    if is_pair(data):
        return Source(data, name=name).xy()[0]
    if isinstance(data, (Tensor, np.ndarray)):
        return Source(data, name=name).xy(need_labels=False)[0]
    if is_dataset_or_loader(data):
        return data
    raise TypeError(
        f"{name}: expected inputs: a tensor or array, a pair (X, y), a Dataset or a "
        f"DataLoader, got {type(data).__name__}"
    )
