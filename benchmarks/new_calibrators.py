"""Spline calibration, ensemble temperature scaling and order-preserving scaling against
temperature scaling at 10, 100 and 1,000 classes: held-out NLL and ECE, paired to TS, and fit
time as a ratio to TS's (issue 39, item 3).

Every map is fitted on the validation logits through `nn.Identity()` (saved logits) and scored
on independent test logits. NLL: mean over the test points, the difference to TS ± its paired
SE (per point). ECE: top-label, 15 equal-width bins (`peg.metrics.ece`), the difference to TS ±
a bootstrap SE (200 paired resamples of the test points). Fit: seconds, one thread, as a ratio
to TS's fit in the same run (the machine is shared: ratios, not seconds, carry over).

The logits (SYNTHETIC, as no 100- or 1,000-class model or logits exist offline here):

- "superclass": `benchmarks/many_classes.py`'s generator at C classes. For each point a true
  class k, latent scores z* = 5.5·e_k + 3·[same superclass as k] + N(0, 0.5²) (C / 10 random
  superclasses), the label y drawn from softmax(z*); the model reports α_c·(z* + N(0, 0.8²)) +
  β_c, α_c ∈ [1.3, 2.1] per class and β_c ~ N(0, 0.3²): over-confident by a per-class factor
  (TS fixes it on average).
- "distorted": the same z* and labels; the model reports h(z* + N(0, 0.8²)) with one monotone
  h(u) = 1.2·u + 0.12·u·|u| for every class: an over-confidence that grows with the logit (what
  an element-wise monotone map can undo and TS only on average).
- "tempered": the same z* and labels; the model reports 2.5·z* (no noise): one temperature is
  the whole miscalibration, T = 2.5 exactly (TS's own model: the others can only tie or lose).

And one real model, "digits": an MLP (hidden 64) over-fitted on 600 of scikit-learn's 8×8
digits (10 classes, 300 epochs of Adam), its logits on 600 validation and 597 test digits.

    OMP_NUM_THREADS=1 python benchmarks/new_calibrators.py [--val 5000] [--test 5000]
        [--classes 10 100 1000] [--kinds superclass distorted tempered] [--no-digits] [--quick]
        [--autoselect]  (AutoSelect's choice among TS, vector scaling, ETS, order-preserving)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import peg
from peg.metrics import ece
from peg.metrics.calibration import bin_sums
from peg.utils.env import machine

BINS = 15
MAPS: dict[str, Callable[[], Any]] = {
    "TS": peg.TemperatureScaling,
    "Ensemble TS": peg.EnsembleTemperatureScaling,
    "Order-preserving": peg.OrderPreservingScaling,
    "Spline": peg.SplineCalibration,
}


def synthetic(n: int, c: int, seed: int, kind: str) -> tuple[Tensor, Tensor]:
    """(logits `[n, c]` float32, labels `[n]`): see the module doc."""
    g = torch.Generator().manual_seed(seed)
    fixed = torch.Generator().manual_seed(12345)  # the classes' structure: shared by every set
    groups = torch.randint(0, max(c // 10, 1), (c,), generator=fixed)
    alpha = 1.3 + 0.8 * torch.rand(c, generator=fixed)
    beta = 0.3 * torch.randn(c, generator=fixed)
    k = torch.randint(0, c, (n,), generator=g)
    z = 0.5 * torch.randn(n, c, generator=g)
    z += 3.0 * (groups[None, :] == groups[k][:, None])
    z[torch.arange(n), k] += 5.5
    y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]
    u = z + 0.8 * torch.randn(n, c, generator=g)
    out = {
        "superclass": lambda: alpha * u + beta,
        "distorted": lambda: 1.2 * u + 0.12 * u * u.abs(),
        "tempered": lambda: 2.5 * z,
    }[kind]()
    return out.float(), y


def digits() -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """An over-fitted MLP's (validation, test) logits and labels on scikit-learn's digits."""
    from sklearn.datasets import load_digits

    from peg.models import MLP
    from peg.train import train

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    X, y = X[order], y[order]
    recipe = dict(epochs=300, batch_size=100, optimizer="adam", lr=0.01, weight_decay=0.0)
    model = train(MLP(64, 10, hidden=64), (X[:600], y[:600]), seed=0, **recipe)[0].eval()
    with torch.no_grad():
        val, test = model(X[600:1200]), model(X[1200:])
    return (val, y[600:1200]), (test, y[1200:])


def top_ece(conf: Tensor, correct: Tensor) -> float:
    """`peg.metrics.ece` from the top-label confidence and correctness `[N]` (its bins)."""
    count, conf_sum, hits = bin_sums(conf, correct, BINS)
    return float(((conf_sum - hits).abs()).sum() / count.sum())


def scores(probs: Tensor, y: Tensor) -> Tensor:
    """Per-point NLL `[N]` (float64)."""
    return -probs.double().clamp_min(1e-300).log().gather(1, y[:, None])[:, 0]


def compare(val: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], boot: int) -> list[str]:
    """One markdown row per map: NLL, its paired difference to TS, ECE and its difference, fit
    time as a multiple of TS's."""
    X, y = test
    fitted, seconds = {}, {}
    peg.TemperatureScaling().fit(nn.Identity(), val)  # warm-up: no first call is timed
    for name, make in MAPS.items():
        start = time.perf_counter()
        fitted[name] = make().fit(nn.Identity(), val)
        seconds[name] = time.perf_counter() - start
    probs = {name: m.predict_proba(X).double() for name, m in fitted.items()}
    nll = {name: scores(p, y) for name, p in probs.items()}
    g = torch.Generator().manual_seed(0)
    draws = torch.randint(0, len(y), (boot, len(y)), generator=g)
    rows = []
    top = {name: p.max(-1) for name, p in probs.items()}
    conf = {name: t.values for name, t in top.items()}
    hit = {name: t.indices == y for name, t in top.items()}
    for name, p in probs.items():
        d = nll[name] - nll["TS"]
        se = float(d.std() / len(d) ** 0.5)
        e, e_ts = ece(p, y, BINS), ece(probs["TS"], y, BINS)
        assert abs(top_ece(conf[name], hit[name]) - e) < 1e-6  # the bootstrap's ECE is peg's
        diffs = torch.tensor([top_ece(conf[name][i], hit[name][i])
                              - top_ece(conf["TS"][i], hit["TS"][i]) for i in draws])  # fmt: skip
        rows.append(
            f"| {name} | {float(nll[name].mean()):.4f} | {float(d.mean()):+.4f} ± {se:.4f} | "
            f"{100 * e:.2f} | {100 * (e - e_ts):+.2f} ± {100 * float(diffs.std()):.2f} | "
            f"{seconds[name] / seconds['TS']:.1f} |"
        )
    return rows


