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

The settings are in `peg.apps.diversity.config`, the methods (through the method registry) in
`peg.apps.diversity.methods`, the figures in `peg.apps.diversity.figures`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg import data as datasets
from peg import models
from peg.analysis.trajectories import train_trajectories
from peg.apps.data import load_or_digits, subsample
from peg.apps.diversity.config import QUICK, DiversityConfig, load_config
from peg.apps.diversity.figures import CHECKPOINT, INDEPENDENT, Figures
from peg.apps.diversity.methods import Members, build_methods
from peg.apps.results import claim, earlier_results, write_results
from peg.ensemble import Ensemble
from peg.metrics.diversity import summary
from peg.utils.env import git_commit, machine
from peg.utils.progress import bar

Say = Callable[[str], None]
# what a results.json of peg diversity holds (an earlier version's folder, before the mark)
RESULT_KEYS = ("config", "table", "trajectory_history", "figures")


# ---------------------------------------------------------------- data and models
def load_data(config: DiversityConfig, say: Say) -> dict[str, Any]:
    """Train / validation / test splits (Fashion-MNIST falls back to digits, saying so)."""
    name, train_all, test = load_or_digits(config.data, say)
    X_tr, y_tr, X_val, y_val = datasets.train_val_split(
        *train_all, config.val_fraction, seed=config.seed
    )
    return {
        "name": name,
        "train": subsample(X_tr, y_tr, config.train_points, config.seed),
        "val": subsample(X_val, y_val, config.val_points, config.seed),
        "test": subsample(*test, config.test_points, config.seed),
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
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run every analysis; returns what it writes to `out/results.json`.

    Args:
        config: the settings (default `DiversityConfig()`, the full run).
        out: output folder for figures and JSON.
        cache: folder of the cached trajectories (None: train in memory, cache nothing).
        progress: progress bars (None: only on a terminal).
        say: where progress messages and the table go.
        command: the command line, recorded in results.json.
        overwrite: write into `out` though it is a non-empty folder peg diversity did not make
            (refused otherwise, before any work: `peg.apps.results.claim`; an earlier
            version's folder, without the mark, is peg's where its results.json is one peg
            diversity wrote).
    """
    config = config or DiversityConfig()
    claim(
        out,
        "diversity",
        overwrite,
        writes="results.json, results.md and the figures",
        ours=lambda f: earlier_results(f / "results.json", RESULT_KEYS),
    )
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        return _run(config, Path(out), cache, progress, say, command)
    finally:
        torch.set_num_threads(threads)


class _Laps:
    """Wall time per step: `lap(label)` records the time since the previous lap."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.times: dict[str, float] = {}

    def __call__(self, label: str) -> None:
        now = time.perf_counter()
        self.times[label] = round(now - self.last, 2)
        self.last = now


def _draw(figures: Figures, lap: _Laps) -> None:
    """Every figure, each timed under its own label."""
    for draw, label in (
        (figures.similarity, "similarity"),
        (figures.tsne, "tsne"),
        (figures.plane, "diversity_accuracy"),
        (figures.ensemble_size, "ensemble_size"),
        (figures.radial_landscape, "radial_landscape"),
    ):
        draw()
        lap(label)


def _table(
    figures: Figures, trajs: list[Any], around: list[dict[str, Members]], y_test: Tensor, k: int
) -> tuple[dict[str, Any], str, dict[str, float]]:
    """The table of ensembles of k members (independent inits, then every method around
    trajectory 0's solution), its markdown, and the single model's accuracy and NLL."""
    finals, final_states = figures.finals, [t.final for t in trajs]
    rows = {INDEPENDENT: summary(finals[:k], y_test, weights=final_states[:k])}
    for name, members in around[0].items():
        weights = members.states[:k] if members.states is not None else None
        rows[name] = summary(members.logits[:k], y_test, weights=weights)
    single = {
        "accuracy": float((finals[0].argmax(-1) == y_test).double().mean()),
        "nll": float(torch.nn.functional.cross_entropy(finals[0].double(), y_test)),
    }
    return rows, format_table(rows, k), single


def _run(
    config: DiversityConfig,
    out: Path,
    cache: str | Path | None,
    progress: bool | None,
    say: Say,
    command: str | None,
) -> dict[str, Any]:
    lap = _Laps()
    splits = load_data(config, say)
    X_test, y_test = splits["test"]
    factory = _factory(config, splits["train"][0].shape[1], splits["classes"])
    skeleton = factory().eval()
    say(_setting(config, splits, skeleton))
    seeds = [config.seed + i for i in range(config.trajectories)]
    trajs = train_trajectories(
        factory, splits["train"], config.recipe(), seeds, cache, progress, say
    )
    lap("trajectories")
    ckpt_logits = [
        _logits(skeleton, t.states, X_test)
        for t in bar(trajs, "checkpoint predictions", len(trajs), progress)
    ]
    chosen: dict[str, float] = {}
    around: list[dict[str, Members]] = [
        build_methods(config, skeleton, trajs[t], splits, chosen, progress)
        for t in bar(range(config.tsne_trajectories), "methods", config.tsne_trajectories, progress)
    ]
    lap("methods")
    figures = Figures(
        config,
        out,
        splits["name"],
        trajs,
        seeds,
        ckpt_logits,
        around,
        skeleton,
        (X_test, y_test),
        splits["classes"],
        progress,
    )
    _draw(figures, lap)
    k = config.ensemble_size
    rows, table, single = _table(figures, trajs, around, y_test, k)
    lap("table")
    lap.times["total"] = round(time.perf_counter() - lap.start, 2)
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
        "seconds": lap.times,
        "figures": figures.written,
    }
    markdown = (
        f"{splits['name']} test set ({len(X_test)} points), ensembles of {k} members around "
        f"trajectory 0's solution (independent inits: {k} trajectories); command: "
        f"`{result['command']}`; machine: {result['machine']}\n\n{table}\n"
    )
    write_results(out, result, markdown, indent=1, strict=True)
    say("")
    say(table)
    say("")
    say(_summary(single, chosen, lap.times["total"], out, figures.written))
    return result


def _setting(config: DiversityConfig, splits: dict[str, Any], skeleton: nn.Module) -> str:
    """The run's first line: the data, the model and the trajectories, the machine."""
    return (
        f"peg diversity: {splits['name']}, {len(splits['train'][0])} train / "
        f"{len(splits['val'][0])} validation / {len(splits['test'][0])} test, "
        f"{config.model['name']} ({sum(p.numel() for p in skeleton.parameters()):,} "
        f"parameters), {config.trajectories} trajectories × {config.recipe().epochs} epochs; "
        f"{machine()}"
    )


def _summary(
    single: dict[str, float], chosen: dict[str, float], total: float, out: Path, written: Any
) -> str:
    """The run's last line: the single model, the scales chosen, the time, the files."""
    return (
        f"single model (trajectory 0): accuracy {100 * single['accuracy']:.2f}%, NLL "
        f"{single['nll']:.4f}; PEG η = {chosen.get('eta', float('nan')):.3g}, PEP σ = "
        f"{chosen.get('sigma', float('nan')):.3g}; total {total:.1f} s; wrote "
        f"{out}/results.json, results.md, " + ", ".join(Path(f).name for f in written)
    )


__all__ = [
    "CHECKPOINT",
    "INDEPENDENT",
    "QUICK",
    "DiversityConfig",
    "Members",
    "build_methods",
    "format_table",
    "load_config",
    "load_data",
    "run",
]
