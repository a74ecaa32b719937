"""What `peg.AutoSelect()` costs with its defaults, against a temperature scaling fit on the same
model and data, and what it chooses against the exhaustive run (issue 38).

Target (issue 49): `AutoSelect()` (defaults: cv = 5, `max_fit_seconds="auto"`: 25 × the TS
fit, at least 10 s, the race at 3 paired SE) takes ≤ 1.2 × its own budget and ≤ 30 ×
`TemperatureScaling().fit(model, val)` (a forward pass of val and the fit of T), measured in
this run (where the 10 s floor sets the budget, a TS fit under 0.4 s, the floor is the bound),
and chooses the exhaustive run's predictor (`max_fit_seconds=None`: every default candidate on
every fold) or one whose test NLL is within 0.01 nats of it.

Set-up: the bench presets' CNNs (src/peg/apps/configs: fashion-mnist's SmallCNN width 16,
cifar10-cpu's SmallCNN width 32), trained briefly here (`--train` images, `--epochs`, Adam:
this is a cost benchmark; the presets train longer), 2,000 validation and 2,000 test images
from the test split (seeded random subsets: the CIFAR-10 archives are ordered by class).
Printed per preset: each candidate's fit seconds per fold (a chained one with its base's), its
status and why; the total as × TS; the choice and its test NLL; the same for the exhaustive
run; the paired test-NLL difference of the two choices.

    python benchmarks/auto_select.py [--presets fashion-mnist cifar10] [--exhaustive ...]
        [--train 5000] [--epochs 3] [--val 2000] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import time

import torch
from torch import nn

from peg.apps.select import AutoSelect
from peg.apps.select.folds import mean_se, point_scores
from peg.data import load
from peg.methods import TemperatureScaling
from peg.models import build
from peg.train import train
from peg.utils.env import machine

PRESETS = {  # name: (data set, input channels, SmallCNN width), as the bench presets
    "fashion-mnist": ("fashion-mnist", 1, 16),
    "cifar10": ("cifar10", 3, 32),
}


def _model(name: str, n_train: int, epochs: int) -> tuple[nn.Module, tuple, tuple]:
    data, channels, width = PRESETS[name]
    X, y = load(data, "train")
    Xt, yt = load(data, "test")
    g = torch.Generator().manual_seed(0)  # seeded subsets: the CIFAR-10 archives are by class
    train_idx = torch.randperm(len(y), generator=g)[:n_train]
    val_idx, test_idx = torch.randperm(len(yt), generator=g)[: 2 * N_VAL].split(N_VAL)
    torch.manual_seed(0)
    model = build("small-cnn", in_channels=channels, num_classes=10, width=width)
    model, _ = train(model, (X[train_idx], y[train_idx]), epochs=epochs, batch_size=128,
                     optimizer="adam", lr=1e-3, seed=0)  # fmt: skip
    return model.eval(), (Xt[val_idx], yt[val_idx]), (Xt[test_idx], yt[test_idx])


def _run(label: str, model: nn.Module, val: tuple, test: tuple, ts: float, **kw) -> AutoSelect:
    start = time.perf_counter()
    sel = AutoSelect(progress=False, **kw).fit(model, val)
    total = time.perf_counter() - start
    nll = _test_points(sel, test).mean()
    budget = sel.cost_["budget_seconds"]
    within = "" if budget is None else f" = {total / budget:.2f} x its {budget:.3g} s budget"
    print(f"\n{label}: {total:.1f} s = {total / ts:.1f} x TS{within}; chosen: {sel.chosen_}; "
          f"test NLL {nll:.4f}")  # fmt: skip
    print(f"  {'candidate':<16} {'status':<8} per-fold fit s (a chain with its base's)  why")
    for r in sel.report_:
        folds = " ".join(f"{s:.2f}" for s in r.get("fold_seconds") or []) or "–"
        print(f"  {r['candidate']:<16} {r['status']:<8} {folds:<38} {r.get('why', '')}")
    for line in sel.to_markdown().splitlines():
        if line.startswith(("Cost:", "Chosen:")):
            print(line)
    return sel


def _test_points(sel: AutoSelect, test: tuple) -> torch.Tensor:
    return point_scores(sel.member_logits(test[0]), test[1], "nll")


def main() -> None:
    global N_VAL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument(
        "--exhaustive",
        nargs="*",
        default=list(PRESETS),
        choices=list(PRESETS),
        help="presets also run exhaustively (max_fit_seconds=None)",
    )
    parser.add_argument("--train", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--val", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="a smoke run (small sizes)")
    args = parser.parse_args()
    if args.quick:
        args.train, args.epochs, args.val = 600, 1, 600
        args.presets = ["fashion-mnist"]  # CIFAR-10 needs its archives ($PEG_DATA)
    N_VAL = args.val
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"machine: {machine()}; torch threads: {torch.get_num_threads()}")
    if importlib.util.find_spec("laplace") is not None:
        importlib.import_module("laplace")  # its import (seconds) is not a fit's cost
    for name in args.presets:
        model, val, test = _model(name, args.train, args.epochs)
        params = sum(p.numel() for p in model.parameters())
        start = time.perf_counter()
        TemperatureScaling().fit(model, val)
        ts = time.perf_counter() - start
        print(f"\n== {name}: SmallCNN width {PRESETS[name][2]} ({params:,} parameters), trained "
              f"on {args.train} images for {args.epochs} epochs; {args.val} validation, "
              f"{args.val} test images")  # fmt: skip
        print(f"TS fit (TemperatureScaling().fit(model, val): a forward pass and T): {ts:.2f} s")
        fast = _run("AutoSelect() (defaults)", model, val, test, ts)
        if name not in args.exhaustive:
            continue
        full = _run("AutoSelect(max_fit_seconds=None) (exhaustive)", model, val, test, ts,
                    max_fit_seconds=None)  # fmt: skip
        row = next(r for r in full.report_ if r["candidate"] == fast.chosen_)
        within = row.get("within_1se")
        print(f"\nthe default run's choice in the exhaustive report: {row['status']}, paired "
              f"CV difference to the best {row.get('diff', float('nan')):+.4f} ± "
              f"{row.get('diff_se', float('nan')):.4f} (within one SE: {within})")  # fmt: skip
        diff, se = mean_se(_test_points(fast, test) - _test_points(full, test))
        print(f"test NLL, default − exhaustive choice (paired): {diff:+.4f} ± {se:.4f}")


N_VAL = 2000

if __name__ == "__main__":
    main()
