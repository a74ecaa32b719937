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

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from peg import metrics
from peg.apps.bench.folders import claim_paper
from peg.apps.bench.seed import SeedRun
from peg.apps.bench.spec import MethodSpec, Spec
from peg.apps.bench.tables import markdown_table
from peg.apps.results import write_results
from peg.train import Recipe
from peg.utils.env import git_commit, machine
from peg.utils.progress import bar

PAPER_GRID = (0.001, 0.01, 0.1, 1.0)
ECE_BINS, ECE_MIN_COUNT = 10, 10  # paper §5.1: bin width 0.1, at least 10 points per bin


def _spec(name: str, data: str, model: dict[str, Any], sgd: Recipe, swa: Recipe, **kw: Any) -> Spec:
    return Spec(name, data, model, sgd, methods=METHODS, swa=swa, **kw)


def _m(key: str, method: str, base: str, **options: Any) -> MethodSpec:
    return MethodSpec(key, method, base, options)


PAPER = {"eta": list(PAPER_GRID), "search": {"holdout": 0.0}}
# Every column of every table, named "<base>/<method>-<members>" (base "single" is the SGD
# solution, the deep ensemble's first member).
METHODS: tuple[MethodSpec, ...] = (
    _m("swa/peg-15", "peg", "swa", n_members=15),
    _m("swa/pep-15", "pep", "swa", n_members=15),
    _m("swa/peg-30", "peg", "swa", n_members=30),
    _m("swa/pep-30", "pep", "swa", n_members=30),
    _m("swa", "base", "swa"),
    _m("swa/peg-30-unbiased", "peg", "swa", n_members=30, variant="unbiased"),
    _m("swa/peg-15-paper-grid", "peg", "swa", n_members=15, **PAPER),
    _m("deepens-3/peg-15", "peg", "deepens-3", n_members=5),
    _m("deepens-3/pep-15", "pep", "deepens-3", n_members=5),
    _m("deepens-3/peg-30", "peg", "deepens-3", n_members=10),
    _m("deepens-3/pep-30", "pep", "deepens-3", n_members=10),
    _m("deepens-3", "base", "deepens-3"),
    _m("deepens-3/peg-15-paper-grid", "peg", "deepens-3", n_members=5, **PAPER),
    _m("sgd/peg-10", "peg", "single", n_members=10),
    _m("sgd/peg-30", "peg", "single", n_members=30),
    _m("sgd/peg-50", "peg", "single", n_members=50),
    _m("sgd", "base", "single"),
    _m("swag-diag/peg-15", "peg", "swag-diag", n_members=1),
    _m("swag-diag/pep-15", "pep", "swag-diag", n_members=1),
    _m("swag-diag", "base", "swag-diag"),
    _m("swag", "base", "swag"),
)
ENTRIES = {m.name: m for m in METHODS}

PRESETS: dict[str, Spec] = {
    # SmallCNN (width 16) on 24k of Fashion-MNIST's 48k training images; 12k validation, full
    # 10k test. SGD members: 15 epochs, cosine; SWAG: 15 epochs, SWA phase from epoch 8.
    "fashion-mnist": _spec(
        "fashion-mnist",
        "fashion-mnist",
        {"name": "small-cnn", "width": 16},
        Recipe(epochs=15, lr=0.05, weight_decay=5e-4, schedule="cosine"),
        Recipe(epochs=15, lr=0.05, weight_decay=5e-4, schedule="swa", swa_start=8, swa_lr=0.01),
        train_points=24000,
    ),
    # The demo's regime: no weight decay, 30 epochs on 12k images, so the bases over-fit and are
    # over-confident, as the paper's CIFAR bases are (its SWA VGG-16 has 4.3% ECE).
    "fashion-mnist-overfit": _spec(
        "fashion-mnist-overfit",
        "fashion-mnist",
        {"name": "small-cnn", "width": 16},
        Recipe(epochs=30, lr=0.05, weight_decay=0.0, schedule="cosine"),
        Recipe(epochs=30, lr=0.05, weight_decay=0.0, schedule="swa", swa_start=16, swa_lr=0.01),
        train_points=12000,
    ),
    # Seconds-sized: scikit-learn digits with an MLP (used by the tests and as a smoke run).
    "digits": _spec(
        "digits",
        "digits",
        {"name": "mlp", "hidden": (64,)},
        Recipe(epochs=12, lr=0.05, batch_size=64),
        Recipe(epochs=12, lr=0.05, batch_size=64, schedule="swa", swa_start=6, swa_lr=0.01),
        score_points=None,
    ),
}
NOTES = {
    "fashion-mnist": "SmallCNN width 16, 24k training images (of 48k), 12k validation, 10k test",
    "fashion-mnist-overfit": "SmallCNN width 16 without weight decay, 12k training images (of "
    "48k), 12k validation, 10k test",
    "digits": "MLP (64 hidden), scikit-learn digits 8x8",
}


