"""Predictors as calibrators and `peg.evaluate` see them: anything with `member_logits(X)`
(an `Ensemble`, a fitted method, a fitted calibrator) or an nn.Module (a one-member ensemble).

`read_predictor` reads the first two arguments of every `fit` (a model and its data, or saved
logits and their labels: `fit(logits, labels)`); `member_logits_of` / `iter_member_logits_of`
predict with any predictor; `logits_and_labels` reads labelled data once (a loader is never
gathered); `labelled_batches` gives `(member logits, labels)` batch by batch in one pass and
`first_labelled` the first batch's alone (what tells a model's dense outputs before reading
them all); `predictor_meta` / `ensemble_of` are what a calibrator records and saves of the
predictor it was fitted on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeGuard

import numpy as np
import torch
from torch import Tensor, nn

from peg._forward import warn_probabilities
from peg.ensemble import Ensemble
from peg.errors import NotStreamable
from peg.methods.base import FittedEnsemble, ModulePredictor, is_fitted
from peg.metrics._inputs import log_probs_of
from peg.output import model_output
from peg.source import Data, Source, Tapped, is_dataset_or_loader, is_pair
from peg.source._devices import model_device, move, weights_device
from peg.source._kinds import read_kind
from peg.source._values import (
    check_finite,
    check_finite_logits,
    check_labels,
    class_indices,
    warn_one_class,
)
from peg.source.batches import BatchFn, as_array, call_model, from_numpy


class SavedLogits(nn.Identity):
    """The model of `fit(logits, labels)`: saved logits `[N, C]` are its inputs and its outputs.
    An `nn.Identity` (`stateless`: one member, run where the logits are, saved as the map
    alone), named so that a fitted object's `predictor_` says it was fitted on logits."""


def is_predictor(obj: Any) -> bool:
    """Whether `obj` is what peg predicts with: a model (an nn.Module) or an object with
    `member_logits(X)` (an `Ensemble`, a fitted method, a fitted calibrator); the one test."""
    return isinstance(obj, nn.Module) or hasattr(obj, "member_logits")


def is_model(obj: Any) -> TypeGuard[nn.Module]:
    """Whether `obj` is a bare model, an nn.Module without `member_logits` (read as a
    one-member `Ensemble`, or where its inputs are when it is `stateless`)."""
    return isinstance(obj, nn.Module) and not hasattr(obj, "member_logits")


def read_predictor(
    predictor: Any,
    data: Any,
    name: str = "predictor",
    expected: str = "an nn.Module or an object with member_logits(X) (a fitted peg predictor)",
    classes: Any = None,
    data_name: str = "val",
    labelled: bool = True,
    kinds: bool = False,
) -> tuple[Any, Any]:
    """`(predictor, data)` as every `fit` reads its first two arguments (calibrators, conformal,
    `LabelShift`, `AutoSelect`, `evaluate`, `compare`): a model (an nn.Module) or a peg
    predictor (`member_logits(X)`) with its data, as given; saved logits `[N, C]` (a tensor,
    a NumPy array, a memory-mapped `.npy`, or an array-like: a list of rows, a pandas
    DataFrame) with their labels `[N]`, as `SavedLogits()` and the pair `(logits, labels)`,
    which every consumer reads through its model path (streamed, as `nn.Identity()`'s).
    Labels may be array-likes (a list, a pandas Series), and name their classes where
    `classes` (the class of each logit column, in order) is given: each is read as its column's
    index (`class_indices`; `data_name`: the data argument's name, for the labels of a pair;
    `labelled` False: a model's data are inputs alone, `evaluate(model, X, y)`'s `X`).
    Clear errors for anything else, before any work (`name`: the argument's, `expected`: what
    it takes besides logits). `kinds`: saved logits of any kind of `peg.source._kinds` (binary
    scores `[N]`, multilabel `[N, K]` with labels `[N, K]`, dense `[B, C, *S]` with `[B, *S]`),
    the consumer reading their kind (the calibrators)."""
    if is_predictor(predictor):
        if not labelled:
            return predictor, data
        if is_pair(data, arrays=False):  # a pair (X, y): its labels
            y = class_indices(data[1], f"{data_name} labels", classes)
            data = (data[0], y) if y is not data[1] else data
        elif classes is not None and is_dataset_or_loader(data):
            raise ValueError(
                f"classes: maps the labels of a pair ({data_name} as (X, y)) or of fit(logits, "
                "labels); a loader's or a Dataset's labels must be class indices"
            )
        return predictor, data
    predictor = as_array(predictor)  # a list of rows, a pandas DataFrame: an array
    if isinstance(predictor, (Tensor, np.ndarray)):
        if data is not None:
            data = class_indices(data, "labels", classes)
        check_logits(predictor, data, kinds)
        return SavedLogits(), (predictor, data)
    raise TypeError(
        f"{name}: expected {expected}, or logits [N, C] (a tensor, a NumPy array or an "
        f"array-like) followed by their labels [N], got {type(predictor).__name__}"
    )


