"""`peg demo`: train a base model, build PEG-15, PEP-15 and a temperature-scaled base, compare.

Image data (Fashion-MNIST; scikit-learn digits when Fashion-MNIST is not installed): a small
CNN is trained on 80% of the training set; the other 20% is the validation set every post-hoc
method is fitted on; the test set scores them. Toy data (two moons, three moons, linearly
separable): the PEG paper's §5.6 MLP (one hidden layer of 20 units), PEG-5 vs PEP-5, and the
decision-boundary figure of its Figs. 2/3.

Writes to `--out`: results.json (metrics, chosen hyper-parameters, wall times, command,
machine), results.md (the table), reliability.png, and for toy data decision_boundaries.png.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from peg import data as datasets
from peg import metrics, models, plots
from peg.apps.bench.tables import markdown_table
from peg.apps.data import load_or_digits, subsample
from peg.apps.registry import Site, build
from peg.apps.results import RESULTS, claim, write_results
from peg.methods._predictors import member_logits_of
from peg.methods.calibration._calibrator import table_name
from peg.methods.calibration.temperature import TemperatureScaling
from peg.train import train
from peg.utils.env import git_commit, machine

IMAGE_DATA = ("fashion-mnist", "digits")
BINS = 15  # the confidence bins of the table's ECE and of the reliability figure alike
TS_COLUMN = table_name(TemperatureScaling)  # the table's column of temperature scaling
TOY_DATA = ("two-moons", "three-moons", "linear")
FILES = (*RESULTS, "reliability.png", "decision_boundaries.png")  # what a run writes to `out`
# Toy sets noisy enough that the classes overlap (the paper's bases reach 98% and 89%).
TOY_OPTIONS: dict[str, dict[str, Any]] = {
    "two-moons": {"n": 2000, "noise": 0.25},
    "three-moons": {"n": 2400, "noise": 0.2},
    "linear": {"n": 2000, "noise": 0.3},
}


@dataclass
class Preset:
    """Sizes of one demo run."""

    epochs: int
    lr: float
    members: int
    train_points: int | None = None  # subsample the training split (None: all)
    test_points: int | None = None
    score_points: int | None = None  # validation points that score η / σ (None: all)
    weight_decay: float = 5e-4
    optimizer: str = "sgd"
    batch_size: int = 128
    width: int = 16  # SmallCNN width (default 32): 16 halves the demo's inference cost


PRESETS: dict[tuple[str, bool], Preset] = {
    # The base is trained without weight decay on 12k of the 48k training points until it
    # over-fits (train accuracy > val accuracy, over-confident): the regime post-hoc
    # ensembles are for. A well-regularised base leaves them nothing to fix (η → 0).
    ("fashion-mnist", False): Preset(
        epochs=30, lr=0.05, members=15, train_points=12000, weight_decay=0.0, score_points=2000
    ),
    ("fashion-mnist", True): Preset(
        epochs=2, lr=0.05, members=15, train_points=8000, test_points=2000, score_points=1000
    ),
    ("digits", False): Preset(epochs=30, lr=0.05, members=15),
    ("digits", True): Preset(epochs=10, lr=0.05, members=15),
    # toy (paper §5.6): 200 training points, full-batch Adam, no weight decay: over-fitted
    ("toy", False): Preset(
        epochs=1500,
        lr=0.01,
        members=5,
        optimizer="adam",
        weight_decay=0.0,
        batch_size=200,
        train_points=200,
    ),
    ("toy", True): Preset(
        epochs=500,
        lr=0.02,
        members=5,
        optimizer="adam",
        weight_decay=0.0,
        batch_size=200,
        train_points=200,
    ),
}


class _Timer:
    """The wall time of each step of the demo, said as the step ends."""

    def __init__(self, say: Any) -> None:
        self.say, self.times = say, {}

    def __call__(self, label: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        result = fn()
        self.times[label] = round(time.perf_counter() - t0, 2)
        self.say(f"  {label}: {self.times[label]:.1f} s")
        return result


@dataclass
class _Data:
    """The demo's data: its name, the train/validation/test splits (subsampled by the preset)
    and whether it is a 2-D toy set."""

    name: str
    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    classes: int
    toy: bool


def _data(data: str, quick: bool, seed: int, say: Any) -> tuple[_Data, Preset]:
    """The data set (Fashion-MNIST falling back to digits) split 80/20 and subsampled, and the
    preset of sizes for it."""
    data, (X_all, y_all), (X_test, y_test) = load_or_digits(
        data, say, seed=seed, **TOY_OPTIONS.get(data, {})
    )
    toy = data in TOY_DATA
    preset = PRESETS[("toy" if toy else data, quick)]
    X_train, y_train, X_val, y_val = datasets.train_val_split(X_all, y_all, 0.2, seed=seed)
    train = subsample(X_train, y_train, preset.train_points, seed)
    test = subsample(X_test, y_test, preset.test_points, seed)
    return _Data(data, train, (X_val, y_val), test, int(y_all.max()) + 1, toy), preset


def _base(d: _Data, preset: Preset) -> nn.Module:
    """The untrained base: the paper's §5.6 MLP for toy data, a SmallCNN for images."""
    features = d.train[0].shape[1]
    if d.toy:
        return models.MLP(features, d.classes, hidden=(20,))
    return models.SmallCNN(in_channels=features, num_classes=d.classes, width=preset.width)


