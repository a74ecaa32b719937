"""Training callbacks: the `Callback` type, `Snapshots` (the model's state dicts kept along a run,
in memory), `EarlyStopping` (stop when the validation NLL stops improving, restore the best
weights) and which callbacks have a state a checkpoint keeps (`stateful_callbacks`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg._forward import eval_mode
from peg.output import logits_of
from peg.source._devices import move
from peg.source.batches import batch_rows, call_model, is_pair, take_rows
from peg.utils.scalars import check_positive_int

Callback = Callable[[int, nn.Module], None]


def stateful_callbacks(callbacks: Sequence[Callback]) -> list[Any]:
    return [c for c in callbacks if hasattr(c, "state_dict") and hasattr(c, "load_state_dict")]


class Snapshots:
    """Callback keeping copies of the model's state dict along a training run (in memory).

    Args:
        after: keep epochs > `after` only (e.g. the last iterates for subspace samplers).
        keep_last: keep at most this many, dropping the oldest.

    `states` is the list of kept state dicts, `epochs` their epoch numbers. Resumable: a run
    checkpointed with `train(checkpoint=...)` stores and restores them.
    """

    def __init__(self, after: int = 0, keep_last: int | None = None) -> None:
        self.after = check_positive_int(after, "after", minimum=0)
        self.keep_last = None if keep_last is None else check_positive_int(keep_last, "keep_last")
        self.states: list[dict[str, Tensor]] = []
        self.epochs: list[int] = []

    def __call__(self, epoch: int, model: nn.Module) -> None:
        if epoch <= self.after:
            return
        self.states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        self.epochs.append(epoch)
        if self.keep_last is not None and len(self.states) > self.keep_last:
            del self.states[0], self.epochs[0]

    def state_dict(self) -> dict[str, Any]:
        return {"states": self.states, "epochs": self.epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.states = [dict(s) for s in state["states"]]
        self.epochs = [int(e) for e in state["epochs"]]


class EarlyStopping:
    """Callback stopping a run when the validation NLL has not improved for `patience` epochs,
    the model then restored to the weights of its best epoch ("train until the validation
    loss rises", the way users train).

    Args:
        val: labelled validation data `(X, y)` (tensors; inputs any shape `peg.source.batches`
            takes).
        patience: epochs without an improvement of more than `min_delta` before stopping.
        min_delta: the improvement that counts.
        batch_size: rows per validation forward pass.

    After every epoch: the validation NLL (cross-entropy of the logits, eval mode, no gradient,
    the global RNG untouched) is recorded in the epoch's history entry as `val_nll`; the best
    weights are kept (in memory, and in `train`'s checkpoint with the rest of the state, so a
    resumed or re-run training stops and restores exactly as an uninterrupted one). `train`
    reads `stop` after every epoch and calls `restore(model)` at the end. `best_epoch` and
    `stopped_epoch` (None while running to the last epoch) say what happened.

    `Recipe(patience=...)` with `train(..., val=...)` builds one (a fresh one per run: a deep
    ensemble's members each stop on their own).
    """

    def __init__(
        self,
        val: tuple[Any, Tensor],
        patience: int = 2,
        min_delta: float = 0.0,
        batch_size: int = 1024,
    ) -> None:
        if not (is_pair(val, arrays=False) and isinstance(val[1], Tensor)):
            raise TypeError("val: expected validation data (X, y) with y a tensor of labels")
        self.val = (val[0], val[1])
        self.patience = check_positive_int(patience, "patience")
        self.min_delta = float(min_delta)
        if not math.isfinite(self.min_delta) or self.min_delta < 0:
            raise ValueError(f"min_delta: expected a finite number >= 0, got {min_delta!r}")
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.best = math.inf
        self.best_epoch = 0
        self.bad_epochs = 0
        self.stopped_epoch: int | None = None
        self.best_state: dict[str, Tensor] = {}
        self.last: float | None = None

    @property
    def stop(self) -> bool:
        return self.stopped_epoch is not None

    def nll(self, model: nn.Module) -> float:
        """The validation NLL of `model` (mean cross-entropy)."""
        X, y = self.val
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        total, rows = 0.0, batch_rows(X, "val")
        with eval_mode(model), torch.no_grad(), torch.random.fork_rng(devices=[]):
            for start in range(0, rows, self.batch_size):
                xb = move(take_rows(X, start, start + self.batch_size), device, "val")
                logits = logits_of(call_model(model, xb))
                yb = move(y[start : start + self.batch_size], logits.device, "val labels")
                total += float(F.cross_entropy(logits, yb, reduction="sum"))
        return total / rows

    def __call__(self, epoch: int, model: nn.Module) -> None:
        self.last = value = self.nll(model)
        if value < self.best - self.min_delta:
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.bad_epochs += 1
            if self.bad_epochs >= self.patience:
                self.stopped_epoch = epoch

    def metrics(self) -> dict[str, float]:
        """What the epoch's history entry records (`val_nll`)."""
        return {} if self.last is None else {"val_nll": self.last}

    def restore(self, model: nn.Module) -> None:
        """Load the best epoch's weights into `model` (nothing before the first epoch)."""
        if self.best_state:
            model.load_state_dict(self.best_state)

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "bad_epochs": self.bad_epochs,
            "stopped_epoch": -1 if self.stopped_epoch is None else self.stopped_epoch,
            "best_state": self.best_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = float(state["best"])
        self.best_epoch = int(state["best_epoch"])
        self.bad_epochs = int(state["bad_epochs"])
        stopped = int(state["stopped_epoch"])
        self.stopped_epoch = None if stopped < 0 else stopped
        self.best_state = dict(state["best_state"])
