"""`peg diversity`: the loss-landscape analyses of Fort et al. (2019) with PEG placed on them.

Trains `trajectories` models from different random initialisations (cached on disk), builds
every method around the first trajectories' final solutions (PEG, PEP, SWAG-Diag, MC dropout,
and the random / dropout / diagonal-Gaussian / PCA-Gaussian subspace samplers), and writes,
each as a PNG with the JSON behind it:

- cosine_similarity: weight-space cosine along trajectory 0 and between final solutions;
- disagreement: the same in function space (fraction of test points predicted differently);
- tsne: t-SNE of the softmax outputs of the first trajectories' checkpoints, with each
  method's members around each final solution;
- diversity_accuracy: every method's members relative to trajectory 0's solution, with the
  independent solutions and the paper's reference curves;
- ensemble_size: accuracy and NLL against ensemble size;
- radial_landscape: accuracy and agreement on the plane through 0 and two optima;

plus results.json / results.md: the table of mean pairwise disagreement, normalised
disagreement, cosine similarity and ensemble-of-k accuracy / NLL per method.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg import data as datasets
from peg import models, plots
from peg._env import git_commit, machine
from peg._io import atomic_write_text
from peg._progress import bar
from peg.analysis.embedding import tsne_predictions
from peg.analysis.landscape import radial_cut
from peg.analysis.plane import diversity_accuracy, reference_curves
from peg.analysis.trajectories import Trajectory, train_trajectories
from peg.ensemble import Ensemble
from peg.methods import (
    PEG,
    PEP,
    SWAG,
    DiagonalGaussian,
    DropoutSubspace,
    LowRankGaussian,
    MCDropout,
    RandomSubspace,
)
from peg.methods.dropout import dropout_modules
from peg.metrics.diversity import cosine_similarity, disagreement, size_curve, summary
from peg.train import Recipe

Say = Callable[[str], None]
INDEPENDENT = "independent inits"
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class DiversityConfig:
    """Everything that defines a `peg diversity` run (the keys of `configs/diversity.yaml`).

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
    """The run's configuration: defaults, then the YAML `spec`, then its `quick:` section (or
    `QUICK` when the spec has none) if `quick`.

    Unknown keys are an error naming them.
    """
    import yaml

    values: dict[str, Any] = {}
    quick_values: dict[str, Any] = dict(QUICK)
    if spec is not None:
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"spec: no such file {path}")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"spec: {path} must hold a mapping of settings")
        raw = dict(raw)
        if "quick" in raw:
            quick_values = dict(raw.pop("quick") or {})
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


# ---------------------------------------------------------------- data and models
def _subsample(X: Tensor, y: Tensor, n: int | None, seed: int) -> tuple[Tensor, Tensor]:
    if n is None or n >= len(X):
        return X, y
    idx = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))[:n]
    return X[idx], y[idx]


def load_data(config: DiversityConfig, say: Say) -> dict[str, Any]:
    """Train / validation / test splits (Fashion-MNIST falls back to digits, saying so)."""
    name = config.data
    try:
        train_all, test = datasets.load(name, "train"), datasets.load(name, "test")
    except FileNotFoundError as e:
        if name != "fashion-mnist":
            raise
        say(f"Fashion-MNIST not found ({str(e).splitlines()[0]}); using scikit-learn digits.")
        name = "digits"
        train_all, test = datasets.load(name, "train"), datasets.load(name, "test")
    X_tr, y_tr, X_val, y_val = datasets.train_val_split(
        *train_all, config.val_fraction, seed=config.seed
    )
    return {
        "name": name,
        "train": _subsample(X_tr, y_tr, config.train_points, config.seed),
        "val": _subsample(X_val, y_val, config.val_points, config.seed),
        "test": _subsample(*test, config.test_points, config.seed),
        "classes": int(train_all[1].max()) + 1,
    }


def _factory(config: DiversityConfig, in_channels: int, classes: int) -> Callable[[], nn.Module]:
    options = {k: v for k, v in config.model.items() if k != "name"}
    return lambda: models.build(
        config.model["name"], in_channels=in_channels, num_classes=classes, **options
    )


def _logits(skeleton: nn.Module, states: list[dict[str, Tensor]], X: Tensor) -> Tensor:
    """Test logits `[K, N, C]` of K state dicts."""
    return Ensemble.from_state_dicts(skeleton, states).member_logits(X, progress=False)


