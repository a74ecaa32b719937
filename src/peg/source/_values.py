"""Checks of the values users pass: numbers, finite inputs, labels (errors naming the argument)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from peg.source._devices import check_data_device
from peg.source.batches import tensors


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
        refuse_bool_labels(y, name)
        y = y.long()
    return y


def refuse_bool_labels(y: Tensor, name: str) -> None:
    """A ValueError naming `name` for bool labels: as class indices they can only say 0 or 1,
    so with more classes the others collapse silently (the command line refuses them too)."""
    if y.dtype == torch.bool:
        raise ValueError(
            f"{name}: expected integer class indices, got bool labels (they can only say class "
            "0 or 1); convert them with y.long() if True means class 1"
        )


def warn_one_class(y: Tensor, name: str) -> None:
    """Warn, naming `name`, when classification labels `y` `[N]` hold one class only: a
    calibration fitted on them is meaningless (a temperature or a scale without bound)."""
    if len(y) > 1 and not torch.is_floating_point(y) and bool(y.min() == y.max()):
        warnings.warn(
            f"{name}: every label is {int(y.min())} (one class only): calibrating on it makes "
            "no sense (the fitted temperature or scale grows without bound); pass validation "
            "data with every class",
            stacklevel=3,
        )


def warn_absent_classes(y: Tensor, classes: int, name: str, what: str) -> None:
    """Warn, naming `name`, when some of the `classes` never appear in the labels `y` `[N]`: a
    calibrator with parameters per class (`what`) learns nothing of them and drives their
    probability down (tests/methods/test_calibrators.py: the NLL of a test point of the absent
    class rises from about 0.5 to 2-22 nats, to infinity with unregularised Dirichlet)."""
    seen = torch.zeros(classes, dtype=torch.bool, device=y.device)
    seen[y.long()] = True
    absent = torch.nonzero(~seen).flatten().tolist()
    if absent and len(absent) < classes - 1:  # one class only: `warn_one_class`
        shown = f"{absent[:10]}" + (" ..." if len(absent) > 10 else "")
        warnings.warn(
            f"{name}: classes {shown} ({len(absent)} of {classes}) never appear in the labels; "
            f"{what} fits parameters per class and drives their probability down (a test point "
            "of one may get a very large, even infinite, NLL): pass validation data with every "
            "class, or use temperature scaling (one parameter for all classes)",
            stacklevel=3,
        )


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


def check_finite_logits(logits: Tensor, name: str, start: int | None = None) -> None:
    """The one rule for the logits a calibrator, `peg.LabelShift` or a conformal predictor maps
    (member logits `[M, N, C]`, or `[N, C]`): real and finite. NaN and +inf have no
    probability; -inf (a class ruled out) is refused too, as the metrics refuse it
    (`peg.metrics._inputs.checked_pred`): not every map can carry it to a probability of 0
    (binning, isotonic regression, ensemble temperature scaling's uniform part give it mass;
    matrix and Dirichlet maps spread it to the other classes), so no map gets it. A ValueError
    naming `name`, the first offending row and how many; `start`: the rows are a batch whose
    first is row `start` of the whole input (None: the rows are the whole input)."""
    if logits.is_complex():
        raise ValueError(f"{name}: expected real logits, got dtype {logits.dtype}")
    if not logits.is_floating_point() or logits.numel() == 0:
        return
    if bool(torch.isfinite(logits.sum(-1)).all()):  # one pass, one synchronisation
        return
    bad = ~torch.isfinite(logits).all(-1)
    while bad.ndim > 1:  # [M, N] -> [N]: a row is bad when any member's is
        bad = bad.any(0)
    bad = bad.reshape(-1)  # one row [C]: [1]
    if not bool(bad.any()):  # finite logits whose sum overflowed
        return
    row = int(bad.nonzero()[0, 0])
    values = logits[..., row, :]
    kinds = [
        kind
        for kind, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf))
        if bool(test(values).any())
    ]
    start = start or 0
    rows = f" (rows {start}-{start + len(bad) - 1} of {name})" if start else ""
    raise ValueError(
        f"{name}: the logits hold NaN or ±inf in {int(bad.sum())} of {len(bad)} rows{rows}, the "
        f"first in row {start + row} ({' and '.join(kinds)}); logits must be finite (a class "
        "ruled out: a large negative logit, not -inf)"
    )
