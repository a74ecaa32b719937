"""Where a model's inputs go: the device rule every entry point applies (`model_device`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


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
