"""The resumable checkpoint of `train(checkpoint=...)`: the complete state of a run (model,
optimizer, schedules, data-order generator, global RNG, history, callbacks) written after every
epoch (`save_run`), checked against the run and read back (`load_checked`, `resume_run`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from peg.train.callbacks import Callback, stateful_callbacks
from peg.train.recipe import Recipe, Schedules
from peg.utils.io import load_tree, save_tree

CHECKPOINT_FORMAT = "peg-train-checkpoint"


def load_checked(path: Path, identity: dict[str, Any], argument: str) -> dict[str, Any]:
    """A saved run state, after checking it belongs to the run `identity` describes.

    Recipe fields added to `Recipe` after the file was written count at their defaults.
    """
    state = load_tree(path)
    saved = {k: state.get(k) for k in identity}
    if isinstance(saved.get("recipe"), dict):
        saved["recipe"] = {**Recipe().to_dict(), **saved["recipe"]}
    if saved != identity:
        raise ValueError(
            f"{argument}: {path} belongs to another run ({saved}) than this one ({identity}); "
            f"delete it or pass another {argument}"
        )
    return state


def save_run(
    path: Path,
    identity: dict[str, Any],
    epoch: int,
    history: list[dict[str, float]],
    model: nn.Module,
    opt: torch.optim.Optimizer,
    schedules: Schedules,
    gen: torch.Generator,
    callbacks: Sequence[Callback],
) -> None:
    save_tree(
        path,
        {
            **identity,
            "epoch": epoch,
            "history": history,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "schedules": schedules.state_dict(),
            "generator": gen.get_state(),
            "rng": torch.get_rng_state(),
            "callbacks": [c.state_dict() for c in stateful_callbacks(callbacks)],
        },
    )


def resume_run(
    path: Path,
    identity: dict[str, Any],
    model: nn.Module,
    opt: torch.optim.Optimizer,
    schedules: Schedules,
    gen: torch.Generator,
    callbacks: Sequence[Callback],
) -> tuple[int, list[dict[str, float]]]:
    state = load_checked(path, identity, "checkpoint")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    schedules.load_state_dict(state["schedules"])
    gen.set_state(state["generator"])
    torch.set_rng_state(state["rng"])
    stateful = stateful_callbacks(callbacks)
    if len(stateful) != len(state["callbacks"]):
        raise ValueError(
            f"checkpoint: {path} saved {len(state['callbacks'])} callback states, "
            f"this run has {len(stateful)} stateful callbacks"
        )
    for callback, cb_state in zip(stateful, state["callbacks"], strict=True):
        callback.load_state_dict(cb_state)
    return int(state["epoch"]), list(state["history"])
