"""Turning what users pass (tensors, arrays, datasets, loaders) into tensors and batches.

Devices: data follows the model. See `model_device` for the rule every entry point applies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from peg.batches import (
    BatchFn,
    Tapped,
    batch_rows,
    check_data_device,
    describe_inputs,
    split_batch,
    take_rows,
    tensors,
    to_device,
)
from peg.output import OutputFnError

__all__ = ["check_data_device", "to_device"]  # defined in peg.batches, used from here too

Data = Any  # Tensor | np.ndarray | tuple[X, y] | Dataset | DataLoader


def _tensor(a: Any, name: str) -> Tensor:
    if isinstance(a, Tensor):
        return a
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a)
    raise TypeError(f"{name}: expected a Tensor or numpy array, got {type(a).__name__}")


def as_tensor(
    a: Any, name: str, device: torch.device | None = None, owner: str = "the model"
) -> Tensor:
    """`torch.as_tensor(a)` (detached) for metric inputs, refusing what is not numbers and what
    is on the `meta` device with an error naming `name` (see `check_data_device`)."""
    try:
        t = torch.as_tensor(a)
    except TypeError as e:
        raise TypeError(
            f"{name}: expected a Tensor or an array of numbers, got {type(a).__name__} ({e})"
        ) from None
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"{name}: not a rectangular array of numbers ({e})") from None
    check_data_device(t, name, device, owner)
    return t.detach()


def _split_batch(
    batch: Any, name: str, batch_fn: BatchFn | None = None, index: int | None = None
) -> tuple[Tensor, Tensor | None]:
    """A batch as tensors `(x, y)` for the paths that gather it (`as_xy`)."""
    x, y = split_batch(batch, batch_fn, name=name, index=index)
    if not isinstance(x, Tensor):
        raise TypeError(
            f"{name}: batches of structured inputs ({describe_inputs(x)}) cannot be gathered "
            "into one tensor here; this entry point takes tensor inputs (see "
            "docs/data.md#batches-of-any-shape for where mappings go)"
        )
    return x, y


def as_xy(
    data: Data,
    name: str = "data",
    need_labels: bool = True,
    device: torch.device | None = None,
    batch_fn: BatchFn | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Materialise `data` as `(X [N, ...], y [N])`, checked.

    Accepts a tuple `(X, y)` of tensors/arrays, a map-style Dataset or a DataLoader yielding
    `(x, y)` batches (iterated once, in order). Labels are returned as int64 where they are
    integral; `need_labels=False` allows data without labels (y is then None).

    Refused, with an error naming `name`: no samples, inputs without a batch dimension, as many
    labels as inputs not given, NaN or inf in floating-point inputs or labels, and data on the
    `meta` device (`device`: the model's, for the message; see `model_device`).
    """
    if (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and not isinstance(data[0], (tuple, list))
    ):
        X, y = _tensor(data[0], name), _tensor(data[1], name)
    elif isinstance(data, (Tensor, np.ndarray)):
        X, y = _tensor(data, name), None
    elif isinstance(data, (DataLoader, Dataset)):
        loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=512)
        xs, ys = [], []
        for j, batch in enumerate(loader):
            x, yb = _split_batch(batch, name, batch_fn, j)
            xs.append(x)
            if yb is not None:
                ys.append(yb)
        if not xs:
            raise ValueError(f"{name}: the data is empty (0 samples)")
        X = torch.cat(xs)
        y = torch.cat(ys) if ys else None
    else:
        raise TypeError(
            f"{name}: expected a tuple (X, y), a Dataset or a DataLoader, got {type(data).__name__}"
        )
    check_data_device(X, name, device)
    if X.ndim == 0:
        raise ValueError(f"{name}: expected inputs [N, ...], got a scalar")
    if X.shape[0] == 0:
        raise ValueError(f"{name}: the data is empty (0 samples)")
    check_finite(X, name)
    if y is not None:
        y = checked_labels(y, name, X.shape[0], device)
    if need_labels and y is None:
        raise ValueError(f"{name}: labels are needed: pass (X, y) or a loader yielding (x, y)")
    return X, y


def checked_labels(
    y: Tensor, name: str, rows: int | None = None, device: torch.device | None = None
) -> Tensor:
    """Labels `[N]` checked (`rows` of them if given; finite; not on `meta`), int64 where
    they are integral; a ValueError naming `name` otherwise."""
    check_data_device(y, f"{name} labels", device)
    if y.ndim == 0:
        raise ValueError(f"{name}: expected labels [N], got a scalar")
    if rows is not None and y.shape[0] != rows:
        raise ValueError(f"{name}: {rows} inputs but {y.shape[0]} labels")
    if torch.is_floating_point(y):
        if not torch.isfinite(y).all():
            bad = int((~torch.isfinite(y)).sum())
            raise ValueError(f"{name}: the labels contain NaN or inf ({bad} values)")
    elif y.is_complex():
        raise ValueError(f"{name}: expected integer labels or float targets, got {y.dtype}")
    else:
        y = y.long()
    return y


