"""Where data goes: the one device rule of peg, and the one function that applies it.

*Data follows the model; labels follow the scores.* Every consumer of user data gets its
batches from `peg.source.Source.batches(..., device=)` (or `inputs`), which calls `move`
here on inputs and labels alike, with `device` the device of what consumes them:

- a model or an ensemble: where its weights are (`model_device`);
- a calibrator, a metric, a conformal predictor: where its scores are (the predictor's logits
  come out on the predictor's device, and the labels are moved there: `peg.source._values.
  check_labels(..., device=scores.device)`).

So CPU data (what a `DataLoader` yields) works with a model on a GPU without a copy of the whole
set on the device, GPU data works with a CPU model, and a tensor made to index another (a mask,
an index) is made on the device of the tensor it indexes. Moves out of pinned memory are
non-blocking (the copy overlaps the previous batch's compute; the stream orders it before any
use). What no move can fix is refused before any work, with an error naming the argument and
both devices: data on the `meta` device (shapes without values) and a model whose weights are
on `meta` (not loaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn


def model_device(
    model: nn.Module, name: str = "model", data: tuple[str, Tensor] | None = None
) -> torch.device:
    """The device inputs are moved to for `model`: where its weights are (`weights_device`),
    after refusing weights on `meta`. `data` (argument name, tensor) is only for the message.

    A model without parameters or buffers counts as on the CPU; a model spread over several
    devices gets its inputs on the first one's."""
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


def check_data_device(
    t: Tensor, name: str, device: torch.device | None = None, owner: str = "the model"
) -> None:
    """Refuse data on the `meta` device (shapes only: nothing to compute with or to move).

    `device` is where the data would go, the device of `owner` (the model, or the predictions
    for labels), named in the message.
    """
    if t.device.type == "meta":
        where = (
            f" and {owner} is on {device}; pass real values, on any device (they are moved to "
            f"{owner}'s device)"
            if device is not None
            else "; pass real values"
        )
        raise ValueError(f"{name}: on the meta device (shapes without values){where}")


def to_device(t: Tensor, device: torch.device, name: str = "X") -> Tensor:
    """`t` on `device` (itself if it is there already), after `check_data_device`; a move out
    of pinned memory does not block. Nothing is moved to `meta` (no values to compute with:
    the model's own check, `model_device`, names it)."""
    if t.device == device or device.type == "meta":
        return t
    check_data_device(t, name, device)
    return t.to(device, non_blocking=t.device.type == "cpu" and t.is_pinned())


def move(inputs: Any, device: torch.device | None, name: str = "X") -> Any:
    """`inputs` with every tensor (inside mappings, tuples, lists) on `device` (`to_device`);
    None leaves them where they are."""
    if device is None:
        return inputs
    if isinstance(inputs, Tensor):
        return to_device(inputs, device, name)
    if isinstance(inputs, Mapping):
        return {k: move(v, device, f"{name}[{k!r}]") for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        moved = [move(v, device, f"{name}[{i}]") for i, v in enumerate(inputs)]
        return moved if isinstance(inputs, list) else tuple(moved)
    return inputs
