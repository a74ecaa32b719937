"""The figures of `peg diversity`, each a PNG with the JSON behind it (see `peg.apps.diversity.
study`): similarity matrices, t-SNE, the diversity–accuracy plane, ensemble size, radial cut."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg import plots
from peg.analysis.embedding import tsne_predictions
from peg.analysis.landscape import radial_cut
from peg.analysis.plane import diversity_accuracy, reference_curves
from peg.analysis.trajectories import Trajectory
from peg.apps.diversity.config import DiversityConfig
from peg.apps.diversity.methods import Members
from peg.apps.results import write_json
from peg.metrics.diversity import cosine_similarity, disagreement, size_curve

INDEPENDENT = "independent inits"
CHECKPOINT = "checkpoint"


@dataclass
class Figures:
    """What the figures are drawn from, where they go, and the figures written so far."""

    config: DiversityConfig
    out: Path
    data: str  # the data set's name, for titles
    trajs: list[Trajectory]
    seeds: list[int]  # the trajectories' seeds
    ckpt_logits: list[Tensor]  # per trajectory: test logits of every checkpoint [E, N, C]
    around: list[dict[str, Members]]  # per t-SNE trajectory: each method's members
    skeleton: nn.Module
    test: tuple[Tensor, Tensor]
    classes: int
    progress: bool | None = None
    written: list[str] = field(default_factory=list)

    @functools.cached_property
    def finals(self) -> Tensor:
        """Test logits of every trajectory's final solution `[T, N, C]`."""
        return torch.stack([lg[-1] for lg in self.ckpt_logits])

    def save(self, stem: str, figure: Path, payload: Any) -> None:
        write_json(self.out / f"{stem}.json", payload, indent=1, strict=True)
        self.written.append(str(figure))

    def similarity(self) -> None:
        """(a), (b): weight-space cosine and disagreement along trajectory 0 and between the
        final solutions."""
        trajs, finals = self.trajs, self.finals
        epochs, seeds = trajs[0].epochs, self.seeds
        ticks = {"along trajectory 0 (epoch)": epochs, "between initialisations (seed)": seeds}
        for stem, along, between, label, bounds in (
            (
                "cosine_similarity",
                cosine_similarity(trajs[0].states),
                cosine_similarity([t.final for t in trajs]),
                "weight-space cosine similarity",
                None,
            ),
            (
                "disagreement",
                disagreement(self.ckpt_logits[0]),
                disagreement(finals),
                "fraction of labels predicted differently",
                (0.0, None),
            ),
        ):
            panels = {
                "along trajectory 0 (epoch)": along,
                "between initialisations (seed)": between,
            }
            lo, hi = bounds or (None, None)
            fig = plots.similarity_matrices(
                panels,
                self.out / f"{stem}.png",
                label,
                title=f"{label} ({self.data})",
                ticks=ticks,
                vmin=lo,
                vmax=hi,
            )
            self.save(
                stem,
                fig,
                {
                    "epochs": epochs,
                    "seeds": seeds,
                    "along_trajectory": along,
                    "between_inits": between,
                },
            )

    def tsne(self) -> None:
        """(c): t-SNE of the checkpoints' and members' softmax outputs."""
        config, epochs = self.config, self.trajs[0].epochs
        n_tsne = min(config.tsne_points, len(self.test[0]))
        blocks, owner, kind, index = [], [], [], []
        for t in range(config.tsne_trajectories):
            blocks.append(self.ckpt_logits[t][:, :n_tsne])
            owner += [t] * len(epochs)
            kind += [CHECKPOINT] * len(epochs)
            index += list(epochs)
            for name, members in self.around[t].items():
                k = min(config.tsne_samples, len(members.logits))
                blocks.append(members.logits[:k, :n_tsne])
                owner += [t] * k
                kind += [name] * k
                index += list(range(k))
        points = tsne_predictions(torch.cat(blocks), seed=config.seed)
        fig = plots.prediction_map(
            points,
            np.array(owner),
            kind,
            self.out / "tsne.png",
            title=f"t-SNE of softmax outputs on {n_tsne} test points ({self.data})",
        )
        payload = {
            "points": points,
            "trajectory": owner,
            "kind": kind,
            "epoch_or_member": index,
            "test_points": n_tsne,
        }
        self.save("tsne", fig, payload)

    def plane(self) -> None:
        """(d): the diversity–accuracy plane relative to trajectory 0's solution."""
        finals, y, C = self.finals, self.test[1], self.classes
        plane = {INDEPENDENT: diversity_accuracy(finals[0], finals[1:], y)}
        for name, members in self.around[0].items():
            plane[name] = diversity_accuracy(finals[0], members.logits, y)
        a_star = plane[INDEPENDENT]["reference_accuracy"]
        curves = reference_curves(a_star, C) if 1 / C < a_star < 1 else {}
        fig = plots.diversity_accuracy_plane(
            plane,
            self.out / "diversity_accuracy.png",
            a_star,
            curves,
            stars=(INDEPENDENT,),
            title=f"Diversity vs accuracy around trajectory 0's solution ({self.data})",
        )
        payload = {"reference_accuracy": a_star, "classes": C, "methods": plane, "curves": curves}
        self.save("diversity_accuracy", fig, payload)

    def ensemble_size(self) -> None:
        """(e): accuracy and NLL against ensemble size."""
        y, seed = self.test[1], self.config.seed
        sizes = {INDEPENDENT: size_curve(self.finals, y, seed=seed)}
        for name, members in self.around[0].items():
            sizes[name] = size_curve(members.logits, y, seed=seed)
        fig = plots.ensemble_size_curves(
            {
                n: {"size": c["size"], "accuracy": c["accuracy_random"], "nll": c["nll_random"]}
                for n, c in sizes.items()
            },
            self.out / "ensemble_size.png",
            title=f"Ensemble size (mean over random member orders; {self.data} test)",
        )
        self.save("ensemble_size", fig, sizes)

    def radial_landscape(self) -> None:
        """(f): the radial cut through 0, θ₁ (trajectory 0) and θ₂ (trajectory 1)."""
        X, y = self.test
        trajs = self.trajs
        n_land = min(self.config.landscape_points, len(X))
        cut = radial_cut(
            self.skeleton,
            [trajs[0].final, trajs[1].final],
            X[:n_land],
            y[:n_land],
            resolution=self.config.grid,
            paths={
                "trajectory 0": trajs[0].states,
                "trajectory 1": trajs[1].states,
                "diagonal Gaussian (trajectory 0)": self.around[0]["diagonal Gaussian"].states
                or [],
            },
            progress=self.progress,
        )
        fig = plots.radial_landscape(
            cut,
            self.out / "radial_landscape.png",
            title=f"Radial cut through the origin and two optima ({n_land} test points)",
        )
        self.save("radial_landscape", fig, cut)