def check_finite(X: Any, name: str) -> None:
    """Raise a ValueError naming `name` if floating-point inputs hold NaN or inf (every tensor
    of structured inputs)."""
    if not isinstance(X, Tensor):
        for t in tensors(X):
            check_finite(t, name)
        return
    if (torch.is_floating_point(X) or X.is_complex()) and not torch.isfinite(X).all():
        rows = int((~torch.isfinite(X)).reshape(len(X), -1).any(1).sum()) if X.ndim else 1
        raise ValueError(
            f"{name}: the inputs contain NaN or inf ({rows} of {len(X) if X.ndim else 1} samples)"
        )


def iter_batches(
    data: Data,
    batch_size: int,
    batch_fn: BatchFn | None = None,
    name: str = "X",
    need_labels: bool = False,
) -> Iterator[tuple[Any, Tensor | None]]:
    """Yield `(inputs, y)` per batch (`y` None where there are none; `peg.batches`' conventions).

    A tensor or array is sliced into `batch_size` rows (no labels), a tuple `(X, y)` of them
    too; a mapping of tensors (`{"input_ids": [N, L], ..., "labels": [N]}`) is sliced alike;
    a Dataset is batched by a `DataLoader(batch_size=batch_size)`; a DataLoader (or a `Tapped`)
    gives its own batches, split by `split_batch(batch, batch_fn)`.
    """
    if isinstance(data, (Tensor, np.ndarray)) or (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and isinstance(data[0], (Tensor, np.ndarray))
    ):
        X, y = (data, None) if isinstance(data, (Tensor, np.ndarray)) else data
        X = _tensor(X, name)
        y = _tensor(y, f"{name} labels") if y is not None and need_labels else None
        if y is None and need_labels:
            raise ValueError(f"{name}: labels are needed: pass (X, y) or a loader yielding (x, y)")
        for start in range(0, X.shape[0], batch_size):
            yield (
                X[start : start + batch_size],
                (None if y is None else y[start : start + batch_size]),
            )
        return
    if isinstance(data, Mapping):
        inputs, y = split_batch(data, batch_fn, name=name, need_labels=need_labels)
        rows = batch_rows(inputs, name)
        for start in range(0, rows, batch_size):
            yield (
                take_rows(inputs, start, start + batch_size),
                (None if y is None else y[start : start + batch_size]),
            )
        return
    if isinstance(data, Dataset):
        data = DataLoader(data, batch_size=batch_size)
    if isinstance(data, DataLoader):
        for j, batch in enumerate(data):
            yield split_batch(batch, batch_fn, name=name, index=j, need_labels=need_labels)
        return
    if isinstance(data, (tuple, list)) and len(data) == 2:
        for inputs, _ in iter_batches(data[0], batch_size, batch_fn, name):
            yield inputs, None
        return
    raise TypeError(
        f"{name}: expected a Tensor, numpy array, mapping of tensors, Dataset or DataLoader, "
        f"got {type(data).__name__}"
    )


def iter_inputs(X: Data, batch_size: int, batch_fn: BatchFn | None = None) -> Iterator[Any]:
    """Yield input batches `[B, ...]` (or structured inputs) of `X` (see `iter_batches`);
    a `Tapped` records each batch's labels as it passes."""
    if isinstance(X, Tapped):
        batches = iter_batches(X.data, batch_size, X.batch_fn, X.name, need_labels=True)
        for j, (inputs, y) in enumerate(batches):
            rows = batch_rows(inputs, X.name)
            if y is None or y.ndim == 0 or len(y) != rows:
                got = "no labels" if y is None else f"labels of shape {tuple(y.shape)}"
                raise ValueError(f"{X.name}: batch {j} has {rows} inputs but {got}")
            X.labels_seen.append(y)
            yield inputs
        return
    for inputs, _ in iter_batches(X, batch_size, batch_fn, "X"):
        yield inputs


def probe_inputs(
    data: Data, name: str, batch_fn: BatchFn | None = None, device: torch.device | None = None
) -> Any:
    """Inputs of `data` to probe a model with (`diagnose` takes two rows), checked.

    Tensors and `(X, y)` pairs go through `as_xy` (labels not needed); loaders, Datasets and
    mappings are read batch by batch (any shape, `peg.batches`), each checked for NaN/inf and
    `meta`, and only the first batch's first two rows kept: nothing is gathered."""
    if isinstance(data, (Tensor, np.ndarray)) or (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and isinstance(data[0], (Tensor, np.ndarray))
    ):
        return as_xy(data, name, need_labels=False, device=device, batch_fn=batch_fn)[0]
    first = None
    for inputs, _ in iter_batches(data, 512, batch_fn, name):
        for t in tensors(inputs):
            check_data_device(t, name, device)
        check_finite(inputs, name)
        if first is None:
            first = take_rows(inputs, 0, 2)
    if first is None:
        raise ValueError(f"{name}: the data is empty (0 samples)")
    return first


