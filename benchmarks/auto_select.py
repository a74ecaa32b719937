"""What `AutoSelect` costs against fitting its candidates one by one.

Target (issue 24): `AutoSelect` with the default candidates costs at most 1.5 × (K × the sum of
the candidates' single fits on the whole validation set): cross-fitting fits every candidate K
times on (K − 1)/K of the data, so K × the single fits is what the procedure must do; the rest
is the selection's own overhead (the model's validation logits, computed once and shared by the
calibrators; scoring the held-out folds; measuring each candidate's prediction cost; refitting
the winner). The single fits are timed as a user would run them (`peg.compare`'s way: each
candidate built through the method registry on the model and the whole validation set, a
chained candidate counting its base's fit, every calibrator reading the model's logits itself).

Set-up: Fashion-MNIST (the data set of the fashion-mnist preset), an MLP (784-128-10) trained
for a few epochs with Adam on `--train` training images, `--val` validation images from the
test split; the default candidates (no Laplace unless laplace-torch is installed; no MC dropout:
the model has none), K = `--cv`. Every number is measured in this run, on this machine.

    python benchmarks/auto_select.py [--train 5000] [--val 2000] [--cv 5] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import time

import torch
from torch import nn

from peg._env import machine
from peg.apps import registry
from peg.apps.chain import as_base
from peg.apps.compare.methods import MODEL, options, resolve
from peg.apps.select import DEFAULT_CANDIDATES, AutoSelect
from peg.data import load
from peg.methods._perturb import MAX_SCORE_POINTS
from peg.train import train


def _single_fits(model: nn.Module, val: tuple, seed: int) -> dict[str, float]:
    """Each default candidate fitted once on all of `val` (seconds; chained: its base's too)."""
    specs, _ = resolve(list(DEFAULT_CANDIDATES), model)
    fitted, seconds = {}, {}
    for spec in specs:
        base = model if spec.base == MODEL else as_base(fitted[spec.base], spec.method, spec.base)
        site = registry.Site(seed=seed, progress=False, base=lambda b=base: b, val=val,
                             score_points=MAX_SCORE_POINTS)  # fmt: skip
        start = time.perf_counter()
        fitted[spec.name] = registry.build(spec.method, site, **options(spec, 512, None))
        seconds[spec.name] = time.perf_counter() - start + seconds.get(spec.base, 0.0)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=5000)
    parser.add_argument("--val", type=int, default=2000)
    parser.add_argument("--cv", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run (small sizes)")
    args = parser.parse_args()
    if args.quick:
        args.train, args.val, args.cv = 600, 600, 2
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    X, y = load("fashion-mnist", "train")
    Xt, yt = load("fashion-mnist", "test")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    model, _ = train(model, (X[: args.train], y[: args.train]), epochs=5, batch_size=128,
                     optimizer="adam", lr=1e-3, seed=0)  # fmt: skip
    model.eval()
    val = (Xt[: args.val], yt[: args.val])
    print(f"machine: {machine()}; torch threads: {torch.get_num_threads()}")
    print(f"Fashion-MNIST MLP 784-128-10, {args.val} validation images, K = {args.cv}\n")

    if importlib.util.find_spec("laplace") is not None:
        importlib.import_module("laplace")  # its import (seconds) is not a fit's cost
    singles = _single_fits(model, val, seed=0)
    specs, _ = resolve(list(DEFAULT_CANDIDATES), model)
    bases = {s.name: s.base for s in specs}
    # the single fits, each once (a chained one's time less its base's, counted at the base)
    total_single = sum(v - singles.get(bases[k], 0.0) for k, v in singles.items())
    start = time.perf_counter()
    sel = AutoSelect(cv=args.cv, progress=False).fit(model, val)
    auto = time.perf_counter() - start

    print("single fits on the whole validation set (s; chained: with the base's)")
    for name, s in singles.items():
        cross = next(r for r in sel.report_ if r["candidate"] == name)
        per_fold = cross.get("fit_seconds")
        shown = "–" if per_fold is None else f"{per_fold:.2f}"
        print(f"  {name:<16} {s:7.2f}   cross-fit, per fold: {shown}")
    per_fold = {r["candidate"]: r.get("fit_seconds") or 0.0 for r in sel.report_}
    own = {
        r["candidate"]: per_fold[r["candidate"]] - per_fold.get(r.get("base"), 0.0)
        for r in sel.report_
    }  # fmt: skip  (a chained candidate's row counts its base's)
    fits = sum(own.values()) * args.cv
    print(f"\nK x sum of single fits: {args.cv * total_single:.2f} s")
    print(f"AutoSelect.fit:         {auto:.2f} s = {auto / (args.cv * total_single):.2f} x that")
    print(f"  of which the candidates' fits over the folds: {fits:.2f} s "
          f"({100 * fits / auto:.0f}%); the rest (the validation logits once, scoring the "
          "held-out folds, measuring forwards, refitting the winner): "
          f"{auto - fits:.2f} s")  # fmt: skip
    print(f"chosen: {sel.chosen_}\n")
    print(sel.to_markdown())


if __name__ == "__main__":
    main()
