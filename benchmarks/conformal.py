"""peg.ConformalClassifier's cost against its predictor's: `predict_set` next to the
predictor's `predict_proba` on 10⁵ rows × 100 classes (issue 26's target: at most 1.05 ×), and
`fit` next to one `predict_proba` pass over the calibration data (fit is that pass plus a
selection among N floats).

Set-up: a peg.Ensemble of 5 MLPs (128 → 256 → 256 → 100, random weights, the last layer
scaled ×200 so each member's probabilities are peaked as a trained model's; then unscaled:
near-uniform probabilities, APS/RAPS's worst case, as every class must be ranked) on 10⁵
random inputs; a conformal classifier per score (LAC, APS, RAPS randomised, LAC
class-conditional) fitted on 4·10⁴ labelled rows (drawn from the ensemble's probabilities, 5%
uniform). The same set-up with a single linear model (128 → 100) shows the worst case: a
predictor so cheap that the score's own work (ranking the classes of every row for APS/RAPS)
is most of the time. Timings are round robin (every run
timed in turn per round), medians, at one thread; every number is measured in this run, on
this machine (printed).

    OMP_NUM_THREADS=1 python benchmarks/conformal.py [--rows 100000] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _timing import round_robin
from torch import nn

import peg
from peg.utils.env import machine

CLASSES, FEATURES = 100, 128


def _mlp(seed: int, sharpness: float) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES)
    ).eval()
    with torch.no_grad():
        net[-1].weight.mul_(sharpness)  # how peaked the probabilities are
    return net


def _table(name: str, predictor: Any, X: torch.Tensor, cal: tuple, repeats: int) -> None:
    settings = {
        "lac": {"score": "lac"},
        "aps": {"score": "aps"},
        "raps randomised": {"score": "raps", "randomized": True},
        "lac class-conditional": {"score": "lac", "class_conditional": True},
    }
    fitted = {k: peg.ConformalClassifier(**v).fit(predictor, cal) for k, v in settings.items()}
    runs: dict[str, Callable[[], Any]] = {"predict_proba": lambda: predictor.predict_proba(X, 512)}
    runs |= {f"predict_set {k}": (lambda c=c: c.predict_set(X, 512)) for k, c in fitted.items()}
    runs["fit lac"] = lambda: peg.ConformalClassifier().fit(predictor, cal)
    runs["predict_proba (calibration rows)"] = lambda: predictor.predict_proba(cal[0], 512)
    samples = round_robin(runs, repeats, budget=0)
    t = {k: statistics.median(v) for k, v in samples.items()}
    base, cal_base = t["predict_proba"], t["predict_proba (calibration rows)"]
    with torch.no_grad():
        top = predictor.predict_proba(X[:2000]).max(-1).values.median()
    size = fitted["aps"].predict_set(X[:2000]).sum(-1).double().mean()
    print(f"\n{name}: {len(X):,} rows × {CLASSES} classes; calibration {len(cal[1]):,} rows")
    print(f"median top probability {top:.3f}; mean APS set size {size:.1f} (alpha 0.1)")
    print(f"{'run':38s} {'seconds':>9s} {'ratio':>7s}")
    for k, v in t.items():
        ref = cal_base if k.startswith("fit") or "calibration" in k else base
        print(f"{k:38s} {v:9.3f} {v / ref:7.3f}")


def _labels(predictor: Any, X: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Labels drawn from the predictor's probabilities, one in twenty uniform instead (so
    every class has points for the class-conditional quantiles)."""
    with torch.no_grad():
        y = torch.multinomial(predictor.predict_proba(X), 1, generator=g)[:, 0]
    other = torch.rand(len(y), generator=g) < 0.05
    return torch.where(other, torch.randint(0, CLASSES, y.shape, generator=g), y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--calib", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2,000 rows, one round")
    args = parser.parse_args()
    rows, calib, repeats = (
        (2000, args.calib, 1) if args.quick else (args.rows, args.calib, args.repeats)
    )
    torch.set_num_threads(1)
    print(f"machine: {machine()}; median of {repeats} round-robin rounds")
    print(
        "ratio: seconds / the predictor's predict_proba on the same rows (fit: on the "
        "calibration rows)"
    )
    g = torch.Generator().manual_seed(0)
    X = torch.randn(rows, FEATURES, generator=g)
    Xc = torch.randn(calib, FEATURES, generator=g)
    for sharpness, what in ((200.0, "peaked, as a trained model's"), (1.0, "near-uniform")):
        ensemble = peg.Ensemble.from_models([_mlp(s, sharpness) for s in range(5)])
        yc = _labels(ensemble, Xc, g)
        name = f"5-member MLP ensemble (128-256-256-100), probabilities {what}"
        _table(name, ensemble, X, (Xc, yc), repeats)
    torch.manual_seed(1)
    linear = peg.Ensemble.from_models([nn.Linear(FEATURES, CLASSES)])
    _table(
        "one linear model (128-100), the worst case",
        linear,
        X,
        (Xc, _labels(linear, Xc, g)),
        repeats,
    )


if __name__ == "__main__":
    main()
