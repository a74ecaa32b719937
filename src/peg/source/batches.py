"""Batches of any shape: how peg splits a batch into inputs and labels and calls the model.

The conventions, with zero configuration (HuggingFace's for mappings):

- a batch that is a **mapping** (`{"input_ids": ..., "attention_mask": ..., "labels": ...}`) is
  split into labels (`"labels"`, else `"label"`) and inputs (every other entry); the model is
  called as `model(**inputs)`;
- a **tuple or list** batch is `(x, y, *ignored)` (a 1-tuple `(x,)` has no labels); `x` may
  itself be a mapping, then called as `model(**x)`;
- a **tensor** (or numpy array) batch is inputs without labels, `model(x)`;
- anything else goes through one hook, `batch_fn(batch) -> (inputs, y)` (`y` may be None where
  no labels are needed), accepted by `Ensemble.member_logits`, `evaluate` and, as a constructor
  argument (kept by `sklearn.base.clone`), by the methods that take data.

Where batches go is `peg.source._devices`' rule (data follows the model, labels follow the scores),
applied by `peg.source.Source.batches`. The number of rows of inputs is the first dimension of
their tensors, which must agree (`batch_rows`); `take_rows` slices every tensor of structured
inputs alike.

    loader = DataLoader(tokenized, batch_size=32)        # yields dicts with "labels"
    probs = ensemble.predict_proba(loader)                # model(**inputs), labels ignored
    peg.evaluate(ensemble, loader)                        # labels from "labels"
    peg.evaluate(ensemble, loader, batch_fn=lambda b: (b["x"], b["target"]))
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from numbers import Number
from typing import Any, TypeGuard

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

BatchFn = Callable[[Any], tuple[Any, Any]]
LABEL_KEYS = ("labels", "label")

__all__ = [
    "LABEL_KEYS",
    "BatchFn",
    "batch_rows",
    "call_model",
    "check_batch_fn",
    "describe_inputs",
    "split_batch",
    "take_rows",
]


def _where(name: str, index: int | None) -> str:
    return f"{name}: batch {index}" if index is not None else f"{name}: the batch"


def check_batch_fn(batch_fn: Any, name: str = "batch_fn") -> BatchFn | None:
    """`batch_fn` if it is None or callable, else a TypeError naming it."""
    if batch_fn is not None and not callable(batch_fn):
        raise TypeError(
            f"{name}: expected None or a callable batch_fn(batch) -> (inputs, y), "
            f"got {type(batch_fn).__name__}"
        )
    return batch_fn


def from_numpy(a: np.ndarray) -> Tensor:
    """`a` as a tensor sharing its memory, read-only arrays too (a memory-mapped `.npy` of saved
    logits is read batch by batch, never copied whole): peg never writes into users' data, so
    PyTorch's warning about non-writable arrays does not apply. A big-endian array (a `.npy`
    written on another machine, `dtype='>f4'`), which torch cannot hold, is byte-swapped to
    native order: a copy, of the batch read where a source slices it first."""
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(a)


def is_pandas(x: Any) -> bool:
    """Whether `x` is a pandas object (a DataFrame, a Series, an Index), told without importing
    pandas."""
    return type(x).__module__.split(".")[0] == "pandas" and hasattr(x, "to_numpy")


def as_array(x: Any) -> Any:
    """Array-likes as scikit-learn reads them: a pandas object, or a list or tuple of numbers
    (or of equal rows of numbers, or of strings), as a NumPy array; anything else as it is (a
    tensor, an array, a pair `(X, y)`: items that are not numbers, or rows of unequal shapes)."""
    if isinstance(x, (Tensor, np.ndarray)):
        return x
    if is_pandas(x):
        a = x.to_numpy()
        if a.dtype.kind == "O":  # a nullable (Int64) or mixed column: its values' own type
            try:
                typed = np.asarray(a.tolist())
            except (ValueError, TypeError):
                return a
            return a if typed.dtype.kind == "O" else typed
        return a
    if not isinstance(x, (tuple, list)) or not x:
        return x
    if any(isinstance(v, (Tensor, np.ndarray, Mapping)) or is_pandas(v) for v in x):
        return x  # structured inputs, or a pair (X, y) of arrays
    first = x[0][0] if isinstance(x[0], (tuple, list)) and x[0] else x[0]
    if not isinstance(first, (Number, str, np.generic)):
        return x  # not numbers (batches, say): nothing converted, nothing copied
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):  # rows of unequal shapes: not an array
        return x
    return x if a.dtype.kind == "O" else a


def is_pair(data: Any, *, arrays: bool = True) -> TypeGuard[tuple[Any, Any] | list[Any]]:
    """Whether `data` is a pair `(X, y)`, a tuple or a list of two, whose inputs are a tensor or
    an array (what `Source.xy` takes as it is and every entry point slices in memory); with
    `arrays` False, inputs of any kind (a mapping, a list of rows: structured inputs with their
    labels). The one test of a pair in peg."""
    return (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and (not arrays or isinstance(data[0], (Tensor, np.ndarray)))
    )


def array_likes(data: Any) -> Any:
    """`data` with its array-likes as NumPy arrays (`as_array`: pandas objects, lists of
    numbers), and so a pair's items; anything else as it is."""
    data = as_array(data)
    if is_pair(data, arrays=False):
        X, y = as_array(data[0]), as_array(data[1])
        if isinstance(X, (Tensor, np.ndarray)) and (X is not data[0] or y is not data[1]):
            return (X, y) if isinstance(data, tuple) else [X, y]  # a pair (X, y)
    return data


