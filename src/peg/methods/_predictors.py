"""Predictors as calibrators and `peg.evaluate` see them: anything with `member_logits(X)`
(an `Ensemble`, a fitted method, a fitted calibrator) or an nn.Module (a one-member ensemble).

`read_predictor` reads the first two arguments of every `fit` (a model and its data, or saved
logits and their labels: `fit(logits, labels)`); `member_logits_of` / `iter_member_logits_of`
predict with any predictor; `logits_and_labels` reads labelled data once (a loader is never
gathered); `predictor_meta` / `ensemble_of` are what a calibrator records and saves of the
predictor it was fitted on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg._forward import warn_probabilities
from peg.ensemble import Ensemble
from peg.errors import NotStreamable
from peg.methods.base import FittedEnsemble, ModulePredictor, is_fitted
from peg.output import model_output
from peg.source import Data, Source, Tapped
from peg.source._devices import model_device, move, weights_device
from peg.source._values import check_finite, checked_labels, warn_one_class
from peg.source.batches import BatchFn, call_model, from_numpy


class SavedLogits(nn.Identity):
    """The model of `fit(logits, labels)`: saved logits `[N, C]` are its inputs and its outputs.
    An `nn.Identity` (`stateless`: one member, run where the logits are, saved as the map
    alone), named so that a fitted object's `predictor_` says it was fitted on logits."""


def read_predictor(
    predictor: Any,
    data: Any,
    name: str = "predictor",
    expected: str = "an nn.Module or an object with member_logits(X) (a fitted peg predictor)",
) -> tuple[Any, Any]:
    """`(predictor, data)` as every `fit` reads its first two arguments (calibrators, conformal,
    `LabelShift`, `AutoSelect`, `evaluate`, `compare`): a model (an nn.Module) or a peg
    predictor (`member_logits(X)`) with its data, as given; saved logits `[N, C]` (a tensor,
    a NumPy array, a memory-mapped `.npy`) with their labels `[N]`, as `SavedLogits()` and the
    pair `(logits, labels)`, which every consumer reads through its model path (streamed, as
    `nn.Identity()`'s). Clear errors for anything else, before any work (`name`: the
    argument's, `expected`: what it takes besides logits)."""
    if isinstance(predictor, nn.Module) or hasattr(predictor, "member_logits"):
        return predictor, data
    if isinstance(predictor, (Tensor, np.ndarray)):
        check_logits(predictor, data)
        return SavedLogits(), (predictor, data)
    raise TypeError(
        f"{name}: expected {expected}, or logits [N, C] (a tensor or a NumPy array) followed by "
        f"their labels [N], got {type(predictor).__name__}"
    )


def check_logits(logits: Tensor | np.ndarray, labels: Any) -> None:
    """A ValueError (TypeError for a wrong type) naming `logits` or `labels`: logits not
    `[N, C]` floating-point, labels not `[N]`, NaN or inf among the logits."""
    shape = tuple(logits.shape)
    floating = (
        logits.dtype.kind == "f" if isinstance(logits, np.ndarray) else logits.is_floating_point()
    )
    if len(shape) != 2 or not floating:
        raise ValueError(
            f"logits: expected floating-point logits [N, C] (a 2-D tensor or array), got shape "
            f"{shape} and dtype {logits.dtype}"
        )
    if labels is None:
        raise ValueError("labels: fit(logits, labels) needs the labels [N] as the second argument")
    if not isinstance(labels, (Tensor, np.ndarray)):
        raise TypeError(
            f"labels: expected class labels [N] (a tensor or a NumPy array) after logits, got "
            f"{type(labels).__name__}"
        )
    if labels.ndim != 1 or len(labels) != shape[0]:
        raise ValueError(
            f"labels: expected {shape[0]} labels [N] for logits of shape {shape}, got shape "
            f"{tuple(labels.shape)}"
        )
    check_finite(from_numpy(logits) if isinstance(logits, np.ndarray) else logits, "logits")


def check_predictor(predictor: Any) -> None:
    if not (hasattr(predictor, "member_logits") or isinstance(predictor, nn.Module)):
        raise TypeError(
            "predictor: expected an nn.Module or an object with member_logits(X), "
            f"got {type(predictor).__name__}"
        )


def stateless(predictor: Any) -> bool:
    """Whether `predictor` is a model without parameters or buffers: saved logits read through
    `nn.Identity()`, or any fixed function of its inputs. It is one member, run where its inputs
    are (`_stateless_batches`), wherever a model is taken."""
    return (
        isinstance(predictor, nn.Module)
        and not hasattr(predictor, "member_logits")
        and next(predictor.parameters(), None) is None
        and next(predictor.buffers(), None) is None
    )


def _stateless_batches(
    model: nn.Module, X: Data, batch_size: int, batch_fn: BatchFn | None = None, **_: Any
) -> Iterator[Tensor]:
    """`[1, B_j, C]` per batch of a `stateless` model, computed on the inputs' own device."""
    for x in Source.of(X, batch_fn).inputs(batch_size):
        yield model_output(call_model(model, x), "member_logits").unsqueeze(0)


def predictor_device(predictor: Any) -> torch.device | None:
    """Where `predictor` computes (its inputs are moved there), when it can be told cheaply;
    None for a `stateless` model, which computes where its inputs are."""
    if stateless(predictor):
        return None
    if isinstance(predictor, nn.Module):
        return weights_device(predictor)
    if isinstance(predictor, Ensemble):
        return predictor.device
    if isinstance(predictor, FittedEnsemble) and "ensemble_" in predictor.__dict__:
        return predictor.ensemble_.device  # stacked members held (a lazy PEG/PEP holds none)
    if isinstance(predictor, ModulePredictor) and is_fitted(predictor):
        return weights_device(predictor.model_)
    return None


