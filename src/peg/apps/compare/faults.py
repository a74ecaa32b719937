"""What `peg.compare` does when a method cannot run: found before any fitting where that is cheap
(`precheck`: the reason the method is left out, listed in `Comparison.skipped`), or caught when
it fails (`failure`: a table row's `"failed"`: the exception's type and message, and what the user
can do), so that one failing method never loses the others' work. Data that no method can run
on is refused once, before any fitting (`check_data`), not by every method in turn.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from peg._forward import diagnose, eval_mode
from peg.apps import registry
from peg.apps.bench.spec import MethodSpec
from peg.methods._predictors import stateless
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.dropout import MCDropout, dropout_modules
from peg.methods.laplace._torch import INSTALL
from peg.methods.laplace.laplace import Laplace
from peg.output import model_output
from peg.source import Data, Source, is_pair
from peg.source._devices import model_device, move
from peg.source._values import check_labels, regression_targets, warn_one_class
from peg.source.batches import BatchFn, call_model, take_rows

# (a piece of the message, what the user can do); the first match wins
HINTS: tuple[tuple[str, str], ...] = (
    (
        "linear last layer",
        "laplace-torch needs the model's output to come from an nn.Linear layer (its last "
        "module): end the model with the Linear layer (an activation after it, e.g. a ReLU, "
        "has to go), give last_layer_name=, or leave Laplace out",
    ),
    ("out of memory", "give a smaller batch_size (--batch-size)"),
    ("laplace-torch", f"install laplace-torch: {INSTALL}"),
)


def last_module(model: nn.Module) -> nn.Module:
    """The model's last leaf module in registration order (the one laplace-torch's last-layer
    approximation takes for the output layer)."""
    leaves = [m for m in model.modules() if not list(m.children())]
    return leaves[-1] if leaves else model


# why a method that changes or samples a model's weights is left out on saved logits
NO_WEIGHTS = "saved logits (a model without parameters): no weights to change or sample"


def precheck(spec: MethodSpec, model: nn.Module) -> str | None:
    """Why `spec` cannot apply to `model`, found without fitting anything; None if it may."""
    builder = registry.entry(spec.method)
    method = getattr(builder, "method", None)
    maps_logits = isinstance(method, type) and issubclass(method, Calibrator)
    if stateless(model) and not (maps_logits or issubclass(builder, registry.Base)):
        return NO_WEIGHTS
    if method is MCDropout and "insert" not in spec.options and not dropout_modules(model):
        return (
            "the model has no dropout layer (give the method insert=p to put one before its "
            "last layer)"
        )
    if method is Laplace:
        if importlib.util.find_spec("laplace") is None:
            return f"laplace-torch is not installed ({INSTALL})"
        last_layer = spec.options.get("subset_of_weights", "last_layer") == "last_layer"
        if last_layer and spec.options.get("last_layer_name") is None:
            last = last_module(model)
            if not isinstance(last, nn.Linear):
                return (
                    f"the model's last module is a {type(last).__name__}, not nn.Linear: "
                    "laplace-torch's last-layer approximation needs the output to come from a "
                    "Linear layer (give last_layer_name=, or end the model with the Linear)"
                )
    return None


def hint(error: BaseException) -> str:
    """What the user can do about `error` (empty when nothing specific is known)."""
    text = str(error).lower()
    for piece, advice in HINTS:
        if piece in text:
            return advice
    if isinstance(error, ImportError):
        return "install the missing package, or leave the method out"
    return ""


def failure(error: BaseException) -> dict[str, Any]:
    """A failed method's `"failed"` entry: `{"type", "message", "hint"}` (JSON)."""
    message = str(error).strip().splitlines()
    return {
        "type": type(error).__name__,
        "message": (message[0] if message else "")[:500],
        "hint": hint(error),
    }


def describe(name: str, error: dict[str, Any]) -> str:
    """One line: `name: Type: message (hint)`."""
    advice = f" ({error['hint']})" if error.get("hint") else ""
    return f"{name}: {error['type']}: {error['message']}{advice}"


def check_data(
    model: nn.Module, sets: Sequence[tuple[str, Data, bool]], batch_fn: BatchFn | None
) -> None:
    """What every method checks on its own, checked once before any fitting, for each
    `(name, data, labelled)`: its first batch can be read, the model runs on two of its rows and
    returns logits `[B, C]`, and the labels are integers in [0, C) (every label of a tensor
    pair, the first batch's of a loader); a clear error naming the set otherwise. One class
    only in `val` is a warning (the methods' scales are meaningless there)."""
    device = model_device(model)
    for name, data, labelled in sets:
        inputs, y = _first_batch(data, name, batch_fn, labelled)
        x = move(take_rows(inputs, 0, 2), device, name)
        with eval_mode(model), torch.no_grad():
            saved = isinstance(model, nn.Identity)  # saved logits: their fix is their log
            out = diagnose(lambda rows: call_model(model, rows), x, name, saved)
            out = model_output(out, "model")
        if not labelled:
            continue
        assert y is not None
        if regression_targets(y, out.shape[1]):  # floats that are not class indices
            raise ValueError(
                f"{name}: expected integer class labels (compare is for classifiers), got "
                f"{y.dtype} values that are not class indices (whole numbers in "
                f"[0, {out.shape[1]}))"
            )
        check_labels(y, len(y), out.shape[1], name=f"{name} labels")
        if name == "val" and is_pair(data):
            warn_one_class(y, "val")


def _first_batch(
    data: Data, name: str, batch_fn: BatchFn | None, labelled: bool
) -> tuple[Any, Tensor | None]:
    """The inputs of `data`'s first batch, and its labels (every label of a tensor pair); a
    loader that raises is a ValueError naming `name`."""
    if is_pair(data):
        return data[0], data[1]
    try:
        return next(Source(data, batch_fn, name).batches(2, need_labels=labelled))
    except StopIteration:
        raise ValueError(f"{name}: the data is empty (0 samples)") from None
    except Exception as e:
        if str(e).startswith(name):  # peg's own account of the batch: as it is
            raise
        raise ValueError(
            f"{name}: reading its first batch failed ({type(e).__name__}: {e}); every method "
            "would fail on it"
        ) from e