def autoselect(kinds: list[str], classes: list[int], n: int) -> None:
    """`peg.AutoSelect` (cv 5, one-SE rule) among TS, vector scaling and the two new defaults
    on `n` saved validation logits of each kind: which one its paired CV keeps."""
    candidates = ["TS", "Vector scaling", "Ensemble TS", "Order-preserving"]
    for kind in kinds:
        for c in classes:
            start = time.perf_counter()
            chosen = peg.AutoSelect(cv=5, progress=False, candidates=candidates)
            chosen.fit(nn.Identity(), synthetic(n, c, 1, kind))
            took = time.perf_counter() - start
            print(f"### AutoSelect, {kind}, {c} classes, {n} saved logits ({took:.0f} s)\n")
            print(chosen.to_markdown(), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--val", type=int, default=5000)
    p.add_argument("--test", type=int, default=5000)
    p.add_argument("--classes", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--boot", type=int, default=200, help="bootstrap resamples of the ECE")
    p.add_argument(
        "--kinds",
        nargs="+",
        default=["superclass", "distorted"],
        choices=["superclass", "distorted", "tempered"],
        help="synthetic logits",
    )
    p.add_argument("--no-digits", action="store_true", help="skip the real digits model")
    p.add_argument(
        "--autoselect",
        action="store_true",
        help="instead: AutoSelect's choice on --val saved logits of each kind",
    )
    p.add_argument("--quick", action="store_true", help="500 points, 10 classes, 20 resamples")
    args = p.parse_args(argv)
    if args.quick:
        args.val, args.test, args.classes, args.boot = 500, 500, [10], 20
    torch.set_num_threads(1)
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"$ python benchmarks/new_calibrators.py {shown}")
    print(f"machine: {machine()} (shared: compare ratios, not seconds)\n")
    if args.autoselect:
        autoselect(args.kinds, args.classes, args.val)
        return 0
    head = ("| map | test NLL | − TS (± paired SE) | ECE % | − TS (± bootstrap SE) | fit × TS |\n"
            "|---|---|---|---|---|---|")  # fmt: skip
    settings: list[tuple[str, Any]] = [
        (f"{kind}, {c} classes, {args.val} val / {args.test} test",
         (synthetic(args.val, c, 1, kind), synthetic(args.test, c, 2, kind)))
        for kind in args.kinds for c in args.classes
    ]  # fmt: skip
    if not (args.quick or args.no_digits):
        settings.append(("digits MLP (real), 10 classes, 600 val / 597 test", digits()))
    for title, (val, test) in settings:
        print(f"### {title}\n\n{head}")
        print("\n".join(compare(val, test, args.boot)) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
