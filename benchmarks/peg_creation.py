"""The cost of building PEG-15 (η search included) against one epoch of training its base.

Target (issue 7): building PEG-15 on Fashion-MNIST's validation split, η search included, takes
less than one epoch of training the base model, because the S gradients are computed once and
reused for every η, each η is scored with forward passes only. The default search (issue 15,
`peg.methods.perturbation._surrogate`) scores at most 3 η exactly; the golden search
(`search="golden"`, the default before) races each new η against the best so far on a growing prefix
of the scoring points (`race`, see `peg.methods.perturbation._golden.PairedRace`), or, without
racing, stops as soon as it cannot beat the best (`early_stop`, exact), the grid stops growing once
the score is flat (`tol`), and scoring may use a fixed subsample (`max_points`): all options of
`ScaleSearch`. How close the surrogate search's η comes to the best: benchmarks/scale_search.py.
Each setting's η is compared with the same search scored on every point; "points used" is the
share of the scoring points an exhaustive search would score. One epoch is timed on the
preset's training subset and on the full training split (48k images); also reported: the ratio
to training Deep Ensembles-15 with the same recipe (15 × epochs × the measured epoch).

Set-up: SmallCNN width 16 on Fashion-MNIST with 12k validation images; two bases: the
`fashion-mnist` preset of `peg bench` (24k training images, weight decay: well calibrated, so
the search drives η towards 0) and the `fashion-mnist-overfit` preset of `peg paper-tables`
(12k training images, no weight decay: over-confident, so η lands inside the grid). Each base
is the preset's seed-0 model from its cache when present, otherwise trained here with the
preset's recipe. Every number is measured in this run, on this machine (printed).

    python benchmarks/peg_creation.py [--repeats 3] [--bases ...] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from pathlib import Path

from _timing import median_time

from peg.apps.bench.paper import PRESETS
from peg.apps.bench.seed import SeedRun
from peg.apps.bench.spec import Spec, find_spec, load_specs
from peg.methods.perturbation._scale_search import ScaleSearch
from peg.methods.perturbation.peg import PEG
from peg.train import train
from peg.utils.env import machine

BASES = {
    # name: (label, spec, cache): the bench preset's base, and the paper-tables preset whose
    # bases over-fit (no weight decay), the regime where PEG picks an interior η
    "fashion-mnist": (
        "bench preset (weight decay)",
        lambda: load_specs(find_spec("fashion-mnist"))[0],
        ".peg-cache/bench",
    ),
    "fashion-mnist-overfit": (
        "over-fit (no weight decay, 12k)",
        lambda: PRESETS["fashion-mnist-overfit"],
        ".peg-cache/paper-tables",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bases", nargs="+", default=list(BASES), choices=list(BASES))
    parser.add_argument("--quick", action="store_true", help="3k training images, 1 repeat")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    print(f"machine: {machine()}; median of {repeats}")
    for name in args.bases:
        label, make_spec, cache = BASES[name]
        spec = dataclasses.replace(make_spec(), methods=())  # trains member 0 only
        if args.quick:
            spec = dataclasses.replace(spec, name=f"{name}-quick", train_points=3000)
        _benchmark(label, spec, Path(cache), repeats)


PAPER_GRID = [1e-3, 1e-2, 1e-1, 1.0]
EVERY = {"race": 0, "early_stop": False}  # every η scored on every point
SUBSAMPLE = {"race": 0, "max_points": 1000}  # early stop on a fixed 1000-point subsample
GOLDEN = {"eta": "search", "method": "golden"}
# (setting, PEG options, index of the exhaustively scored setting it must agree with)
SETTINGS = [
    ("golden search, every point scored", {**GOLDEN, **EVERY}, None),
    ("golden search, race", GOLDEN, 0),
    ("golden search, early stop, no race", {**GOLDEN, "race": 0}, 0),
    ("golden search, early stop + 1000 points", {**GOLDEN, **SUBSAMPLE}, 0),
    ("surrogate search (default)", {"eta": "search"}, None),
    ("paper grid, every point scored", {"eta": PAPER_GRID, **EVERY}, None),
    ("paper grid, race", {"eta": PAPER_GRID}, 5),
    ("paper grid, early stop + 1000 points", {"eta": PAPER_GRID, **SUBSAMPLE}, 5),
]  # fmt: skip


def _benchmark(label: str, spec: Spec, cache: Path, repeats: int) -> None:
    """Time one epoch of the base's training and PEG-15 with several scoring settings."""
    run = SeedRun(spec, 0, cache, progress=False)
    base = run.bases.get("single").eval()
    full = SeedRun(dataclasses.replace(spec, train_points=None), 0, cache, progress=False)
    one_epoch = dataclasses.replace(spec.train, epochs=1)
    epochs = {}
    for name, data in (("preset", run.train), ("full", full.train)):
        epochs[name], _ = median_time(
            lambda data=data: train(
                copy.deepcopy(base).train(), data, one_epoch, seed=1, progress=False
            ),
            repeats,
        )
    deep15 = 15 * spec.train.epochs * epochs["preset"]
    print(f"\n## {spec.name}: {label}; SmallCNN w16, {len(run.val[0])} validation images")
    print(f"one epoch of training the base: {epochs['preset']:.2f} s on the preset's "
          f"{len(run.train[0])} images, {epochs['full']:.2f} s on the full training split "
          f"({len(full.train[0])}); Deep Ensembles-15 ({spec.train.epochs} epochs each, preset): "
          f"{deep15:.0f} s")  # fmt: skip
    print(f"{'PEG-15':42} {'seconds':>7} {'/epoch':>7} {'/epoch':>7} {'/DE-15':>7} {'scored':>6} "
          f"{'points':>6} {'η':>8}  same η as exhaustive")  # fmt: skip
    print(f"{'':42} {'':>7} {'preset':>7} {'full':>7} {'':>7} {'':>6} {'used':>6}")
    etas: list[float] = []
    for setting, options, reference in SETTINGS:
        search = ScaleSearch(**{k: v for k, v in options.items() if k != "eta"})
        peg = PEG(n_members=15, seed=0, progress=False, eta=options["eta"], search=search)
        seconds, fitted = median_time(lambda peg=peg: peg.fit(base, run.val), repeats)
        etas.append(fitted.eta_)
        same = "" if reference is None else f"{fitted.eta_ == etas[reference]}"
        if same == "False":  # how far off
            same += f" (η / η* = {fitted.eta_ / etas[reference]:.3f})"
        print(f"{setting:42} {seconds:7.2f} {seconds / epochs['preset']:7.3f} "
              f"{seconds / epochs['full']:7.3f} {seconds / deep15:7.4f} {len(fitted.search_):6d} "
              f"{_share(fitted):6.0%} {fitted.eta_:8.3g}  {same}")  # fmt: skip


def _share(fitted: PEG) -> float:
    """Points scored over all η, as a share of scoring every η on every point."""
    n = fitted.ensemble_.meta["validation_points"]["scoring"]
    return sum(fitted.search_points_.values()) / (n * len(fitted.search_points_))


if __name__ == "__main__":
    main()
