"""Every model's output (issue 58, item 8): real models trained here, their calibration against
scikit-learn's references. Sections (`--sections`):

- "binary" (about a minute of one CPU): a one-logit network (784-128-1 MLP,
  `BCEWithLogitsLoss`, 40 epochs of Adam: over-fitted, so over-confident) trained on 4,000
  real MNIST digits (`peg.data.load("mnist", "test")`, the 10,000 official test digits, the
  only MNIST split under ../shared/data), odd vs even. Its scores s on the other 6,000 digits
  are cut in two halves: the maps are fitted on the validation half (the scores `[N]` as
  they are: binary input) and scored on the test half: NLL, Brier and 15-bin ECE, all on
  P(y = 1).
  Against scikit-learn: Platt scaling against `_SigmoidCalibration` (what
  `CalibratedClassifierCV(method="sigmoid")` fits) and against the plain logistic fit
  (`LogisticRegression`, no penalty) on s; beta calibration against Platt; peg's isotonic
  calibration and Venn-ABERS against `IsotonicRegression` on s. The bars (the issue's):
  |Platt − scikit-learn's sigmoid| <= 0.002 nats, beta <= Platt + 0.005. Isotonic
  probabilities of 0 or 1 are clipped to [1e-7, 1 − 1e-7] for the NLL (scikit-learn's fit
  gives exact 0s and 1s); the others never reach them.

- "multilabel" and "segmentation" (benchmarks/_shapes_images.py, its doc): a multi-label MLP
  on grids of three digits (K = 10 labels "digit present"), shared and per-label maps against
  the best one-scale fit, conformal risk control of the recall; a small segmentation network
  on canvases of two digits (11 classes per pixel, 255 ignored at the digits' borders), TS and
  vector scaling on the dense maps.
- "autoselect" (a few minutes): AutoSelect against compare's best column on binary,
  multilabel and dense networks (`benchmarks/shapes_autoselect.py`).

    OMP_NUM_THREADS=1 python benchmarks/shapes.py [--sections binary multilabel segmentation
        autoselect] [--seed 0] [--out results/benchmarks/shapes.txt]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from _shapes_images import multilabel, segmentation
from torch import nn

import peg
from peg.utils.env import machine

BINS = 15
CLIP = 1e-7


def binary_metrics(p: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(NLL, Brier, ECE %) of P(y = 1) `p` `[N]` against labels `y` `[N]` (ECE: 15 equal-width
    bins of p, |mean y - mean p| weighted by the bin's share)."""
    q = np.clip(p, CLIP, 1 - CLIP)
    nll = float(-np.mean(y * np.log(q) + (1 - y) * np.log1p(-q)))
    brier = float(np.mean((p - y) ** 2))
    bins = np.minimum((p * BINS).astype(int), BINS - 1)
    gap = 0.0
    for b in range(BINS):
        inside = bins == b
        if inside.any():
            gap += inside.mean() * abs(y[inside].mean() - p[inside].mean())
    return nll, brier, 100 * gap