def _protocol(batch_fn: BatchFn | None, options: dict[str, Any]) -> dict[str, Any]:
    """The keywords of the predictor protocol that were given (None ones left out, so that a
    foreign object whose `member_logits(X, batch_size)` takes no more keeps working)."""
    return {k: v for k, v in {"batch_fn": batch_fn, **options}.items() if v is not None}


def member_logits_of(
    predictor: Any,
    X: Data,
    batch_size: int = 512,
    batch_fn: BatchFn | None = None,
    **options: Any,
) -> Tensor:
    """`[M, N, C]` from anything that predicts: an object with `member_logits`, or an nn.Module
    (the predictor protocol's keywords passed on, `peg.methods.base`)."""
    check_predictor(predictor)
    extra = _protocol(batch_fn, options)
    if stateless(predictor):
        batches = list(_stateless_batches(predictor, X, batch_size, **extra))
        if not batches:
            raise ValueError("X: no inputs to predict (0 samples)")
        return torch.cat(batches, 1)
    if hasattr(predictor, "member_logits"):
        return predictor.member_logits(X, batch_size, **extra)
    model_device(predictor, "predictor")
    return Ensemble.from_models([predictor]).member_logits(X, batch_size, **extra)


def iter_member_logits_of(
    predictor: Any,
    X: Data,
    batch_size: int = 512,
    batch_fn: BatchFn | None = None,
    **options: Any,
) -> Iterator[Tensor]:
    """`member_logits_of` batch by batch: `[M, B_j, C]` per batch j, from the predictor's
    `iter_member_logits` (an nn.Module through a one-member `Ensemble`). `NotStreamable`, raised
    here, before any batch is read, for a predictor without one (a foreign object that only has
    `member_logits`) or that cannot (a lazy PEG/PEP)."""
    check_predictor(predictor)
    extra = _protocol(batch_fn, options)
    if stateless(predictor):
        return _stateless_batches(predictor, X, batch_size, **extra)
    if isinstance(predictor, nn.Module) and not hasattr(predictor, "member_logits"):
        model_device(predictor, "predictor")
        return Ensemble.from_models([predictor]).iter_member_logits(X, batch_size, **extra)
    if not hasattr(predictor, "iter_member_logits"):
        raise NotStreamable(f"predictor: {type(predictor).__name__} has no iter_member_logits")
    return predictor.iter_member_logits(X, batch_size, **extra)


def logits_and_labels(
    predictor: Any, data: Data, batch_size: int, batch_fn: BatchFn | None, name: str
) -> tuple[Tensor, Tensor]:
    """Member logits `[M, N, C]` and labels `[N]` of labelled data in one pass over it, the
    labels on the logits' device (labels follow the scores, `peg.source._devices`).

    A pair `(X, y)` of tensors is predicted as it is (`Source.xy`); a loader or a Dataset (batches
    of any shape, `peg.source.batches`) is handed to the predictor as a `Tapped` source, which
    records each batch's labels as the predictor reads it: the inputs are never gathered, and the
    logits are those `predictor.member_logits(data)` gives (same batches, same bits)."""
    X, y = Source(data, batch_fn, name).labelled(predictor_device(predictor))
    logits = member_logits_of(predictor, X, batch_size)
    if isinstance(X, Tapped):
        y = checked_labels(X.labels(), name, logits.shape[1], predictor_device(predictor))
    assert y is not None
    y = move(y, logits.device, f"{name} labels")  # labels follow the scores
    _warn(logits, y, name)
    return logits, y


def _warn(logits: Tensor, y: Tensor, name: str) -> None:
    """What is accepted yet meaningless to fit on: probabilities for logits, one class in val."""
    warn_probabilities(logits[0])
    if name == "val":
        warn_one_class(y, name)


def predictor_meta(predictor: Any) -> dict[str, Any] | None:
    """What `predictor` is (an `Ensemble`'s or a fitted method's meta), or None if not said."""
    if isinstance(predictor, Ensemble):
        meta: Any = predictor.meta
    elif isinstance(predictor, nn.Module):
        return None
    else:
        meta = getattr(predictor, "meta_", None)
    return dict(meta) if isinstance(meta, Mapping) and meta else None


def ensemble_of(predictor: Any) -> Ensemble:
    """The stacked-weights `Ensemble` a predictor is (TypeError for one that has none)."""
    if isinstance(predictor, Ensemble):
        return predictor
    if isinstance(predictor, FittedEnsemble):
        return predictor.ensemble()
    if stateless(predictor):
        raise TypeError(
            "predictor: a model without parameters (saved logits read through nn.Identity) has "
            "no weights to archive; keep the fitted map's attributes (e.g. temperature_) or fit "
            "the calibrator on the model that made the logits"
        )
    if isinstance(predictor, nn.Module):
        return Ensemble.from_models([predictor])
    raise TypeError(
        "predictor: save writes an ensemble archive, which needs an nn.Module, a peg.Ensemble "
        f"or a fitted method holding one (DeepEnsemble, SWAG, PEG, ...); "
        f"{type(predictor).__name__} has no stacked member weights to save"
    )
