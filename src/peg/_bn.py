"""BatchNorm statistics re-estimated over a stream of input batches, never gathered.

The batches come from `peg.source.Source.replay` (re-iterable: every pass reads the data again,
labels dropped). `update_bn(batches, model)` is `torch.optim.swa_utils.update_bn` for inputs of any
shape (`model(**inputs)` for mappings), each batch moved to the model's device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from peg.source._devices import move, weights_device
from peg.source.batches import call_model


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