# (title, [(column label, entry key)]) in the paper's column order
TABLES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "1": (
        "SWA as the base solution (paper Table 1)",
        [
            ("PEG-15", "swa/peg-15"),
            ("PEP-15", "swa/pep-15"),
            ("PEG-30", "swa/peg-30"),
            ("PEP-30", "swa/pep-30"),
            ("SWA", "swa"),
        ],
    ),
    "3": (
        "DeepEns-3 as the base solution (paper Table 3)",
        [
            ("PEG-15", "deepens-3/peg-15"),
            ("PEP-15", "deepens-3/pep-15"),
            ("PEG-30", "deepens-3/peg-30"),
            ("PEP-30", "deepens-3/pep-30"),
            ("DeepEns-3", "deepens-3"),
        ],
    ),
    "5": (
        "DeepEns vs PEG on the SGD solution (paper Table 5)",
        [
            ("PEG-10", "sgd/peg-10"),
            ("PEG-30", "sgd/peg-30"),
            ("PEG-50", "sgd/peg-50"),
            ("DeepEns-1", "sgd"),
            ("DeepEns-3", "deepens-3"),
        ],
    ),
    "7": (
        "SWAG-Diag as the base solution (paper Table 7)",
        [
            ("PEG-15", "swag-diag/peg-15"),
            ("PEP-15", "swag-diag/pep-15"),
            ("SWAG-Diag", "swag-diag"),
            ("SWAG", "swag"),
        ],
    ),
    "12": (
        "Unbiased update with SWA as the base solution (paper Table 12)",
        [("PEG-Unbiased", "swa/peg-30-unbiased"), ("PEG-30", "swa/peg-30"), ("SWA", "swa")],
    ),
    "eta": (
        "η selection: the paper's grid (scored on the gradient points) vs our search",
        [
            ("SWA: PEG-15 grid", "swa/peg-15-paper-grid"),
            ("SWA: PEG-15 search", "swa/peg-15"),
            ("DeepEns-3: PEG-15 grid", "deepens-3/peg-15-paper-grid"),
            ("DeepEns-3: PEG-15 search", "deepens-3/peg-15"),
        ],
    ),
}


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
    overwrite: bool = False,
) -> dict[str, Any]:
    """Compute the tables, write `paper-tables-<preset>.{md,json}` under `out`, return them.
    `out` is refused before any work where it is a non-empty folder of the user's, unless
    `overwrite` (`peg.apps.bench.folders.claim_paper`)."""
    if preset not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    wanted = list(TABLES) if tables is None else [str(t) for t in tables]
    unknown = [t for t in wanted if t not in TABLES]
    if unknown:
        raise ValueError(f"tables: unknown {unknown}; known: {list(TABLES)}")
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    claim_paper(out, preset, overwrite)
    chosen = PRESETS[preset]
    keys = list(dict.fromkeys(key for t in wanted for _, key in TABLES[t][1]))
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {key: {"metrics": [], "info": []} for key in keys}
    for seed in seeds:
        say(f"seed {seed}: {NOTES[preset]}")
        one = SeedRun(chosen, seed, Path(cache), root, progress)
        for key in bar(keys, f"seed {seed}", len(keys), progress):
            logits = one.logits(ENTRIES[key])["test"]
            m = metrics.classification_metrics(logits, one.test[1], ECE_BINS, ECE_MIN_COUNT)
            results[key]["metrics"].append(m)
            results[key]["info"].append({**one.info(ENTRIES[key]), "members": len(logits)})
    wall = time.perf_counter() - started
    header = (
        f"{chosen.data}, {NOTES[preset]}; seeds {list(seeds)} (mean ± std); "
        f"command: `{command or f'peg paper-tables --preset {preset}'}`; machine: {machine()}; "
        f"wall time {wall:.0f} s (cached parts are not recomputed)"
    )
    sections = [f"# PEG paper tables on {chosen.data}\n\n{header}\n"]
    for t in wanted:
        title, columns = TABLES[t]
        cells = {
            label: {
                k: [m[k] for m in results[key]["metrics"]] for k in ("nll", "error", "brier", "ece")
            }
            for label, key in columns
        }
        sections.append(f"## Table {t}: {title}\n\n{markdown_table(cells)}\n")
    sections.append(_choices(results))
    text = "\n".join(sections)
    payload = {
        "preset": preset,
        "settings": {"spec": asdict(chosen), "notes": NOTES[preset]},
        "seeds": list(seeds),
        "command": command,
        "machine": machine(),
        "git_commit": git_commit(),
        "wall_seconds": wall,
        "ece": {"bins": ECE_BINS, "min_count": ECE_MIN_COUNT},
        "entries": results,
        "tables": {t: {"title": TABLES[t][0], "columns": TABLES[t][1]} for t in wanted},
    }
    write_results(out, payload, text, stem=f"paper-tables-{preset}", default=str)
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


__all__ = ["ENTRIES", "METHODS", "PRESETS", "TABLES", "run"]
