"""The methods of `peg diversity`, each around one trajectory's final solution, built through
the method registry (`peg.apps.registry`): the study's column name → registry key and options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from peg.analysis.trajectories import Trajectory
from peg.apps.diversity.config import DiversityConfig
from peg.apps.registry import Site, build, scales
from peg.ensemble import Ensemble
from peg.methods import MCDropout
from peg.methods.dropout import dropout_modules


@dataclass
class Members:
    """A method's members around one solution: logits `[S, N, C]` and weights (None for MC
    dropout, whose members share one set of weights)."""

    logits: Tensor
    states: list[dict[str, Tensor]] | None


def _ensemble_states(ensemble: Ensemble) -> list[dict[str, Tensor]]:
    return [dict(ensemble.member_state(i)) for i in range(len(ensemble))]


def columns(
    config: DiversityConfig, model: nn.Module, n_val: int, n_iterates: int, chosen: dict[str, float]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """The study's methods in the order they are built: name → (registry key, options).

    PEG's η and PEP's σ are `config`'s ("search": searched on validation NLL) until `chosen`
    holds them; SWAG-Diag continues training from the solution for `swag_epochs`, collecting
    from the first; MC dropout uses the model's own dropout layers when it has some (the
    paper's SmallCNN does).
    """
    S = config.samples
    recipe = config.recipe()
    swag = recipe.replace(epochs=config.swag_epochs, schedule="swa", swa_start=0, swa_lr=recipe.lr)
    return {
        "PEG": (
            "peg",
            {
                "n_members": S,
                "eta": chosen.get("eta", config.peg_eta),
                "grad_batch_size": max(1, min(128, n_val // 4)),
            },
        ),
        "PEP": ("pep", {"n_members": S, "sigma": chosen.get("sigma", config.pep_sigma)}),
        "SWAG-Diag": ("swag", {"recipe": swag, "diag": True, "n_members": S, "bn": "eval"}),
        "MC dropout": (
            "mc-dropout",
            {
                "n_members": S,
                "insert": None if dropout_modules(model) else 0.1,
                "progress": False,
            },
        ),
        "random subspace": ("random-subspace", {"n_members": S, "radius": config.random_radius}),
        "dropout subspace": ("dropout-subspace", {"n_members": S, "keep": config.dropout_keep}),
        "diagonal Gaussian": ("diagonal-gaussian", {"n_members": S}),
        "PCA Gaussian": (
            "low-rank-gaussian",
            {"n_members": S, "rank": min(config.pca_rank, n_iterates - 1)},
        ),
    }


def build_methods(
    config: DiversityConfig,
    skeleton: nn.Module,
    trajectory: Trajectory,
    splits: Mapping[str, tuple[Tensor, Tensor]],
    chosen: dict[str, float],
    progress: bool | None,
) -> dict[str, Members]:
    """Every method's `samples` members around `trajectory`'s final solution.

    PEG's η and PEP's σ (when `config` says "search") are searched on the first call and
    reused from `chosen` afterwards (the same scale around every solution, one search).
    """
    model = trajectory.model(skeleton)
    iterates = trajectory.states[-config.iterates :]
    site = Site(
        seed=config.seed,
        progress=progress,
        base=lambda: model,
        val=splits["val"],
        train=splits["train"],
        score_points=config.score_points,
        iterates=iterates,
        skeleton=skeleton,
    )
    out = {}
    for name, (key, options) in columns(
        config, model, len(splits["val"][0]), len(iterates), chosen
    ).items():
        fitted = build(key, site, **options)
        chosen.update(scales(fitted))
        states = None if isinstance(fitted, MCDropout) else _ensemble_states(fitted.ensemble())
        logits = fitted.member_logits(splits["test"][0], progress=False)
        out[name] = Members(logits.detach().cpu(), states)
    return out
