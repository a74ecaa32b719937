"""BatchNorm statistics re-estimated over a stream of input batches, never gathered.

`InputBatches(data, batch_size, batch_fn)` is re-iterable: every pass reads `data` again
(tensors sliced, a Dataset batched, a loader's own batches; `peg.batches` conventions, labels
dropped). `update_bn(batches, model)` is `torch.optim.swa_utils.update_bn` for inputs of any
shape (`model(**inputs)` for mappings), each batch moved to the model's device.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from peg._devices import move, weights_device
from peg._inputs import iter_inputs
from peg.batches import BatchFn, call_model


class InputBatches:
    """The input batches of `data`, read anew on every iteration."""

    def __init__(
        self, data: Any, batch_size: int, batch_fn: BatchFn | None = None, name: str = "bn_data"
    ) -> None:
        self.data, self.batch_size, self.batch_fn, self.name = data, batch_size, batch_fn, name

    def __iter__(self) -> Iterator[Any]:
        return iter_inputs(self.data, self.batch_size, self.batch_fn)

    def check_not_empty(self) -> None:
        """Read the first batch (only): an empty `data` is a ValueError naming it."""
        if next(iter(self), None) is None:
            raise ValueError(f"{self.name}: the data is empty (0 samples)")


def update_bn(batches: Iterable[Any], model: nn.Module) -> None:
    """Running statistics of every BatchNorm of `model` recomputed as the plain average over
    `batches` (as `torch.optim.swa_utils.update_bn`: momentum None, train mode for the pass)."""
    momenta = {}
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    device = weights_device(model)
    with torch.no_grad():
        for inputs in batches:
            call_model(model, move(inputs, device, "bn_data"))
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)
