"""Training callbacks: the `Callback` type, `Snapshots` (the model's state dicts kept along a run,
in memory) and which callbacks have a state a checkpoint keeps (`stateful_callbacks`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from peg._inputs import check_positive_int

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