def check_classes(classes: Any, width: int) -> None:
    """A ValueError unless `classes` (None, or the class of each logit column) names as many
    classes as the logits have columns, `width`."""
    if classes is not None and len(classes) != width:
        raise ValueError(
            f"classes: names {len(classes)} classes, but the logits have {width} columns (one "
            "per class, in the order of classes)"
        )


def check_saved_logits(logits: Tensor | np.ndarray, name: str, like: str = "") -> None:
    """A ValueError naming `name` unless saved logits are floating-point `[N, C]` (integers
    are class labels or counts, not scores; `like`: what they should match, for the message)."""
    shape = tuple(logits.shape)
    floating = (
        logits.dtype.kind == "f" if isinstance(logits, np.ndarray) else logits.is_floating_point()
    )
    if len(shape) != 2 or not floating:
        raise ValueError(
            f"{name}: expected floating-point logits [N, C]{like} (a 2-D tensor or array), got "
            f"shape {shape} and dtype {logits.dtype}"
        )


def check_logits(logits: Tensor | np.ndarray, labels: Any, kinds: bool = False) -> None:
    """A ValueError (TypeError for a wrong type) naming `logits` or `labels`: logits not
    `[N, C]` floating-point, labels not `[N]`, NaN or inf among the logits. `kinds`: logits
    `[N, *]` of any shape, labels `[N, *]` (their kind is read by `peg.source._kinds`)."""
    shape = tuple(logits.shape)
    if kinds:
        floating = (
            logits.dtype.kind == "f"
            if isinstance(logits, np.ndarray)
            else (logits.is_floating_point())
        )
        if not shape or not floating:
            raise ValueError(
                f"logits: expected floating-point logits [N, C] (or scores [N], dense logits "
                f"[B, C, *S]), got shape {shape} and dtype {logits.dtype}"
            )
    else:
        check_saved_logits(logits, "logits")
    if labels is None:
        raise ValueError("labels: fit(logits, labels) needs the labels [N] as the second argument")
    if not isinstance(labels, (Tensor, np.ndarray)):
        raise TypeError(
            f"labels: expected class labels [N] (a tensor, a NumPy array or an array-like) after "
            f"logits, got {type(labels).__name__}"
        )
    if (labels.ndim != 1 and not kinds) or labels.ndim == 0 or len(labels) != shape[0]:
        wanted = "[N, ...]" if labels.ndim > 1 else "[N]"
        raise ValueError(
            f"labels: expected {shape[0]} labels {wanted} for logits of shape {shape}, got shape "
            f"{tuple(labels.shape)}"
        )
    check_finite(from_numpy(logits) if isinstance(logits, np.ndarray) else logits, "logits")


def check_predictor(predictor: Any) -> None:
    if not is_predictor(predictor):
        raise TypeError(
            "predictor: expected an nn.Module or an object with member_logits(X), "
            f"got {type(predictor).__name__}"
        )


def stateless(predictor: Any) -> bool:
    """Whether `predictor` is a model without parameters or buffers: saved logits read through
    `nn.Identity()`, or any fixed function of its inputs. It is one member, run where its inputs
    are (`_stateless_batches`), wherever a model is taken."""
    return (
        is_model(predictor)
        and next(predictor.parameters(), None) is None
        and next(predictor.buffers(), None) is None
    )


def _stateless_batches(
    model: nn.Module, X: Data, batch_size: int, batch_fn: BatchFn | None = None, **_: Any
) -> Iterator[Tensor]:
    """`[1, B_j, C]` per batch of a `stateless` model, computed on the inputs' own device;
    detached, as an `Ensemble`'s logits are (no gradient): saved logits that require grad are
    read as data (maps fitted on them convert them to NumPy)."""
    for x in Source.of(X, batch_fn).inputs(batch_size):
        out = model_output(call_model(model, x), "member_logits", shaped=True)
        yield out.detach().unsqueeze(0)


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
    if is_model(predictor):
        model_device(predictor, "predictor")
        return Ensemble.from_models([predictor]).iter_member_logits(X, batch_size, **extra)
    if not hasattr(predictor, "iter_member_logits"):
        raise NotStreamable(f"predictor: {type(predictor).__name__} has no iter_member_logits")
    return predictor.iter_member_logits(X, batch_size, **extra)


def logits_and_labels(
    predictor: Any,
    data: Data,
    batch_size: int,
    batch_fn: BatchFn | None,
    name: str,
    one_class: bool = True,
) -> tuple[Tensor, Tensor]:
    """Member logits `[M, N, C]` and labels `[N]` of labelled data in one pass over it, the
    labels on the logits' device (labels follow the scores, `peg.source._devices`).

    A pair `(X, y)` of tensors is predicted as it is (`Source.xy`); a loader or a Dataset (batches
    of any shape, `peg.source.batches`) is handed to the predictor as a `Tapped` source, which
    records each batch's labels as the predictor reads it: the inputs are never gathered, and the
    logits are those `predictor.member_logits(data)` gives (same batches, same bits).
    `one_class`: warn of validation labels of one class (False: the caller refuses them).
    Probabilities in place of logits are warned of, with the fix for saved values (their log)
    where the predictor is an `nn.Identity` (saved logits, `SavedLogits` or the command line's)."""
    X, y = Source(data, batch_fn, name).labelled(predictor_device(predictor))
    logits = member_logits_of(predictor, X, batch_size)
    if isinstance(X, Tapped):
        where = predictor_device(predictor)
        y = check_labels(X.labels(), logits.shape[1], None, name, where, targets=True)
    assert y is not None
    y = move(y, logits.device, f"{name} labels")  # labels follow the scores
    _warn(logits, y, name, isinstance(predictor, nn.Identity), one_class)
    return logits, y


