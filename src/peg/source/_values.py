"""Checks of the values users pass: numbers, finite inputs, labels (errors naming the argument)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.source._devices import check_data_device
from peg.source.batches import as_array, from_numpy, tensors

STRING_LABELS = "pass classes=[...] to say which column each names"


def as_tensor(
    a: Any, name: str, device: torch.device | None = None, owner: str = "the model"
) -> Tensor:
    """`torch.as_tensor(a)` (detached) for metric inputs, refusing what is not numbers and what
    is on the `meta` device with an error naming `name` (see `check_data_device`)."""
    a = as_array(a)  # lists, tuples, pandas objects: NumPy arrays
    if isinstance(a, np.ndarray):
        refuse_names(a, name)
        a = from_numpy(a)  # big-endian arrays byte-swapped
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


def refuse_names(a: np.ndarray, name: str) -> None:
    """A TypeError naming `name` for an array of strings or objects where numbers are read
    (`class_indices` maps labels that name classes, given the `classes`)."""
    if a.dtype.kind in "USO":
        first = a.reshape(-1)[:3].tolist()
        strings = a.dtype.kind in "US" or any(isinstance(v, str) for v in first)
        shown = ", ".join(map(repr, first)) + (", ..." if a.size > 3 else "")
        raise TypeError(
            f"{name}: expected numbers, got {'strings' if strings else 'objects'} ({shown})"
            + (f"; string labels: {STRING_LABELS}" if strings else "")
        )


def class_indices(y: Any, name: str, classes: Any = None) -> Any:
    """Labels `y` `[N]` as users pass them, as numbers peg reads: a tensor or an array as it is,
    an array-like (a list, a tuple, a pandas Series) as a NumPy array. With `classes` (the
    class of each logit column, in order: names or numbers), each label is replaced by the
    index of its class (int64), and a label that is none of them is a ValueError naming it;
    without, labels that are strings are a TypeError saying to pass `classes`."""
    y = as_array(y)
    if classes is None:
        if isinstance(y, np.ndarray):
            refuse_names(y, name)
        return y
    names = as_array(classes)
    if not isinstance(names, np.ndarray) or names.ndim != 1 or len(names) < 2:
        raise ValueError(
            f"classes: expected the class of each logit column, in order (a list of at least "
            f"2 names), got {classes!r}"[:300]
        )
    index = {v: i for i, v in enumerate(names.tolist())}
    if len(index) != len(names):
        raise ValueError(f"classes: names a class twice ({names.tolist()[:10]})")
    values = y.detach().cpu().numpy() if isinstance(y, Tensor) else np.asarray(y)
    if values.ndim != 1:
        raise ValueError(f"{name}: expected labels [N], got shape {tuple(values.shape)}")
    try:
        seen, inverse = np.unique(values, return_inverse=True)  # one look-up per distinct label
    except TypeError:  # labels of types that do not compare (strings and numbers)
        raise TypeError(f"{name}: labels of mixed types ({values[:3].tolist()} ...)") from None
    codes = np.array([index.get(v, -1) for v in seen.tolist()], dtype=np.int64)
    if (codes < 0).any():
        bad = seen[codes < 0][0]
        row = int(np.flatnonzero(values == bad)[0])
        raise ValueError(
            f"{name}: label {bad.item()!r} (row {row}) is none of classes {names.tolist()[:10]}"
        )
    out = codes[inverse.reshape(-1)]
    return torch.from_numpy(out) if isinstance(y, Tensor) else out


def check_labels(
    y: Any,
    n: int | None,
    c: int | None = None,
    name: str = "y",
    device: torch.device | None = None,
    *,
    targets: bool = False,
) -> Tensor:
    """The one check of labels in peg: `y` `[n]` (any count where `n` is None) as a tensor, with
    an error naming `name`. Two readings, one for each moment labels are checked:

    - `targets=True`, as the data layer reads labelled data (`Source.xy`, `Source.rows`, the
      labels a `Tapped` source recorded), before the predictions say what the labels are:
      class labels or regression targets `[N, ...]`, finite; int64 where integral (bool
      refused). `device`: the model's, named in the refusal of `meta` labels; not moved.
    - `targets=False`, against predictions `[n, c]`: class indices `[n]`, integers in
      `[0, c)` (`c` None: the number of classes not known yet, so only >= 0), as int64 moved
      to `device`, the predictions' (labels follow the scores; `meta` refused).
    """
    where, owner = (f"{name} labels", "the model") if targets else (name, "pred")
    t = as_tensor(y, where, device, owner)
    if targets and t.ndim == 0:
        raise ValueError(f"{name}: expected labels [N], got a scalar")
    if not targets and t.ndim != 1:
        raise ValueError(
            f"{name}: expected integer labels of shape [{n}], got shape {tuple(t.shape)}"
        )
    if n is not None and t.shape[0] != n:
        raise ValueError(
            f"{name}: {n} inputs but {t.shape[0]} labels"
            if targets
            else f"{name}: expected {n} labels (N of pred), got {t.shape[0]}"
        )
    if not targets and t.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one label (N >= 1), got none")
    if t.is_complex():
        raise ValueError(
            f"{name}: expected integer labels or float targets, got {t.dtype}"
            if targets
            else f"{name}: expected integer labels, got dtype {t.dtype}"
        )
    refuse_bool_labels(t, name)
    if t.is_floating_point():
        if targets:  # class labels or regression targets: finite, as they are
            if not torch.isfinite(t).all():
                bad = int((~torch.isfinite(t)).sum())
                raise ValueError(f"{name}: the labels contain NaN or inf ({bad} values)")
            return t
        bad = ~torch.isfinite(t) | (t != t.round())
        if bad.any():
            raise ValueError(
                f"{name}: expected integer labels, got non-integer float values "
                f"(e.g. {t[bad][0].item()})"
            )
    t = t.long()
    if targets:
        return t
    lo, hi = torch.stack(torch.aminmax(t)).tolist()  # one synchronisation
    if c is None and lo < 0:
        raise ValueError(f"{name}: expected class indices >= 0, got min {lo}")
    if c is not None and (lo < 0 or hi >= c):
        raise ValueError(
            f"{name}: expected labels in [0, {c}) (C = {c}), got min {lo} and max {hi}"
        )
    return t if device is None else t.to(device)


def regression_targets(y: Tensor, width: int) -> bool:
    """The one rule that tells regression targets from class labels (`peg.evaluate`, the fits,
    `compare`): integer labels are class labels; floating-point labels are class labels too
    when every one is a whole number in [0, C) of a classifier's C = `width` outputs (labels
    read from a CSV or a pandas column come as floats), and regression targets otherwise (for
    Gaussian heads, outputs `[B, 2]`: mean, log-variance). So targets that are all 0.0 or 1.0
    on a two-column output are read as the labels of a binary classifier."""
    if not torch.is_floating_point(y):
        return False
    whole = (y == y.round()) & (y >= 0) & (y < width)  # NaN: not whole
    return not bool(whole.all())


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


def refuse_one_class(y: Tensor, name: str, what: str) -> None:
    """A ValueError naming `name` when class labels `y` `[N]` hold one class only: a map fitted
    on them (`what`) cannot learn anything of the classes' probabilities (a temperature or a
    scale driven to its bound, a class's prior to 1). Methods that only choose a scale on them
    (PEG, PEP) are warned instead (`warn_one_class`)."""
    if len(y) > 1 and not torch.is_floating_point(y) and bool(y.min() == y.max()):
        raise ValueError(
            f"{name}: every label is {int(y.min())} (one class only): {what} cannot learn a map "
            "of the classes' probabilities from one class; pass validation data with at least "
            "2 classes (every class, ideally)"
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