# ---------------------------------------------------------------- methods
@dataclass
class Members:
    """A method's members around one solution: logits `[S, N, C]` and weights (None for MC
    dropout, whose members share one set of weights)."""

    logits: Tensor
    states: list[dict[str, Tensor]] | None


def _ensemble_states(ensemble: Ensemble) -> list[dict[str, Tensor]]:
    return [dict(ensemble.member_state(i)) for i in range(len(ensemble))]


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
    S, seed = config.samples, config.seed
    X_test = splits["test"][0]
    val = splits["val"]
    model = trajectory.model(skeleton)
    iterates = trajectory.states[-config.iterates :]
    score = config.score_points
    peg_batch = max(1, min(128, len(val[0]) // 4))
    makers: dict[str, Callable[[], Any]] = {
        "PEG": lambda: PEG(
            n_members=S,
            seed=seed,
            eta=chosen.get("eta", config.peg_eta),
            max_score_points=score,
            grad_batch_size=peg_batch,
            progress=progress,
        ).fit(model, val),
        "PEP": lambda: PEP(
            n_members=S,
            seed=seed,
            sigma=chosen.get("sigma", config.pep_sigma),
            max_score_points=score,
            progress=progress,
        ).fit(model, val),
        "SWAG-Diag": lambda: SWAG(
            recipe=config.recipe().replace(
                epochs=config.swag_epochs,
                schedule="swa",
                swa_start=0,
                swa_lr=config.recipe().lr,
            ),
            diag=True,
            n_members=S,
            bn="eval",
            seed=seed,
            progress=progress,
        ).fit(model, splits["train"]),
        # the model's own dropout layers when it has some (the paper's SmallCNN does)
        "MC dropout": lambda: MCDropout(
            n_members=S, seed=seed, insert=None if dropout_modules(model) else 0.1, progress=False
        ).fit(model),
        "random subspace": lambda: RandomSubspace(
            n_members=S, radius=config.random_radius, seed=seed, progress=progress
        ).fit(model),
        "dropout subspace": lambda: DropoutSubspace(
            n_members=S, keep=config.dropout_keep, seed=seed, progress=progress
        ).fit(model),
        "diagonal Gaussian": lambda: DiagonalGaussian(
            n_members=S, seed=seed, progress=progress
        ).fit(iterates, skeleton=skeleton),
        "PCA Gaussian": lambda: LowRankGaussian(
            n_members=S, rank=min(config.pca_rank, len(iterates) - 1), seed=seed, progress=progress
        ).fit(iterates, skeleton=skeleton),
    }
    out = {}
    for name, make in makers.items():
        fitted = make()
        if name == "PEG":
            chosen["eta"] = float(fitted.eta_)
        elif name == "PEP":
            chosen["sigma"] = float(fitted.sigma_)
        states = None if isinstance(fitted, MCDropout) else _ensemble_states(fitted.ensemble())
        logits = fitted.member_logits(X_test, progress=False)
        out[name] = Members(logits.detach().cpu(), states)
    return out


# ---------------------------------------------------------------- output helpers
def _json_ready(obj: Any) -> Any:
    """Plain JSON: tensors and arrays as lists, non-finite floats as null."""
    if isinstance(obj, Tensor):
        obj = obj.detach().cpu().tolist()
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, Mapping):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def write_json(path: Path, obj: Any) -> Path:
    """Write `obj` as indented JSON atomically; returns the path."""
    atomic_write_text(path, json.dumps(_json_ready(obj), indent=1, allow_nan=False) + "\n")
    return path


def format_table(rows: Mapping[str, Mapping[str, float]], k: int) -> str:
    """The printed / markdown table, one row per method."""
    head = (
        f"| method | disagreement | norm. disagreement | cosine sim. | ens-{k} acc (%) | "
        f"ens-{k} NLL |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        cos = r.get("cosine_similarity")
        lines.append(
            f"| {name} | {r['disagreement']:.4f} | {r['normalized_disagreement']:.4f} | "
            f"{'—' if cos is None else f'{cos:.4f}'} | {100 * r['accuracy']:.2f} | "
            f"{r['nll']:.4f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the run
def run(
    config: DiversityConfig | None = None,
    out: str | Path = "results/diversity",
    cache: str | Path | None = ".peg-cache/diversity",
    progress: bool | None = None,
    say: Say = print,
    command: str | None = None,
) -> dict[str, Any]:
    """Run every analysis; returns what it writes to `out/results.json`.

    Args:
        config: the settings (default `DiversityConfig()`, the full run).
        out: output folder for figures and JSON.
        cache: folder of the cached trajectories (None: train in memory, cache nothing).
        progress: progress bars (None: only on a terminal).
        say: where progress messages and the table go.
        command: the command line, recorded in results.json.
    """
    config = config or DiversityConfig()
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        return _run(config, Path(out), cache, progress, say, command)
    finally:
        torch.set_num_threads(threads)


def _run(
    config: DiversityConfig,
    out: Path,
    cache: str | Path | None,
    progress: bool | None,
    say: Say,
    command: str | None,
) -> dict[str, Any]:
    times: dict[str, float] = {}
    t_start = time.perf_counter()
    clock = [t_start]

    def lap(label: str) -> None:
        now = time.perf_counter()
        times[label] = round(now - clock[0], 2)
        clock[0] = now

    splits = load_data(config, say)
    X_test, y_test = splits["test"]
    C = splits["classes"]
    factory = _factory(config, splits["train"][0].shape[1], C)
    skeleton = factory().eval()
    say(
        f"peg diversity: {splits['name']}, {len(splits['train'][0])} train / "
        f"{len(splits['val'][0])} validation / {len(X_test)} test, {config.model['name']} "
        f"({sum(p.numel() for p in skeleton.parameters()):,} parameters), "
        f"{config.trajectories} trajectories × {config.recipe().epochs} epochs; {machine()}"
    )
    seeds = [config.seed + i for i in range(config.trajectories)]
    trajs = train_trajectories(
        factory, splits["train"], config.recipe(), seeds, cache, progress, say
    )
    lap("trajectories")

    ckpt_logits = [
        _logits(skeleton, t.states, X_test)
        for t in bar(trajs, "checkpoint predictions", len(trajs), progress)
    ]
    finals = torch.stack([lg[-1] for lg in ckpt_logits])  # [T, N, C]
    final_states = [t.final for t in trajs]
    chosen: dict[str, float] = {}
    around = [
        build_methods(config, skeleton, trajs[t], splits, chosen, progress)
        for t in bar(range(config.tsne_trajectories), "methods", config.tsne_trajectories, progress)
    ]
    lap("methods")

    figures: list[str] = []

    def save(stem: str, figure: Path, payload: Any) -> None:
        write_json(out / f"{stem}.json", payload)
        figures.append(str(figure))

    # (a), (b): similarity along trajectory 0 and between the final solutions
    epochs = trajs[0].epochs
    cos_along = cosine_similarity(trajs[0].states)
    cos_between = cosine_similarity(final_states)
    dis_along = disagreement(ckpt_logits[0])
    dis_between = disagreement(finals)
    ticks = {"along trajectory 0 (epoch)": epochs, "between initialisations (seed)": seeds}
    for stem, along, between, label, bounds in (
        ("cosine_similarity", cos_along, cos_between, "weight-space cosine similarity", None),
        (
            "disagreement",
            dis_along,
            dis_between,
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
            out / f"{stem}.png",
            label,
            title=f"{label} ({splits['name']})",
            ticks=ticks,
            vmin=lo,
            vmax=hi,
        )
        save(
            stem,
            fig,
            {"epochs": epochs, "seeds": seeds, "along_trajectory": along, "between_inits": between},
        )
    lap("similarity")

    # (c) t-SNE of the checkpoints' and members' softmax outputs
    n_tsne = min(config.tsne_points, len(X_test))
    blocks, owner, kind, index = [], [], [], []
    for t in range(config.tsne_trajectories):
        blocks.append(ckpt_logits[t][:, :n_tsne])
        owner += [t] * len(epochs)
        kind += [CHECKPOINT] * len(epochs)
        index += list(epochs)
        for name, members in around[t].items():
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
        out / "tsne.png",
        title=f"t-SNE of softmax outputs on {n_tsne} test points ({splits['name']})",
    )
    save(
        "tsne",
        fig,
        {
            "points": points,
            "trajectory": owner,
            "kind": kind,
            "epoch_or_member": index,
            "test_points": n_tsne,
        },
    )
    lap("tsne")

    # (d) diversity–accuracy plane relative to trajectory 0's solution
    plane = {INDEPENDENT: diversity_accuracy(finals[0], finals[1:], y_test)}
    for name, members in around[0].items():
        plane[name] = diversity_accuracy(finals[0], members.logits, y_test)
    a_star = plane[INDEPENDENT]["reference_accuracy"]
    curves = reference_curves(a_star, C) if 1 / C < a_star < 1 else {}
    fig = plots.diversity_accuracy_plane(
        plane,
        out / "diversity_accuracy.png",
        a_star,
        curves,
        stars=(INDEPENDENT,),
        title=f"Diversity vs accuracy around trajectory 0's solution ({splits['name']})",
    )
    save(
        "diversity_accuracy",
        fig,
        {"reference_accuracy": a_star, "classes": C, "methods": plane, "curves": curves},
    )
    lap("diversity_accuracy")

    # (e) accuracy and NLL against ensemble size
    sizes = {INDEPENDENT: size_curve(finals, y_test, seed=config.seed)}
    for name, members in around[0].items():
        sizes[name] = size_curve(members.logits, y_test, seed=config.seed)
    fig = plots.ensemble_size_curves(
        {
            n: {"size": c["size"], "accuracy": c["accuracy_random"], "nll": c["nll_random"]}
            for n, c in sizes.items()
        },
        out / "ensemble_size.png",
        title=f"Ensemble size (mean over random member orders; {splits['name']} test)",
    )
    save("ensemble_size", fig, sizes)
    lap("ensemble_size")

    # (f) the radial cut through 0, θ₁ (trajectory 0) and θ₂ (trajectory 1)
    n_land = min(config.landscape_points, len(X_test))
    cut = radial_cut(
        skeleton,
        [final_states[0], final_states[1]],
        X_test[:n_land],
        y_test[:n_land],
        resolution=config.grid,
        paths={
            "trajectory 0": trajs[0].states,
            "trajectory 1": trajs[1].states,
            "diagonal Gaussian (trajectory 0)": around[0]["diagonal Gaussian"].states or [],
        },
        progress=progress,
    )
    fig = plots.radial_landscape(
        cut,
        out / "radial_landscape.png",
        title=f"Radial cut through the origin and two optima ({n_land} test points)",
    )
    save("radial_landscape", fig, cut)
    lap("radial_landscape")

    # the table: ensembles of k members
    k = config.ensemble_size
    rows = {INDEPENDENT: summary(finals[:k], y_test, weights=final_states[:k])}
    for name, members in around[0].items():
        weights = members.states[:k] if members.states is not None else None
        rows[name] = summary(members.logits[:k], y_test, weights=weights)
    table = format_table(rows, k)
    single = {
        "accuracy": float((finals[0].argmax(-1) == y_test).double().mean()),
        "nll": float(torch.nn.functional.cross_entropy(finals[0].double(), y_test)),
    }
    lap("table")
    times["total"] = round(time.perf_counter() - t_start, 2)
    result = {
        "command": command or "peg.apps.diversity.study.run(...)",
        "commit": git_commit(),
        "machine": machine(),
        "data": splits["name"],
        "sizes": {s: len(splits[s][0]) for s in ("train", "val", "test")},
        "config": config.to_dict(),
        "chosen": chosen,
        "single_model": single,
        "table": rows,
        "ensemble_size": k,
        "trajectory_history": {t.seed: t.history for t in trajs},
        "from_cache": {t.seed: t.from_cache for t in trajs},
        "seconds": times,
        "figures": figures,
    }
    write_json(out / "results.json", result)
    atomic_write_text(
        out / "results.md",
        f"{splits['name']} test set ({len(X_test)} points), ensembles of {k} members around "
        f"trajectory 0's solution (independent inits: {k} trajectories); command: "
        f"`{result['command']}`; machine: {result['machine']}\n\n{table}\n",
    )
    say("")
    say(table)
    say("")
    say(
        f"single model (trajectory 0): accuracy {100 * single['accuracy']:.2f}%, NLL "
        f"{single['nll']:.4f}; PEG η = {chosen.get('eta', float('nan')):.3g}, PEP σ = "
        f"{chosen.get('sigma', float('nan')):.3g}; total {times['total']:.1f} s; wrote {out}/"
        "results.json, results.md, " + ", ".join(Path(f).name for f in figures)
    )
    return result
