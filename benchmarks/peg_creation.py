"""The cost of building PEG-15 (η search included) against one epoch of training its base.

Target (issue 7): building PEG-15 on Fashion-MNIST's validation split, η search included, takes
less than one epoch of training the base model, because the S gradients are computed once and
reused for every η, each η is scored with forward passes only, and scoring stops as soon as a
candidate cannot beat the best η so far (`early_stop`, exact: see `peg.methods._search`). The η
chosen with every shortcut must equal the η of an exhaustive search (all held-out points, no
early stopping); both are printed. Also reported: the ratio to training Deep Ensembles-15 with
the same recipe (15 × epochs × the measured epoch).

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
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peg._env import machine
from peg.bench.paper import PRESETS
from peg.bench.runner import SeedRun
from peg.bench.spec import Spec, find_spec, load_specs
from peg.methods.peg import PEG
from peg.train import train


def _time(run: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of `repeats` calls, and the last call's result."""
    samples, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), out


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


def _benchmark(label: str, spec: Spec, cache: Path, repeats: int) -> None:
    """Time one epoch of the base's training and PEG-15 with several scoring settings."""
    run = SeedRun(spec, 0, cache, progress=False)
    base = run.bases.get("single").eval()
    one_epoch = dataclasses.replace(spec.train, epochs=1)
    epoch, _ = _time(
        lambda: train(copy.deepcopy(base).train(), run.train, one_epoch, seed=1, progress=False),
        repeats,
    )
    deep15 = 15 * spec.train.epochs * epoch
    print(f"\n## {spec.name}: {label}; SmallCNN w16, {len(run.train[0])} training / "
          f"{len(run.val[0])} validation images")  # fmt: skip
    print(f"one epoch of training the base: {epoch:.2f} s; Deep Ensembles-15 "
          f"({spec.train.epochs} epochs each): {deep15:.0f} s")  # fmt: skip
    print(f"{'PEG-15, η search':46} {'seconds':>7} {'/epoch':>7} {'/DE-15':>7} {'scored':>6} "
          f"{'stopped':>7} {'η':>9}")  # fmt: skip
    settings = {
        "exhaustive (every held-out point, no stop)": {"early_stop": False},
        "default (early stop)": {},
        "2000 scoring points, early stop (bench)": {"max_score_points": 2000},
        "1000 scoring points, early stop": {"max_score_points": 1000},
    }
    etas = {}
    for setting, options in settings.items():
        peg = PEG(size=15, eta="search", seed=0, progress=False, **options)
        seconds, fitted = _time(lambda peg=peg: peg.fit(base, run.val), repeats)
        etas[setting] = fitted.eta_
        print(f"{setting:46} {seconds:7.2f} {seconds / epoch:7.3f} {seconds / deep15:7.4f} "
              f"{len(fitted.search_):6d} {len(fitted.search_stopped_):7d} "
              f"{fitted.eta_:9.4g}")  # fmt: skip
    exhaustive = etas.pop(next(iter(settings)))
    for setting, eta in etas.items():
        print(f"η of '{setting}' == η of the exhaustive search: {eta == exhaustive}")


if __name__ == "__main__":
    main()
