"""`peg.AutoSelect()` on saved logits at 10, 100 and 1,000 classes: its default run's cost as
× a temperature scaling fit on the same logits, its choice, beside the exhaustive run's
(`max_fit_seconds=None`) and both choices' test NLL (issues 38 and 39).

The logits are `benchmarks/many_classes.py`'s synthetic generator (`synthetic_logits`: classes
in groups of ten, per-class scale and shift, so one temperature is not enough), with `--val`
validation and `--test` test points drawn from other seeds. Target: the default costs ≤ 30 ×
the TS fit and chooses the exhaustive run's predictor or one whose test NLL is within noise.

    python benchmarks/auto_select_logits.py [--classes 10 100 1000] [--val 5000] [--test 5000]
        [--no-exhaustive 1000] [--saturated]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from many_classes import saturated_logits, synthetic_logits
from torch import nn

import peg
from peg.utils.env import machine


def test_nll(fitted: peg.AutoSelect, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-point NLL `[N]` of the chosen predictor on the test logits."""
    p = fitted.predict_proba(z).double().clamp_min(1e-300)
    return -p[torch.arange(len(y)), y].log()


def run(
    validation: tuple[torch.Tensor, torch.Tensor],
    testing: tuple[torch.Tensor, torch.Tensor],
    exhaustive: bool,
) -> None:
    (zv, yv), (zt, yt) = validation, testing
    started = time.perf_counter()
    peg.TemperatureScaling().fit(nn.Identity(), (zv, yv))
    ts = time.perf_counter() - started
    print(f"  TS fit     {ts:7.2f} s")
    rows = {}
    for name, budget in [("default", "auto"), ("exhaustive", None)][: 2 if exhaustive else 1]:
        started, cpu = time.perf_counter(), time.process_time()
        fitted = peg.AutoSelect(max_fit_seconds=budget, progress=False).fit(nn.Identity(), (zv, yv))
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        rows[name] = (fitted, seconds, test_nll(fitted, zt, yt))
        budget = fitted.cost_["budget_seconds"]
        within = "" if budget is None else f" ({seconds / budget:.2f} x its {budget:.3g} s budget)"
        # CPU seconds beside the wall's: on a shared machine the wall's are the load's too
        print(f"  {name:10s} {seconds:7.1f} s (CPU {cpu:.1f} s) = {seconds / ts:5.1f} x TS"
              f"{within}; chose {fitted.chosen_:16s} test NLL "
              f"{float(rows[name][2].mean()):.4f}")  # fmt: skip
        for row in fitted.report_:
            if row["status"] != "kept" and not row["status"].startswith("chosen"):
                print(f"      {row['candidate']}: {row['why']}")
    if exhaustive:
        diff = rows["default"][2] - rows["exhaustive"][2]
        se = float(diff.std()) / len(diff) ** 0.5
        print(f"  default - exhaustive test NLL: {float(diff.mean()):+.4f} ± {se:.4f} (paired)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--val", type=int, default=5000)
    parser.add_argument("--test", type=int, default=5000)
    parser.add_argument("--no-exhaustive", type=int, nargs="*", default=[],
                        help="class counts to run without the exhaustive run")  # fmt: skip
    parser.add_argument("--saturated", action="store_true",
                        help="also many_classes.py's saturated 10-class logits")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # few points per class at 1,000 classes: said once per fit
    print(f"machine: {machine()}; torch threads: 1")
    z, y = synthetic_logits(300, 2, 10)  # a warm-up: the first fit in a process imports scipy
    peg.AutoSelect(cv=2, progress=False).fit(nn.Identity(), (z, y))
    for c in args.classes:
        print(f"{c} classes, {args.val} validation / {args.test} test points (synthetic)")
        run(
            synthetic_logits(args.val, 0, c),
            synthetic_logits(args.test, 1, c),
            c not in args.no_exhaustive,
        )
    if args.saturated:
        print(f"saturated logits (10 classes), {args.val} validation / {args.test} test points")
        run(saturated_logits(args.val, 0), saturated_logits(args.test, 1), True)


if __name__ == "__main__":
    main()
