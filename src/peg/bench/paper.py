"""`peg paper-tables`: the structure of the PEG paper's Tables 1, 3, 5, 7 and 12 on our data.

Per seed, on one preset (data, model, recipes):

1. The training set is split 80:20 (stratified, seeded) into training and validation parts
   (paper §5); the test split scores everything.
2. Three SGD trainings from different seeds: DeepEns-3; its first member is the "SGD"
   solution (DeepEns-1) of Table 5.
3. One SWAG training with the SWA schedule. Its running mean is SWA (averaged with
   `torch.optim.swa_utils.AveragedModel`, BatchNorm re-estimated), SWAG draws 15 samples
   (scale 0.5) and SWAG-Diag 15 samples (scale 1, diagonal only) from the same moments, each
   sample's BatchNorm statistics re-estimated on the training data. (The paper trains SWAG and
   SWAG-Diag separately; their first and second moments would be the same run's.)
4. PEG and PEP on top of each base, as the paper: SWA with S=15/30 (Table 1); each DeepEns-3
   member with S=5/10 (Table 3, Algorithm 2); the SGD solution with S=10/30/50 (Table 5); each
   of 15 SWAG-Diag samples with S=1 (Table 7); the unbiased variant on SWA (Table 12). K=128.
   η by our search (grid + golden section on a held-out half of the validation set), σ by
   golden section in (5e-4, 5e-3) on validation NLL. A sixth table compares η chosen by the
   paper's protocol (grid 0.001, 0.01, 0.1, 1 scored on the same validation points the
   gradients come from) with our search, on SWA and on DeepEns-3.

Metrics on the test set: NLL, error, Brier and ECE with 10 equal-width bins of which only those
with ≥ 10 points count (paper §5.1). Mean ± std over seeds. Every trained model is checkpointed
and every entry's test logits cached under `--cache`, so an interrupted run resumes and a rerun
only rebuilds the tables.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg import data as datasets
from peg import metrics, models
from peg._env import git_commit, machine
from peg._io import atomic_write_text, load_tree, save_tree
from peg._progress import bar
from peg.bench.tables import markdown_table
from peg.ensemble import Ensemble
from peg.methods.deep_ensemble import DeepEnsemble
from peg.methods.peg import PEG
from peg.methods.pep import PEP
from peg.methods.swag import SWAG
from peg.train import Recipe

PAPER_GRID = (0.001, 0.01, 0.1, 1.0)
ECE_BINS, ECE_MIN_COUNT = 10, 10  # paper §5.1: bin width 0.1, at least 10 points per bin


@dataclass(frozen=True)
class Preset:
    """Data, model and recipes of one paper-tables run."""

    data: str
    model: str
    model_options: dict[str, Any]
    sgd: Recipe  # DeepEns members and the SGD solution
    swa: Recipe  # the SWAG/SWA run (schedule "swa")
    train_points: int | None = None  # subsample the 80% training part (None: all of it)
    test_points: int | None = None
    score_points: int | None = 2000  # validation points that score η / σ
    batch_size: int = 128  # PEG's K
    swag_samples: int = 15
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    # SmallCNN (width 16) on 24k of Fashion-MNIST's 48k training images; 12k validation, full
    # 10k test. SGD members: 15 epochs, cosine; SWAG: 15 epochs, SWA phase from epoch 8.
    "fashion-mnist": Preset(
        data="fashion-mnist",
        model="small-cnn",
        model_options={"width": 16},
        sgd=Recipe(epochs=15, lr=0.05, weight_decay=5e-4, schedule="cosine"),
        swa=Recipe(epochs=15, lr=0.05, weight_decay=5e-4, schedule="swa", swa_start=8, swa_lr=0.01),
        train_points=24000,
        notes="SmallCNN width 16, 24k training images (of 48k), 12k validation, 10k test",
    ),
    # The demo's regime: no weight decay, 30 epochs on 12k images, so the bases over-fit and are
    # over-confident, as the paper's CIFAR bases are (its SWA VGG-16 has 4.3% ECE).
    "fashion-mnist-overfit": Preset(
        data="fashion-mnist",
        model="small-cnn",
        model_options={"width": 16},
        sgd=Recipe(epochs=30, lr=0.05, weight_decay=0.0, schedule="cosine"),
        swa=Recipe(epochs=30, lr=0.05, weight_decay=0.0, schedule="swa", swa_start=16, swa_lr=0.01),
        train_points=12000,
        notes="SmallCNN width 16 without weight decay, 12k training images (of 48k), 12k "
        "validation, 10k test",
    ),
    # Seconds-sized: scikit-learn digits with an MLP (used by the tests and as a smoke run).
    "digits": Preset(
        data="digits",
        model="mlp",
        model_options={"hidden": (64,)},
        sgd=Recipe(epochs=12, lr=0.05, batch_size=64),
        swa=Recipe(epochs=12, lr=0.05, batch_size=64, schedule="swa", swa_start=6, swa_lr=0.01),
        score_points=None,
        notes="MLP (64 hidden), scikit-learn digits 8x8",
    ),
}


@dataclass(frozen=True)
class Entry:
    """One column of one table: a method built on a base, predicting the test set."""

    key: str  # unique; names the cache file
    build: Callable[[Run], tuple[Any, dict[str, Any]]]  # -> (predictor, info)


def _peg(base: str, size: int, **options: Any) -> Callable[[Run], tuple[Any, dict[str, Any]]]:
    def build(run: Run) -> tuple[Any, dict[str, Any]]:
        fitted = PEG(size=size, **{**run.peg_options, **options}).fit(run.base(base), run.val)
        return fitted, {"eta": fitted.eta_}

    return build


def _pep(base: str, size: int) -> Callable[[Run], tuple[Any, dict[str, Any]]]:
    def build(run: Run) -> tuple[Any, dict[str, Any]]:
        fitted = PEP(size=size, **run.pep_options).fit(run.base(base), run.val)
        return fitted, {"sigma": fitted.sigma_}

    return build


def _base(base: str) -> Callable[[Run], tuple[Any, dict[str, Any]]]:
    return lambda run: (run.base(base), {})


PAPER = {"eta": list(PAPER_GRID), "eta_holdout": 0.0}
ENTRIES: dict[str, Entry] = {
    e.key: e
    for e in [
        Entry("swa/peg-15", _peg("swa", 15)),
        Entry("swa/pep-15", _pep("swa", 15)),
        Entry("swa/peg-30", _peg("swa", 30)),
        Entry("swa/pep-30", _pep("swa", 30)),
        Entry("swa", _base("swa")),
        Entry("swa/peg-30-unbiased", _peg("swa", 30, variant="unbiased")),
        Entry("swa/peg-15-paper-grid", _peg("swa", 15, **PAPER)),
        Entry("deepens-3/peg-15", _peg("deepens-3", 5)),
        Entry("deepens-3/pep-15", _pep("deepens-3", 5)),
        Entry("deepens-3/peg-30", _peg("deepens-3", 10)),
        Entry("deepens-3/pep-30", _pep("deepens-3", 10)),
        Entry("deepens-3", _base("deepens-3")),
        Entry("deepens-3/peg-15-paper-grid", _peg("deepens-3", 5, **PAPER)),
        Entry("sgd/peg-10", _peg("sgd", 10)),
        Entry("sgd/peg-30", _peg("sgd", 30)),
        Entry("sgd/peg-50", _peg("sgd", 50)),
        Entry("sgd", _base("sgd")),
        Entry("swag-diag/peg-15", _peg("swag-diag", 1)),
        Entry("swag-diag/pep-15", _pep("swag-diag", 1)),
        Entry("swag-diag", _base("swag-diag")),
        Entry("swag", _base("swag")),
    ]
}

# (title, [(column label, entry key)]) in the paper's column order
TABLES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "1": (
        "SWA as the base solution (paper Table 1)",
        [("PEG-15", "swa/peg-15"), ("PEP-15", "swa/pep-15"), ("PEG-30", "swa/peg-30"),
         ("PEP-30", "swa/pep-30"), ("SWA", "swa")],
    ),
    "3": (
        "DeepEns-3 as the base solution (paper Table 3)",
        [("PEG-15", "deepens-3/peg-15"), ("PEP-15", "deepens-3/pep-15"),
         ("PEG-30", "deepens-3/peg-30"), ("PEP-30", "deepens-3/pep-30"),
         ("DeepEns-3", "deepens-3")],
    ),
    "5": (
        "DeepEns vs PEG on the SGD solution (paper Table 5)",
        [("PEG-10", "sgd/peg-10"), ("PEG-30", "sgd/peg-30"), ("PEG-50", "sgd/peg-50"),
         ("DeepEns-1", "sgd"), ("DeepEns-3", "deepens-3")],
    ),
    "7": (
        "SWAG-Diag as the base solution (paper Table 7)",
        [("PEG-15", "swag-diag/peg-15"), ("PEP-15", "swag-diag/pep-15"),
         ("SWAG-Diag", "swag-diag"), ("SWAG", "swag")],
    ),
    "12": (
        "Unbiased update with SWA as the base solution (paper Table 12)",
        [("PEG-Unbiased", "swa/peg-30-unbiased"), ("PEG-30", "swa/peg-30"), ("SWA", "swa")],
    ),
    "eta": (
        "η selection: the paper's grid (scored on the gradient points) vs our search",
        [("SWA: PEG-15 grid", "swa/peg-15-paper-grid"), ("SWA: PEG-15 search", "swa/peg-15"),
         ("DeepEns-3: PEG-15 grid", "deepens-3/peg-15-paper-grid"),
         ("DeepEns-3: PEG-15 search", "deepens-3/peg-15")],
    ),
}  # fmt: skip


class Run:
    """One seed of one preset: data, bases (trained lazily, checkpointed), cached test logits."""

    def __init__(
        self,
        preset: Preset,
        seed: int,
        cache: Path,
        root: str | None = None,
        progress: bool | None = None,
    ) -> None:
        self.preset, self.seed, self.progress = preset, seed, progress
        self.cache = cache / f"seed-{seed}"
        X, y = datasets.load(preset.data, "train", root=root, seed=seed)
        X_train, y_train, X_val, y_val = datasets.train_val_split(X, y, 0.2, seed=seed)
        self.train = _subsample(X_train, y_train, preset.train_points, seed)
        self.val = (X_val, y_val)
        self.test = _subsample(*datasets.load(preset.data, "test", root=root, seed=seed),
                               preset.test_points, seed)  # fmt: skip
        self.num_classes = int(torch.cat([y_train, y_val]).max()) + 1
        self.peg_options = {
            "batch_size": preset.batch_size,
            "eta": "search",
            "seed": seed,
            "progress": progress,
            "max_score_points": preset.score_points,
        }
        self.pep_options = {
            "seed": seed,
            "progress": progress,
            "max_score_points": preset.score_points,
        }

    def factory(self) -> nn.Module:
        shape = self.train[0].shape[1:]
        options = dict(self.preset.model_options)
        if self.preset.model == "mlp":
            options["in_features"] = int(torch.tensor(shape).prod())
        else:
            options["in_channels"] = int(shape[0])
        return models.build(self.preset.model, num_classes=self.num_classes, **options)

    @functools.cached_property
    def deep_ensemble(self) -> DeepEnsemble:
        return DeepEnsemble(
            size=3,
            recipe=self.preset.sgd,
            seed=self.seed,
            checkpoint_dir=self.cache / "deep-ensemble",
            progress=self.progress,
        ).fit(self.factory, self.train)

    @functools.cached_property
    def swag(self) -> SWAG:
        return SWAG(
            self.preset.swa,
            samples=self.preset.swag_samples,
            seed=self.seed,
            checkpoint=str(self.cache / "swag.safetensors"),
            progress=self.progress,
        ).fit(self.factory, self.train)

    def base(self, name: str) -> nn.Module | Ensemble:
        """A base solution by name: swa, sgd, deepens-3, swag, swag-diag."""
        if name == "swa":
            return self.swag.swa_model_
        if name == "sgd":
            return self.deep_ensemble.ensemble().member_model(0)
        if name == "deepens-3":
            return self.deep_ensemble.ensemble()
        if name == "swag":
            return self.swag.ensemble()
        if name == "swag-diag":
            return self.swag.ensemble(n=self.preset.swag_samples, diag=True, scale=1.0)
        raise KeyError(name)

    def logits(self, entry: Entry) -> tuple[Tensor, dict[str, Any]]:
        """Test-set member logits `[M, N, C]` of an entry, from the cache or computed."""
        path = self.cache / "logits" / (entry.key.replace("/", "__") + ".safetensors")
        if path.exists():
            saved = load_tree(path)
            return saved["logits"], saved["info"]
        start = time.perf_counter()
        predictor, info = entry.build(self)
        logits = _member_logits(predictor, self.test[0])
        info = {**info, "members": int(logits.shape[0]), "seconds": time.perf_counter() - start}
        save_tree(path, {"logits": logits, "info": info})
        return logits, info


def _subsample(X: Tensor, y: Tensor, n: int | None, seed: int) -> tuple[Tensor, Tensor]:
    if n is None or n >= len(X):
        return X, y
    idx = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))[:n]
    return X[idx.sort().values], y[idx.sort().values]


def _member_logits(predictor: Any, X: Tensor) -> Tensor:
    if isinstance(predictor, nn.Module):
        with torch.no_grad():
            return predictor.eval()(X).unsqueeze(0)
    return predictor.member_logits(X)


def run(
    preset: str = "fashion-mnist",
    seeds: Sequence[int] = (0, 1, 2),
    out: str | Path = "results",
    cache: str | Path = ".peg-cache/paper-tables",
    tables: Sequence[str] | None = None,
    root: str | None = None,
    progress: bool | None = None,
    command: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Compute the tables, write `paper-tables-<preset>.{md,json}` under `out`, return them."""
    if preset not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    wanted = list(TABLES) if tables is None else [str(t) for t in tables]
    unknown = [t for t in wanted if t not in TABLES]
    if unknown:
        raise ValueError(f"tables: unknown {unknown}; known: {list(TABLES)}")
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    chosen = PRESETS[preset]
    keys = list(dict.fromkeys(key for t in wanted for _, key in TABLES[t][1]))
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {key: {"metrics": [], "info": []} for key in keys}
    for seed in seeds:
        say(f"seed {seed}: {chosen.notes}")
        one = Run(chosen, seed, Path(cache) / preset, root, progress)
        for key in bar(keys, f"seed {seed}", len(keys), progress):
            logits, info = one.logits(ENTRIES[key])
            m = metrics.classification_metrics(logits, one.test[1], ECE_BINS, ECE_MIN_COUNT)
            results[key]["metrics"].append(m)
            results[key]["info"].append(info)
    wall = time.perf_counter() - started
    header = (
        f"{chosen.data}, {chosen.notes}; seeds {list(seeds)} (mean ± std); "
        f"command: `{command or f'peg paper-tables --preset {preset}'}`; machine: {machine()}; "
        f"wall time {wall:.0f} s (cached parts are not recomputed)"
    )
    sections = [f"# PEG paper tables on {chosen.data}\n\n{header}\n"]
    for t in wanted:
        title, columns = TABLES[t]
        cells = {
            label: {k: [m[k] for m in results[key]["metrics"]] for k in ("nll", "error", "brier",
                                                                         "ece")}
            for label, key in columns
        }  # fmt: skip
        sections.append(f"## Table {t}: {title}\n\n{markdown_table(cells)}\n")
    sections.append(_choices(results))
    text = "\n".join(sections)
    payload = {
        "preset": preset,
        "settings": asdict(chosen),
        "seeds": list(seeds),
        "command": command,
        "machine": machine(),
        "git_commit": git_commit(),
        "wall_seconds": wall,
        "ece": {"bins": ECE_BINS, "min_count": ECE_MIN_COUNT},
        "entries": results,
        "tables": {t: {"title": TABLES[t][0], "columns": TABLES[t][1]} for t in wanted},
    }
    out = Path(out)
    atomic_write_text(out / f"paper-tables-{preset}.md", text)
    atomic_write_text(
        out / f"paper-tables-{preset}.json", json.dumps(payload, indent=2, default=str) + "\n"
    )
    say(text)
    return payload


def _choices(results: dict[str, dict[str, Any]]) -> str:
    """The η and σ chosen per entry (mean over seeds), so a reader can see what was used."""
    lines = ["## Chosen scales\n", "| entry | η (PEG) or σ (PEP) per seed |", "|---|---|"]
    for key, r in results.items():
        values = [i.get("eta", i.get("sigma")) for i in r["info"]]
        if all(v is not None for v in values):
            lines.append(f"| {key} | " + ", ".join(f"{v:.3g}" for v in values) + " |")
    if len(lines) == 3:
        return ""
    return "\n".join(lines) + "\n"


__all__ = ["ENTRIES", "PRESETS", "TABLES", "Preset", "run"]