def _leaf(x: Any) -> Any:
    """Numpy arrays become tensors (shared memory); anything else is left as it is."""
    return from_numpy(x) if isinstance(x, np.ndarray) else x


def _inputs(x: Any, where: str) -> Any:
    """Batch inputs: a tensor (an array converted), or a mapping / tuple / list of them."""
    if isinstance(x, Mapping):
        return {k: _leaf(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_leaf(v) for v in x) if isinstance(x, list) else tuple(map(_leaf, x))
    if isinstance(x, (Tensor, np.ndarray)):
        return _leaf(x)
    raise TypeError(
        f"{where}: expected inputs that are a Tensor, a numpy array or a mapping of them, got "
        f"{type(x).__name__}; pass batch_fn=lambda batch: (inputs, y) for other batch shapes"
    )


def split_batch(
    batch: Any,
    batch_fn: BatchFn | None = None,
    *,
    name: str = "X",
    index: int | None = None,
    need_labels: bool = False,
) -> tuple[Any, Any]:
    """`(inputs, y)` of one batch by the conventions of this module (`y` None if it has none).

    `batch_fn`, when given, does the split instead. `need_labels`: a batch without labels is a
    ValueError naming `name`, the batch `index` and what was expected.
    """
    where = _where(name, index)
    if batch_fn is not None:
        out = batch_fn(batch)
        if not is_pair(out, arrays=False):
            got = (
                f"{type(out).__name__} of {len(out)}"
                if isinstance(out, (tuple, list))
                else (type(out).__name__)
            )
            raise TypeError(f"batch_fn: must return a pair (inputs, y), got {got} ({where})")
        x, y = out
    elif isinstance(batch, Mapping):
        key = next((k for k in LABEL_KEYS if k in batch), None)
        x = {k: v for k, v in batch.items() if k != key}
        y = batch[key] if key is not None else None
        if y is None and need_labels:
            raise ValueError(
                f"{where} is a mapping without 'labels' or 'label' (keys: {list(batch)[:8]}); "
                "pass batch_fn=lambda batch: (inputs, batch['<label key>'])"
            )
        if not x:
            raise ValueError(
                f"{where} is a mapping with labels and no inputs (keys: {list(batch)})"
            )
    elif isinstance(batch, (tuple, list)):
        if len(batch) == 0:
            raise ValueError(f"{where} is an empty {type(batch).__name__}; expected (x, y, ...)")
        x, y = batch[0], (batch[1] if len(batch) > 1 else None)
    else:
        x, y = batch, None
    if y is None and need_labels:
        raise ValueError(
            f"{where} has no labels: expected a tuple (x, y, ...), a mapping with 'labels' or "
            "'label', or batch_fn=lambda batch: (inputs, y)"
        )
    x = _inputs(x, where)
    if y is not None:
        y = _leaf(y)
        if not isinstance(y, Tensor):
            try:
                y = torch.as_tensor(y)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(
                    f"{where}: expected labels that are a Tensor or an array, got "
                    f"{type(y).__name__}"
                ) from None
    return x, y


def call_model(model: Callable[..., Any], inputs: Any) -> Any:
    """`model(**inputs)` for a mapping, `model(inputs)` for anything else."""
    if not isinstance(inputs, Tensor) and isinstance(inputs, Mapping):
        return model(**inputs)
    return model(inputs)


def call_functional(module: nn.Module, state: Mapping[str, Tensor], inputs: Any) -> Any:
    """`module` run with the tensors `state` (`torch.func.functional_call`) on `inputs`, called
    as `call_model` calls it: `module(**inputs)` for a mapping, `module(inputs)` otherwise."""
    if isinstance(inputs, Mapping):
        return functional_call(module, dict(state), (), dict(inputs))
    return functional_call(module, dict(state), (inputs,))


def leaves(inputs: Any, path: str = "") -> list[tuple[str, Tensor]]:
    """Every tensor in `inputs`, with where it is (`['input_ids']`, `[0]`; '' for a tensor)."""
    if isinstance(inputs, Tensor):
        return [(path, inputs)]
    if isinstance(inputs, Mapping):
        return [leaf for k, v in inputs.items() for leaf in leaves(v, f"{path}[{k!r}]")]
    if isinstance(inputs, (tuple, list)):
        return [leaf for i, v in enumerate(inputs) for leaf in leaves(v, f"{path}[{i}]")]
    return []


def tensors(inputs: Any) -> list[Tensor]:
    """The tensors of `inputs` (itself if it is one)."""
    return [t for _, t in leaves(inputs)]


def batch_rows(inputs: Any, name: str = "X") -> int:
    """The number of rows of `inputs`: the first dimension of its tensors, which must agree."""
    if isinstance(inputs, Tensor) and inputs.ndim > 0:  # per call: the common case first
        return int(inputs.shape[0])
    rows = {path: int(t.shape[0]) for path, t in leaves(inputs) if t.ndim > 0}
    if not rows:
        raise ValueError(
            f"{name}: the inputs hold no tensor with a batch dimension "
            f"({describe_inputs(inputs)}); expected tensors [N, ...]"
        )
    if len(set(rows.values())) > 1:
        shown = ", ".join(f"{p or 'inputs'}: {n}" for p, n in list(rows.items())[:6])
        raise ValueError(
            f"{name}: the inputs disagree on the number of rows ({shown}); every tensor of a "
            "batch needs the same first dimension"
        )
    return next(iter(rows.values()))


def take_rows(inputs: Any, start: int, stop: int) -> Any:
    """Rows `start:stop` of every tensor of `inputs` (with a batch dimension); the rest as is."""
    if isinstance(inputs, Tensor):
        return inputs[start:stop] if inputs.ndim > 0 else inputs
    if isinstance(inputs, Mapping):
        return {k: take_rows(v, start, stop) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        taken = [take_rows(v, start, stop) for v in inputs]
        return taken if isinstance(inputs, list) else tuple(taken)
    return inputs


def describe_inputs(inputs: Any) -> str:
    """`shape [N, 7], dtype int64` for a tensor; `{'input_ids': [N, 7] int64, ...}` else."""
    if isinstance(inputs, Tensor):
        return f"shape [{', '.join(['N', *map(str, inputs.shape[1:])])}], dtype {inputs.dtype}"
    shown = [
        f"{p}: [{', '.join(['N', *map(str, t.shape[1:])])}] {t.dtype}"
        for p, t in leaves(inputs)[:6]
    ]
    return f"{type(inputs).__name__} {{{', '.join(shown)}}}"


def signature(inputs: Any) -> tuple[Any, ...]:
    """What the cost of a forward pass on `inputs` depends on besides the number of rows: every
    tensor's place, row shape, dtype and device type (a cache key)."""
    if isinstance(inputs, Tensor):  # what `leaves` gives for a tensor, without building it
        return (("", tuple(inputs.shape[1:]), inputs.dtype, inputs.device.type),)
    return tuple((p, tuple(t.shape[1:]), t.dtype, t.device.type) for p, t in leaves(inputs))