def train_binary(seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(scores `[6000]`, labels `[6000]` odd = 1, the network's accuracy on them) of the
    one-logit MLP trained on the first 4,000 digits of a seeded shuffle (the module doc)."""
    X, digits = peg.data.load("mnist", "test")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(X), generator=g)
    X, y = X[order].flatten(1), (digits[order] % 2).float()
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(40):
        for batch in torch.randperm(4000, generator=g).split(128):
            opt.zero_grad()
            loss_fn(net(X[batch])[:, 0], y[batch]).backward()
            opt.step()
    with torch.no_grad():
        s = net(X[4000:])[:, 0].double()
    accuracy = float(((s > 0).double() == y[4000:].double()).double().mean())
    return s.numpy(), y[4000:].long().numpy(), accuracy


def _sklearn_maps() -> dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]]:
    from sklearn.calibration import _SigmoidCalibration
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    def sigmoid(sv: np.ndarray, yv: np.ndarray, st: np.ndarray) -> np.ndarray:
        return _SigmoidCalibration().fit(sv, yv).predict(st)

    def logistic(sv: np.ndarray, yv: np.ndarray, st: np.ndarray) -> np.ndarray:
        fit = LogisticRegression(C=np.inf, tol=1e-10, max_iter=10_000)  # no penalty
        return fit.fit(sv[:, None], yv).predict_proba(st[:, None])[:, 1]

    def isotonic(sv: np.ndarray, yv: np.ndarray, st: np.ndarray) -> np.ndarray:
        return IsotonicRegression(out_of_bounds="clip").fit(sv, yv).predict(st)

    return {
        "scikit-learn sigmoid (CalibratedClassifierCV)": sigmoid,
        "scikit-learn LogisticRegression on s": logistic,
        "scikit-learn IsotonicRegression on s": isotonic,
    }


def binary(seed: int) -> list[str]:
    """The binary section's lines (the module doc)."""
    t0 = time.perf_counter()
    s, y, accuracy = train_binary(seed)
    trained = time.perf_counter() - t0
    half = len(s) // 2
    sv, yv, st, yt = s[:half], y[:half], s[half:], y[half:]
    peg_maps = {
        "TS": peg.TemperatureScaling(),
        "Platt scaling": peg.PlattScaling(),
        "Platt scaling, plain targets": peg.PlattScaling(smoothed_targets=False),
        "Beta calibration": peg.BetaCalibration(),
        "Isotonic (peg)": peg.IsotonicCalibration(),
        "Venn-ABERS (merged)": peg.VennAbers(),
    }
    probs: dict[str, np.ndarray] = {"uncalibrated": 1 / (1 + np.exp(-st))}
    for name, m in peg_maps.items():
        fitted = m.fit(torch.as_tensor(sv), torch.as_tensor(yv))  # scores [N]: binary
        probs[name] = fitted.predict_proba(torch.as_tensor(st)).double().numpy()  # P(y = 1)
        if name.startswith("Venn"):
            width = fitted.predict_interval(torch.as_tensor(st)).diff(dim=-1).mean()
    for name, fit in _sklearn_maps().items():
        probs[name] = fit(sv, yv, st)
    scores = {name: binary_metrics(p, yt.astype(float)) for name, p in probs.items()}
    lines = [
        f"### binary: one-logit MLP on MNIST odd vs even ({half} val / {len(st)} test digits)",
        "",
        f"Trained on 4,000 digits in {trained:.0f} s; accuracy on the 6,000 others "
        f"{100 * accuracy:.2f}%; Venn-ABERS mean interval width p1 − p0 {float(width):.4f}.",
        "",
        "| map | test NLL | Brier | ECE % |",
        "|---|---|---|---|",
        *(f"| {n} | {v[0]:.4f} | {v[1]:.4f} | {v[2]:.2f} |" for n, v in scores.items()),
        "",
    ]
    nll = {n: v[0] for n, v in scores.items()}
    platt, sigmoid = nll["Platt scaling"], nll["scikit-learn sigmoid (CalibratedClassifierCV)"]
    plain, logistic = (
        nll["Platt scaling, plain targets"],
        nll["scikit-learn LogisticRegression on s"],
    )
    beta, iso = nll["Beta calibration"], nll["Isotonic (peg)"]
    gap = float(
        np.abs(
            probs["Platt scaling"] - probs["scikit-learn sigmoid (CalibratedClassifierCV)"]
        ).max()
    )
    checks = [
        (f"|Platt − scikit-learn sigmoid| = {abs(platt - sigmoid):.2e} nats (largest "
         f"probability gap {gap:.1e})", abs(platt - sigmoid) <= 0.002),
        (f"|Platt (plain targets) − LogisticRegression| = {abs(plain - logistic):.2e} nats",
         abs(plain - logistic) <= 0.002),
        (f"beta − Platt = {beta - platt:+.4f} nats (bar <= +0.005)", beta <= platt + 0.005),
        (f"isotonic: peg − scikit-learn = {iso - nll['scikit-learn IsotonicRegression on s']:+.2e}"
         " nats (reported, no bar)", True),
    ]  # fmt: skip
    lines += [f"- {text}: {'PASS' if ok else 'FAIL'}" for text, ok in checks]
    return lines


def autoselect(seed: int) -> list[str]:
    """AutoSelect against compare's best column on each kind (`benchmarks/shapes_autoselect.py`)."""
    from shapes_autoselect import run  # beside this file

    return run(seed, train_binary)


SECTIONS: dict[str, Callable[[int], list[str]]] = {
    "binary": binary,
    "multilabel": multilabel,
    "segmentation": segmentation,
    "autoselect": autoselect,  # AutoSelect within 0.01 nats of the best column, each kind
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the results here too")
    args = parser.parse_args(argv)
    command = "$ python benchmarks/shapes.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [command, f"machine: {machine()} (shared: compare ratios, not seconds)", ""]
    for name in args.sections:
        lines += [*SECTIONS[name](args.seed), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