def _proba(predictor: Any) -> Any:
    """`points -> [N, C]` probabilities of any predictor (for the decision boundaries)."""
    return lambda points: member_logits_of(predictor, points).softmax(-1).mean(0)


def _figures(d: _Data, logits: dict[str, Any], drawn: dict[str, Any], out: Path) -> list[str]:
    """reliability.png (every column), and for toy data decision_boundaries.png (the
    predictors `drawn`: the base, PEP and PEG)."""
    y_test = d.test[1]
    figures = [
        str(
            plots.reliability_diagram(
                {n: metrics.reliability(lg, y_test, bins=BINS) for n, lg in logits.items()},
                out / "reliability.png",
                title=f"Reliability on {d.name} test data ({BINS} bins, as the table's ECE)",
            )
        )
    ]
    if d.toy:
        pep, peg_ = list(drawn)[1:]
        boundaries = plots.decision_boundaries(
            {n: _proba(p) for n, p in drawn.items()},
            *d.test,
            out / "decision_boundaries.png",
            title=f"{d.name}: base MLP vs {pep} vs {peg_}",
        )
        figures.append(str(boundaries))
    return figures


def run(
    data: str = "fashion-mnist",
    quick: bool = False,
    out: str | Path = "peg-demo",
    seed: int = 0,
    progress: bool | None = None,
    say: Any = print,
    command: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the demo; returns what it writes to `out/results.json`.

    `command` is recorded in the results (the CLI passes its own command line). `out` is
    refused before any work where it is a non-empty folder peg demo did not make (its files
    would replace the user's of the same names), unless `overwrite` (`--overwrite`).
    """
    if data not in IMAGE_DATA + TOY_DATA:
        raise ValueError(f"data: expected one of {list(IMAGE_DATA + TOY_DATA)}, got {data!r}")
    out = claim(out, "demo", overwrite, writes="results.json, results.md and figures", files=FILES)
    t_start = time.perf_counter()
    torch.manual_seed(seed)
    timed = _Timer(say)
    d, preset = _data(data, quick, seed, say)
    base, S = _base(d, preset), preset.members
    say(
        f"peg demo: {d.name}, {len(d.train[0])} train / {len(d.val[0])} validation / "
        f"{len(d.test[0])} test, {type(base).__name__} "
        f"({sum(p.numel() for p in base.parameters()):,} parameters), {machine()}"
    )
    fit = {"epochs": preset.epochs, "lr": preset.lr, "optimizer": preset.optimizer}
    fit |= {"weight_decay": preset.weight_decay, "batch_size": preset.batch_size}
    base, history = timed(
        "train base model", lambda: train(base, d.train, seed=seed, progress=progress, **fit)
    )
    # the methods, through the registry (peg.apps.registry), on the base and validation set
    site = Site(
        seed=seed, progress=progress, base=lambda: base, val=d.val, score_points=preset.score_points
    )
    ts = timed("temperature scaling", lambda: build(TemperatureScaling.method, site))
    pep = timed(f"PEP-{S} (σ search)", lambda: build("pep", site, n_members=S))
    K = min(128, len(d.val[0]) // 4)  # PEG's mini-batch size
    peg_ = timed(f"PEG-{S} (η search)", lambda: build("peg", site, n_members=S, grad_batch_size=K))
    predictors = {"Base": base, TS_COLUMN: ts, f"PEP-{S}": pep, f"PEG-{S}": peg_}
    X_test, y_test = d.test
    logits = {name: member_logits_of(p, X_test) for name, p in predictors.items()}
    columns = {
        name: metrics.classification_metrics(lg, y_test, bins=BINS) for name, lg in logits.items()
    }
    table = markdown_table(columns)
    drawn = {"Base": base, f"PEP-{S}": pep, f"PEG-{S}": peg_}
    figures = _figures(d, logits, drawn, out)
    timed.times["total"] = round(time.perf_counter() - t_start, 2)
    result = {
        "command": command or f"peg.apps.demo.run(data={d.name!r}, quick={quick}, seed={seed})",
        "commit": git_commit(),
        "machine": machine(),
        "data": d.name,
        "sizes": {"train": len(d.train[0]), "validation": len(d.val[0]), "test": len(X_test)},
        "preset": asdict(preset),
        "base_history": history,
        "chosen": {
            "temperature": ts.temperature_,
            "sigma": pep.sigma_,
            "eta": peg_.eta_,
            "sigma_search": pep.search_,
            "eta_search": peg_.search_,
        },
        "metrics": columns,
        "seconds": timed.times,
        "figures": figures,
        "note": "error and ece are fractions (the table prints them as %)",
    }
    markdown = (
        f"{d.name} test set ({len(X_test)} points); command: "
        f"`{result['command']}`; machine: {result['machine']}\n\n{table}\n"
    )
    write_results(out, result, markdown, default=str)
    say("")
    say(table)
    say("")
    say(
        f"T = {ts.temperature_:.3f}, σ = {pep.sigma_:.3g}, η = {peg_.eta_:.3g}; "
        f"total {timed.times['total']:.1f} s; wrote {out}/results.json, results.md, "
        + ", ".join(Path(f).name for f in figures)
    )
    return result
