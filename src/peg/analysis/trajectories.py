"""Training trajectories: K runs from different random initialisations, a checkpoint per epoch.

`train_trajectories(factory, data, recipe, seeds, cache=...)` trains one model per seed with
`peg.train.train` and keeps its state dict at initialisation (epoch 0) and after every epoch
(`peg.train.Snapshots`). With `cache`, each finished trajectory is stored as one safetensors file
(`peg.utils.io.save_tree`: tensors + JSON, no pickle) named by a hash of everything that defines it
(recipe, seed, initial weights, training data), so a rerun loads it instead of training, and a
change to any of those trains afresh. An interrupted run resumes from a per-epoch checkpoint.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg.source import Data, Source
from peg.train import ModelSource, Recipe, Snapshots, instantiate, train
from peg.utils.io import load_tree, save_tree

FORMAT = "peg-trajectory"


@dataclass
class Trajectory:
    """One training run's checkpoints.

    Attributes:
        seed: the seed of the initialisation, data order and dropout.
        epochs: epoch number of each checkpoint, `[E + 1]` (0 = the initialisation).
        states: one state dict per checkpoint (CPU tensors), same order as `epochs`.
        history: `peg.train.train`'s per-epoch history (loss, accuracy, lr).
        from_cache: whether it was loaded from the cache rather than trained.
    """

    seed: int
    epochs: list[int]
    states: list[dict[str, Tensor]]
    history: list[dict[str, float]] = field(default_factory=list)
    from_cache: bool = False

    @property
    def final(self) -> dict[str, Tensor]:
        """The state dict after the last epoch."""
        return self.states[-1]

    def model(self, skeleton: nn.Module, index: int = -1) -> nn.Module:
        """A copy of `skeleton` carrying checkpoint `index` (default: the final one), eval mode."""
        model = copy.deepcopy(skeleton)
        model.load_state_dict(self.states[index])
        return model.eval()

    def __len__(self) -> int:
        return len(self.states)


def _digest(tensors: Sequence[Tensor]) -> str:
    """A content hash of tensors (shape, dtype and bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _identity(recipe: Recipe, seed: int, init: Mapping[str, Tensor], data_hash: str) -> dict:
    """What defines a trajectory; its hash names the cache file."""
    return {
        "format": FORMAT,
        "recipe": recipe.to_dict(),
        "seed": seed,
        "init": _digest([init[k] for k in sorted(init)]),
        "data": data_hash,
    }


def cache_path(cache: str | os.PathLike[str], identity: Mapping[str, Any]) -> Path:
    """The cache file of the trajectory described by `identity`."""
    key = hashlib.blake2b(json.dumps(identity, sort_keys=True).encode(), digest_size=8).hexdigest()
    return Path(cache) / f"trajectory-seed{identity['seed']}-{key}.safetensors"


def _load(path: Path, identity: Mapping[str, Any]) -> Trajectory | None:
    """The cached trajectory at `path`, or None when it is missing or belongs to another run."""
    if not path.exists():
        return None
    try:
        tree = load_tree(path)
    except ValueError:
        return None  # a damaged file: train again and overwrite it
    if tree.get("identity") != dict(identity):
        return None
    return Trajectory(
        seed=int(tree["identity"]["seed"]),
        epochs=[int(e) for e in tree["epochs"]],
        states=[dict(s) for s in tree["states"]],
        history=list(tree["history"]),
        from_cache=True,
    )


def train_trajectory(
    model: ModelSource,
    data: Data,
    recipe: Recipe,
    seed: int,
    cache: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    _data_hash: str | None = None,
) -> Trajectory:
    """Train one model from the initialisation `seed`, keeping a checkpoint every epoch.

    Args:
        model: a zero-argument factory (called under `torch.manual_seed(seed)`) or a module,
            whose copy is re-initialised (`reset_parameters`) under `seed`; never modified.
        data: training data, (X, y) or a Dataset/DataLoader.
        recipe: how to train (`peg.train.Recipe`).
        seed: initialisation, data order and dropout.
        cache: a folder for the finished trajectory (and a resumable checkpoint while training);
            None keeps it in memory only.
        progress: progress bar over epochs (None: only on a terminal).

    Returns:
        The `Trajectory`: `recipe.epochs + 1` checkpoints (epoch 0 is the initialisation).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe: expected a peg.train.Recipe, got {type(recipe).__name__}")
    X, y = Source(data, name="data").xy()
    net = instantiate(model, seed, reinit=isinstance(model, nn.Module))
    init = {k: v.detach().clone().cpu() for k, v in net.state_dict().items()}
    data_hash = _data_hash or _digest([X, y])
    identity = _identity(recipe, seed, init, data_hash)
    path = cache_path(cache, identity) if cache is not None else None
    if path is not None and (found := _load(path, identity)) is not None:
        return found

    snapshots = Snapshots()
    partial = path.with_name(path.stem + ".partial.safetensors") if path is not None else None
    _, history = train(
        net,
        (X, y),
        recipe,
        seed=seed,
        callbacks=[snapshots],
        checkpoint=partial,
        progress=progress,
    )
    cpu = [{k: v.detach().cpu() for k, v in s.items()} for s in snapshots.states]
    trajectory = Trajectory(seed, [0, *snapshots.epochs], [init, *cpu], history)
    if path is not None:
        save_tree(
            path,
            {
                "identity": identity,
                "epochs": trajectory.epochs,
                "states": trajectory.states,
                "history": history,
            },
        )
        assert partial is not None
        partial.unlink(missing_ok=True)  # the finished file supersedes the resumable one
    return trajectory


def train_trajectories(
    model: ModelSource,
    data: Data,
    recipe: Recipe,
    seeds: Sequence[int],
    cache: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    say: Any = None,
) -> list[Trajectory]:
    """`train_trajectory` for every seed (different random initialisations), in order.

    Args:
        model, data, recipe, cache, progress: as for `train_trajectory`.
        seeds: one trajectory per seed; at least one, no repeats.
        say: optional `say(message)` told, per seed, whether it was trained or loaded.

    Returns:
        One `Trajectory` per seed.
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: expected different seeds, got {seeds}")
    X, y = Source(data, name="data").xy()
    data_hash = _digest([X, y])  # hashed once, not per seed
    out = []
    for seed in seeds:
        t = train_trajectory(model, (X, y), recipe, seed, cache, progress, data_hash)
        if say is not None:
            say(f"  trajectory seed {seed}: {'loaded from cache' if t.from_cache else 'trained'}")
        out.append(t)
    return out