def num_batches(X: Data, batch_size: int) -> int | None:
    """Number of batches `iter_inputs` will yield, when it is known in advance."""
    if isinstance(X, Tapped):
        return num_batches(X.data, batch_size)
    if isinstance(X, (Tensor, np.ndarray)):
        return -(-X.shape[0] // batch_size)
    if isinstance(X, DataLoader):
        try:
            return len(X)
        except TypeError:
            return None
    return None


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Return `value` if it is an int >= minimum, else raise a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def check_seed(seed: Any) -> int:
    """`seed` as an int if it is a non-negative integer, else a ValueError naming it."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    return int(seed)


def check_number(value: Any, name: str, allow_zero: bool = False) -> float:
    """Return `value` as a float if it is a finite number > 0 (>= 0 with `allow_zero`), else
    raise a ValueError naming `name`."""
    ok = (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}")
    return float(value)


# ---------------------------------------------------------------- devices
def model_device(
    model: nn.Module, name: str = "model", data: tuple[str, Tensor] | None = None
) -> torch.device:
    """The device inputs are moved to for `model`: where its weights are.

    The device rule, the same at every entry point (fit, `member_logits`, `evaluate`, `train`,
    temperature scaling), is *data follows the model*:

    - inputs and labels are moved to this device batch by batch (tensors, numpy arrays, the
      batches of a Dataset or DataLoader), so CPU data works with a model on a GPU without a
      copy of the whole set on the device, and data on another device is moved too;
    - what no move can fix is refused before any work, with an error naming the argument and
      both devices: data on the `meta` device (shapes without values, `check_data_device`) and a
      model with weights on `meta` (not loaded; this function);
    - metrics have no model: labels follow the predictions, `pred`'s device.

    The device is that of the first parameter (or buffer); a model without either counts as on
    the CPU. A model spread over several devices gets its inputs on the first one's.
    `data` (argument name, tensor) is only used in the message.
    """
    tensors = [*model.named_parameters(), *model.named_buffers()]
    empty = [n for n, t in tensors if t.device.type == "meta"]
    if empty:
        where = f"; {data[0]} is on {data[1].device}" if data is not None else ""
        raise ValueError(
            f"{name}: weights on the meta device (shapes without values: {empty[:3]}){where}; "
            f"load the weights first, e.g. model.to_empty(device='cpu') then load_state_dict"
        )
    return weights_device(model)


def weights_device(model: nn.Module) -> torch.device:
    """The device of the first parameter (or buffer) of `model`, the CPU if it has none;
    unchecked (see `model_device`)."""
    first = next(model.parameters(), None)
    if first is None:
        first = next(model.buffers(), None)
    return first.device if first is not None else torch.device("cpu")


# ---------------------------------------------------------------- forward passes
def input_error(error: BaseException, x: Any, name: str) -> ValueError:
    """The error for a model that cannot run on inputs `x` (the batch it failed on)."""
    detail = next(iter(str(error).strip().splitlines()), "")
    hints = []
    if isinstance(x, Tensor):
        shown = f"inputs of shape [{', '.join(['N', *map(str, x.shape[1:])])}], dtype {x.dtype}"
        if x.ndim == 1:
            hints.append("it is 1-D: add a feature dimension, e.g. X.unsqueeze(1)")
        if not (torch.is_floating_point(x) or x.is_complex()):
            hints.append(f"it holds {x.dtype}: most models take float32, e.g. X.float()")
    else:
        call = "model(**inputs)" if isinstance(x, Mapping) else "model(inputs)"
        shown = f"inputs {describe_inputs(x)} (called as {call})"
    return ValueError(
        f"{name}: the model cannot run on {shown} "
        f"({type(error).__name__}: {detail}); pass inputs of the shape and dtype the model "
        "expects" + "".join(f"; {h}" for h in hints)
    )


def training_modules(model: nn.Module) -> list[nn.Module]:
    """`model` and its submodules that are in training mode: a plain walk over `_modules`,
    several times cheaper than `model.modules()` (which builds every name), for per-batch use."""
    found, todo = [], [model]
    while todo:
        module = todo.pop()
        if module.training:
            found.append(module)
        todo.extend(m for m in module._modules.values() if m is not None)
    return found


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode inside the block; every submodule's own mode restored after it."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, mode in modes:
            m.training = mode


def diagnose(forward: Callable[[Any], Any], x: Any, name: str) -> Any:
    """`forward(x[:2])` (two rows of every tensor of structured inputs), turning a failure into
    `input_error` (errors of an `output_fn` pass).

    Used to probe a model before long work, and to explain a failed batch: if two rows of the
    inputs already fail, the inputs do not fit the model.
    """
    try:
        out = forward(take_rows(x, 0, 2))
    except OutputFnError:
        raise
    except Exception as e:
        raise input_error(e, x, name) from e
    if isinstance(x, Tensor) and x.ndim == 1 and isinstance(out, Tensor) and out.ndim != 2:
        raise ValueError(
            f"{name}: 1-D inputs [N] gave outputs of shape {tuple(out.shape)}, not logits "
            "[B, C]; models take [N, features, ...]: add a feature dimension, e.g. X.unsqueeze(1)"
        )
    return out