def labelled_batches(
    predictor: Any,
    data: Data,
    batch_size: int,
    batch_fn: BatchFn | None,
    name: str,
    stream_only: bool = False,
) -> Iterator[tuple[Tensor, Tensor]]:
    """`(member logits [M, B, C], labels [B])` per batch of labelled `data`, in one pass (a
    predictor that cannot stream, a lazy PEG/PEP or a foreign object, gives one batch;
    `stream_only`: `NotStreamable` instead)."""
    device = predictor_device(predictor)
    X, y = Source(data, batch_fn, name).labelled(device)
    tapped = X if isinstance(X, Tapped) else None
    if tapped is not None:
        batch_fn = None  # the stream carries its own
    try:
        batches = iter_member_logits_of(predictor, X, batch_size, batch_fn)
    except NotStreamable:
        if stream_only:
            raise
        batches = iter([member_logits_of(predictor, X, batch_size, batch_fn)])
    n = 0
    for logits in batches:
        rows = logits.shape[1]
        if tapped is not None:
            labels = tapped.take_labels()
            labels = check_labels(labels, rows, None, name, device, targets=True)
        else:
            assert y is not None
            labels = y[n : n + rows]
        n += rows
        yield logits, labels


def first_labelled(
    predictor: Any, data: Data, batch_size: int, batch_fn: BatchFn | None, name: str
) -> tuple[Tensor, Tensor] | None:
    """The first batch's member logits `[M, B, *]` and labels, as `labelled_batches` reads them
    (one forward of one batch), to read the kind of the outputs before reading all of them
    (`read_kind`); None, without a forward, where the labels are class indices `[N]` (a pair's,
    or a loader's first batch's: never dense) or the predictor cannot stream."""
    if is_pair(data, arrays=False):
        y = data[1]
        if getattr(y, "ndim", None) == 1:
            return None
    else:
        first = next(iter(Source(data, batch_fn, name).batches(batch_size)), None)
        if first is None or (first[1] is not None and first[1].ndim <= 1):
            return None
    batches = labelled_batches(predictor, data, batch_size, batch_fn, name, stream_only=True)
    try:
        return next(batches, None)
    except NotStreamable:
        return None
    finally:
        batches.close()


def _warn(logits: Tensor, y: Tensor, name: str, saved: bool, one_class: bool) -> None:
    """What is accepted yet meaningless to fit on: probabilities for logits (`saved`: saved
    values, whose fix is their log), one class in val."""
    warn_probabilities(logits[0], saved)
    if name == "val" and one_class:
        warn_one_class(y, name)


def only_multiclass(logits: Tensor, y: Tensor, owner: str, name: str = "val") -> None:
    """A ValueError naming `owner` and the kind unless member logits `[M, N, C]` (C >= 2) with
    labels `[N]` are multiclass: what works on multiclass input alone (label-free estimation,
    the Monitor) refuses the other kinds of `peg.source._kinds` by name."""
    if logits.ndim == 3 and logits.shape[-1] >= 2 and y.ndim == 1:
        return
    kind = read_kind(tuple(logits.shape[1:]), y, name=name)
    raise ValueError(
        f"{name}: {owner} takes multiclass logits [N, C] with labels [N], got {kind.describe()}:"
        f" {kind.kind} input is not supported by label-free estimation (multiclass only)"
    )


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


def scores_of(logits: Tensor, kind: str, name: str = "logits", start: int | None = None) -> Tensor:
    """Scores `[N, C]` from member logits `[M, N, C]`: log p̄ (`"log_probs"`, float64, any M;
    `peg.metrics.ensemble_log_probs`) or the raw logits of a one-member predictor (`"logits"`). The
    logits are checked once, by the one rule of every map (`check_finite_logits`: real and
    finite, a ValueError naming `name` and the first bad row, counted from `start`). Here, not
    in a calibrator's module: the calibrators, `LabelShift` and `PerformanceEstimator` share it."""
    check_finite_logits(logits, name, start)
    if logits.ndim != 3 or not logits.numel():
        raise ValueError(
            f"{name}: expected member logits [M, N, C] with M, N, C >= 1 (one model's logits "
            f"[N, C]: logits.unsqueeze(0)), got shape {tuple(logits.shape)}"
        )
    if kind == "log_probs":  # finite member logits: no second check (`ensemble_log_probs`'s)
        return log_probs_of(logits.detach().double())
    if logits.shape[0] != 1:
        raise ValueError(
            "scores: the map was fitted on the raw logits of a one-member predictor, got "
            f"{logits.shape[0]} members"
        )
    return logits[0].double()
