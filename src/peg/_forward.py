"""Running a model on user inputs: probing it before long work (`diagnose`), explaining a
failed batch (`input_error`), and its train/eval modes."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from peg.output import OutputFnError, logits_of
from peg.source.batches import describe_inputs, take_rows


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


def warn_probabilities(out: Any, saved: bool = False) -> None:
    """Warn, naming `model`, when a forward's outputs `[B, C]` look like probabilities (every
    row in [0, 1], summing to 1) where peg expects logits: fitted as logits, they give a
    calibration that means nothing (a temperature of 0.25 for a softmax output). `saved`: the
    outputs are saved values (`fit(logits, labels)`, a `.npy`), whose fix is their log, not a
    change of the model."""
    if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[1] < 2 or not len(out):
        return
    if not torch.is_floating_point(out) or out.device.type == "meta":
        return
    rows = out[:2].detach().double()
    if bool((rows >= 0).all() & (rows <= 1).all() & ((rows.sum(1) - 1).abs() < 1e-4).all()):
        if saved:
            warnings.warn(
                "logits: the saved values look like probabilities (every row in [0, 1], summing "
                "to 1), not logits; peg expects logits (or log-probabilities): pass "
                "np.log(probs) (torch.log for a tensor), the log of probabilities being logits "
                "up to a constant per row",
                stacklevel=3,
            )
            return
        warnings.warn(
            "model: its outputs look like probabilities (every row in [0, 1], summing to 1), "
            "not logits; peg expects logits (or log-probabilities): drop the final softmax, "
            "or wrap the model with peg.with_output(model, torch.log)",
            stacklevel=3,
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


def diagnose(forward: Callable[[Any], Any], x: Any, name: str, saved: bool = False) -> Any:
    """`forward(x[:2])` (two rows of every tensor of structured inputs), turning a failure into
    `input_error` (errors of an `output_fn` pass).

    Used to probe a model before long work, and to explain a failed batch: if two rows of the
    inputs already fail, the inputs do not fit the model. `saved`: the model passes saved
    values through (`nn.Identity`), for the warning of probabilities (`warn_probabilities`).
    """
    try:
        out = forward(take_rows(x, 0, 2))
    except OutputFnError:
        raise
    except Exception as e:
        raise input_error(e, x, name) from e
    warn_probabilities(logits_of(out), saved)
    if isinstance(x, Tensor) and x.ndim == 1 and isinstance(out, Tensor) and out.ndim != 2:
        raise ValueError(
            f"{name}: 1-D inputs [N] gave outputs of shape {tuple(out.shape)}, not logits "
            "[B, C]; models take [N, features, ...]: add a feature dimension, e.g. X.unsqueeze(1)"
        )
    return out
