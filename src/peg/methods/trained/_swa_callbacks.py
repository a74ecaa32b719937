"""SWA's and SWAG's training callbacks: the running average of the weights after `swa_start`
(`Averager`, `torch.optim.swa_utils.AveragedModel`) and SWAG's second moment and deviations
(`Moments`), each resumable from a checkpoint (`state_dict` / `load_state_dict`)."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

from peg._params import parameter_vector


class Averager:
    """Callback: `AveragedModel.update_parameters` once per epoch after swa_start (resumable)."""

    def __init__(self, model: nn.Module, swa_start: int) -> None:
        self.averaged = AveragedModel(model)
        self.swa_start = swa_start

    def __call__(self, epoch: int, model: nn.Module) -> None:
        if epoch > self.swa_start:
            self.averaged.update_parameters(model)

    @property
    def count(self) -> int:
        return int(self.averaged.n_averaged)

    def state_dict(self) -> dict[str, Any]:
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averaged.load_state_dict(state)


class Moments:
    """Callback: SWAG's second moment and deviation matrix, read off the `Averager`'s mean."""

    def __init__(self, averager: Averager, max_num_models: int, diag: bool) -> None:
        self.averager = averager
        self.diag = diag
        mean = parameter_vector(averager.averaged.module)
        self.sq_mean = torch.zeros_like(mean)
        self.deviations: deque[Tensor] = deque(maxlen=max_num_models)

    def __call__(self, epoch: int, model: nn.Module) -> None:
        if epoch <= self.averager.swa_start:
            return
        n = self.averager.count  # already includes this epoch's weights
        w = parameter_vector(model)
        self.sq_mean += (w * w - self.sq_mean) / n
        if not self.diag:
            mean = parameter_vector(self.averager.averaged.module)
            self.deviations.append((w - mean).clone())

    def state_dict(self) -> dict[str, Any]:
        return {"sq_mean": self.sq_mean, "deviations": list(self.deviations)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sq_mean = state["sq_mean"].clone()
        self.deviations.clear()
        self.deviations.extend(d.clone() for d in state["deviations"])
