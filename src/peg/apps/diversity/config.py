"""The settings of `peg diversity`: `DiversityConfig` (the keys of the `diversity` preset,
`peg/apps/configs/diversity.yaml`), what `--quick` changes, and `load_config`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peg.apps import presets
from peg.apps._yaml import read_yaml
from peg.train import Recipe


@dataclass(frozen=True)
class DiversityConfig:
    """Everything that defines a `peg diversity` run (the keys of the `diversity` preset).

    Sizes: `train_points`, `val_points`, `test_points` subsample the splits (None: all);
    the validation part (`val_fraction` of the training split) fits PEG / PEP.
    """

    data: str = "fashion-mnist"
    model: Mapping[str, Any] = field(default_factory=lambda: {"name": "landscape-small-cnn"})
    # Fort et al. §3: Adam at 1.6e-3, batch 128, no augmentation (SmallCNN: 10 epochs)
    train: Mapping[str, Any] = field(
        default_factory=lambda: {
            "epochs": 10,
            "lr": 1.6e-3,
            "optimizer": "adam",
            "weight_decay": 0.0,
            "schedule": "constant",
            "batch_size": 128,
        }
    )
    trajectories: int = 10  # independent initialisations (seeds seed, seed+1, ...)
    seed: int = 0
    val_fraction: float = 0.2
    train_points: int | None = 20000
    val_points: int | None = 2000
    test_points: int | None = 2000
    samples: int = 10  # members of every method around each solution
    ensemble_size: int = 5  # members in the table's ensembles
    tsne_trajectories: int = 3
    tsne_samples: int = 5  # members per method per trajectory in the t-SNE
    tsne_points: int = 500  # test points whose softmax outputs represent a model
    iterates: int = 5  # last checkpoints the diagonal / PCA Gaussians are fitted to
    pca_rank: int = 4  # the paper's rank-4 PCA on CIFAR-10 (lowered to iterates − 1)
    random_radius: float = 0.2  # random subspace: largest step, a fraction of ‖θ₀‖
    dropout_keep: tuple[float, float] = (0.8, 1.0)  # dropout subspace: p_keep range
    swag_epochs: int = 5  # SWAG-Diag: epochs of collection continuing from the solution
    score_points: int | None = 1000  # validation points scoring PEG's η / PEP's σ
    peg_eta: float | str = "search"  # PEG's η: "search" (NLL on validation) or a number
    pep_sigma: float | str = "search"  # PEP's σ: "search" or a number
    grid: int = 21  # radial cut: grid points per axis
    landscape_points: int = 1000  # test points scored at each grid point
    threads: int | None = None  # torch CPU threads during the run (None: leave as is)

    def __post_init__(self) -> None:
        for name in ("trajectories", "samples", "ensemble_size", "tsne_trajectories", "iterates"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name}: expected an integer >= 2, got {value!r}")
        for name in ("tsne_samples", "tsne_points", "pca_rank", "swag_epochs", "grid"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if self.ensemble_size > min(self.trajectories, self.samples):
            raise ValueError(
                f"ensemble_size: {self.ensemble_size} is more than the trajectories "
                f"({self.trajectories}) or samples ({self.samples}) available"
            )
        if self.tsne_trajectories > self.trajectories:
            raise ValueError(
                f"tsne_trajectories: {self.tsne_trajectories} > trajectories ({self.trajectories})"
            )
        if self.iterates > self.recipe().epochs:
            raise ValueError(
                f"iterates: {self.iterates} last checkpoints asked, but only "
                f"{self.recipe().epochs} epochs are trained"
            )
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ValueError(f"threads: expected an integer >= 1 or null, got {self.threads!r}")
        for name in ("peg_eta", "pep_sigma"):
            value = getattr(self, name)
            if value != "search" and not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            ):
                raise ValueError(f"{name}: expected 'search' or a number > 0, got {value!r}")
        if not isinstance(self.model, Mapping) or "name" not in self.model:
            raise ValueError(f"model: expected a mapping with a 'name', got {self.model!r}")

    def recipe(self) -> Recipe:
        """The trajectories' training recipe (errors name the offending `train` key)."""
        return Recipe(**dict(self.train))

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))


#: What `--quick` changes: scikit-learn digits, few epochs, small sizes (well under a minute).
QUICK: dict[str, Any] = {
    "data": "digits",
    "train": {
        "epochs": 6,
        "lr": 0.01,
        "optimizer": "adam",
        "weight_decay": 0.0,
        "schedule": "constant",
        "batch_size": 64,
    },
    "trajectories": 5,
    "train_points": None,
    "val_points": None,
    "test_points": None,
    "samples": 6,
    "tsne_samples": 4,
    "tsne_points": 200,
    "iterates": 4,
    "swag_epochs": 2,
    "score_points": None,
    "grid": 11,
    "landscape_points": 360,
    "threads": 1,  # models this small run fastest on one thread, and a busy machine hurts less
}


def load_config(spec: str | Path | None = None, quick: bool = False) -> DiversityConfig:
    """The run's configuration: defaults, then the YAML `spec` (a file, or a preset's name such
    as "diversity"), then its `quick:` section (or `QUICK` when the spec has none) if `quick`.

    Unknown keys are an error naming them.
    """
    values: dict[str, Any] = {}
    quick_values: dict[str, Any] = dict(QUICK)
    if spec is not None:
        path = presets.find(spec)
        raw = read_yaml(path) or {}  # plain data, no aliases (a 396-byte alias bomb)
        if not isinstance(raw, dict):
            raise ValueError(f"spec: {path} must hold a mapping of settings")
        raw = dict(raw)
        if "quick" in raw:
            given = raw.pop("quick") or {}
            if not isinstance(given, dict):
                raise ValueError(f"spec: {path}: quick must be a mapping of settings")
            quick_values = dict(given)
        values.update(raw)
    if quick:
        values.update(quick_values)
    known = {f.name for f in dataclasses.fields(DiversityConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"spec: unknown setting(s) {unknown}; known: {sorted(known)}")
    if "dropout_keep" in values:
        values["dropout_keep"] = tuple(values["dropout_keep"])
    return DiversityConfig(**values)
