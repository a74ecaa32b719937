"""peg.Laplace's prediction: the GLM covariance through the Kronecker structure
(`fast_variance=True`, `peg.methods.laplace._variance`) against laplace-torch's own (materialised
last-layer Jacobians, `fast_variance=False`) and one plain forward of the model.

Follow-up of issue 17: with laplace-torch's own computation, last-layer KFAC Laplace predicted
~23 ms per image on SmallCNN (last layer Linear(1568 → 10)), ~1000 × the model's forward; the
same covariance by the Kronecker structure costs O(D² + C·D + C³) per image instead of
O(C·P·D) (D = 1568 features, C = 10 classes, P = C·D + C = 15690 parameters).

Set-up: SmallCNN of width 16 on 28×28 single-channel inputs (`peg.models.build("small-cnn",
...)`, random weights: the costs do not depend on them), one peg.Laplace per setting (last-layer
KFAC, marglik prior) fitted on `--fit` random images labelled by the model's own predictions with
a quarter replaced at random; the default probit predictive and the MC one (`--samples` draws)
then timed on one batch of `--batch` images, round robin (every run timed in turn per round),
at one thread. Printed: seconds per image, the ratios to one forward of the model on the same
batch, the speed-up fast / laplace-torch's and the largest difference between their predictive
probabilities. Every number is measured in this run, on this machine (printed).

    OMP_NUM_THREADS=1 python benchmarks/laplace_predict.py [--batch 512] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _timing import round_robin

import peg
from peg.models import build
from peg.utils.env import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=int, default=2000, help="images the posterior is fit on")
    parser.add_argument("--batch", type=int, default=512, help="images predicted per call")
    parser.add_argument("--samples", type=int, default=100, help="draws of the MC predictive")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="500 fit images, a batch of 32")
    args = parser.parse_args()
    n_fit, B, repeats = (500, 32, 1) if args.quick else (args.fit, args.batch, args.repeats)
    torch.set_num_threads(1)  # the setting the issue measured (and the other runs' share)
    print(f"machine: {machine()}; median of {repeats} round-robin rounds")
    torch.manual_seed(0)
    model = build("small-cnn", num_classes=10, in_channels=1, width=16).eval()
    X = torch.rand(n_fit + B, 1, 28, 28)
    with torch.no_grad():
        y = model(X).argmax(-1)
    noisy = torch.rand(len(y)) < 0.25
    y[noisy] = torch.randint(0, 10, (int(noisy.sum()),))
    train, batch = (X[:n_fit], y[:n_fit]), X[n_fit:]

    fitted: dict[str, peg.Laplace] = {}
    for link in ("probit", "mc"):
        for fast in (True, False):
            options: dict[str, Any] = {"link_approx": link, "fast_variance": fast}
            if link == "mc":
                options["n_members"] = args.samples
            la = peg.Laplace(batch_size=B, progress=False, **options).fit(model, train)
            fitted[f"{link}, fast_variance={fast}"] = la
    default = fitted["probit, fast_variance=True"]
    print(f"SmallCNN w16, last layer {default.laplace_.model.last_layer}, KFAC posterior fitted "
          f"on {n_fit} images; prior precision (marglik) {default.prior_precision_:.4g}; "
          f"meta_['fast_variance']: {default.meta_['fast_variance']}")  # fmt: skip

    runs: dict[str, Callable[[], Any]] = {"model, one forward": lambda: model(batch)}
    for label, la in fitted.items():
        runs[f"Laplace {label}"] = lambda la=la: la.member_logits(batch)
    with torch.no_grad():
        samples = round_robin(runs, repeats, budget=30.0)
    times = {name: statistics.median(v) for name, v in samples.items()}
    base = times["model, one forward"]
    print(f"\nprediction of one batch of {B} images (28×28), 1 thread")
    print(f"  {'':<38} {'ms/image':>9} {'× forward':>10} {'10k images':>11}")
    for name, t in times.items():
        per = t / B
        print(f"  {name:<38} {1000 * per:9.3f} {t / base:10.1f} {1e4 * per:9.1f} s")
    print("\nspeed-up, laplace-torch's covariance / Kronecker one (same run, same batch):")
    for link in ("probit", "mc"):
        slow = times[f"Laplace {link}, fast_variance=False"]
        print(f"  {link:<7} {slow / times[f'Laplace {link}, fast_variance=True']:7.1f} ×")

    print("\nagreement of the predictive probabilities (max |fast - laplace-torch's|):")
    for link in ("probit", "mc"):
        a, b = (fitted[f"{link}, fast_variance={f}"].predict_proba(batch) for f in (True, False))
        print(f"  {link:<7} {float((a - b).abs().max()):.2e}")


if __name__ == "__main__":
    main()
