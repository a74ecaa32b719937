"""Label-free accuracy estimation (issue 48): how far each `peg.PerformanceEstimator` method's
estimate is from the true accuracy on shifted, unlabelled target sets, and how often its
interval covers the truth.

Model: SmallCNN (width 16) trained with Adam for `--epochs` on `--train-points` Fashion-MNIST
training images (weights cached under `--cache`); source = `--val-points` clean held-out
training images (labelled: what the estimators are fitted on); targets built from
`--test-points` test images:
  - corruption: each of peg's corruptions for grey images × severities 1–5 (`peg.data.corruptions`);
  - label shift: the clean test images resampled to Dirichlet(α = 0.3) class priors, `--draws`
    draws;
  - corruption + label shift: each corruption at severity 3, resampled to one Dirichlet(0.3)
    draw.
`--dataset cifar10`: the `cifar10-adam` preset's CNN (member 0 of its deep ensemble, loaded from
`--bench-cache`), source = the preset's clean validation split (10,000 images), targets from
its 5,000 test images: CIFAR-10-C's 19 corruptions × 5 severities, label shift and corruption +
label shift as above (`_label_free_cifar`).

`--dataset generator`: docs/monitor.md's 4-class logits generator (`_label_free_generator`:
weaker signal, label shift, both, a p(y | x) change); `--dataset tabular`: a gradient-boosted
model on UCI protein (`_label_free_tabular`: label shift, covariate shift, feature noise,
missing features, noise + label shift). Corruptions are scored in two families, severity 1-3
and the severe 4-5.

Tables (`_label_free_table`): per method, MAE per family, the share of sets whose interval
covers the truth and its mean half-width, seconds per estimate (one set, that method alone);
then the default's own table per family: MAE, coverage, mean half-width, share flagged
`reliable=False`. `--skip-learned` leaves out the learned mode's row (its fit is minutes).
The interval's width's scale and "auto"'s gate threshold are set on synthetic shifts of the
source (label shift, confidence tilts, logit scale and noise, weaker signal, collapse), not on
any target set. The last row,
"auto"'s opt-in learned mode, learns from corrupted copies of `--source-copies` source images
and is scored leave one corruption family out (`_label_free_learn`): none of these sets, and
no copy of a target's corruption family, was seen in fitting.

Run (from the repository root, one thread):
    OMP_NUM_THREADS=1 python benchmarks/label_free.py
    OMP_NUM_THREADS=1 python benchmarks/label_free.py --dataset cifar10 \
        --bench-cache /work/main/.peg-cache/bench --data-root ../shared/data
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import _label_free_generator as generator
import _label_free_table as table
import numpy as np
import torch
from _label_free_cifar import CORRUPTIONS, CifarSets
from _label_free_learn import LeaveOneFamilyOut, source_copies
from _label_free_tabular import TabularSets

import peg
import peg.data
from peg.data import corruptions as cc
from peg.methods.estimation import ESTIMATORS, _learned
from peg.models.cnn import SmallCNN
from peg.utils.env import git_commit, machine


def _model(args) -> torch.nn.Module:
    from safetensors.torch import load_file, save_file

    path = Path(args.cache) / f"smallcnn16-{args.train_points}-{args.epochs}.safetensors"
    model = SmallCNN(width=16)
    if path.is_file():
        model.load_state_dict(load_file(str(path)))
        return model.eval()
    X, y = peg.data.load("fashion-mnist", "train")
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(args.epochs):
        order = torch.randperm(args.train_points, generator=g)
        for i in range(0, args.train_points, 128):
            idx = order[i : i + 128]
            loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(model.state_dict(), str(path))
    return model.eval()


@torch.no_grad()
def _logits(model, X, name: str, args) -> np.ndarray:
    path = Path(args.cache) / f"logits-{args.train_points}-{args.epochs}-{name}.npy"
    if path.is_file():
        return np.load(path, allow_pickle=False)
    out = torch.cat([model(X[i : i + 1000]) for i in range(0, len(X), 1000)]).numpy()
    np.save(path, out)
    return out


def _sets(model, args):
    """(kind, name, logits, labels) of every target set."""
    X, y = peg.data.load("fashion-mnist", "test")
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))[: args.test_points]
    X, y = X[order], y[order].numpy()
    rng = np.random.default_rng(0)

    def resample(n: int) -> np.ndarray:
        q = rng.dirichlet(np.full(10, 0.3))
        counts = rng.multinomial(n, q)
        return np.concatenate([rng.choice(np.nonzero(y == c)[0], k) for c, k in enumerate(counts)])

    clean = _logits(model, X, f"clean-{args.test_points}", args)
    yield "clean", "clean", clean, y
    for d in range(args.draws):
        idx = resample(len(y))
        yield "label shift", f"dirichlet {d}", clean[idx], y[idx]
    for name in cc.applicable(1):
        for severity in (1, 2, 3, 4, 5):
            key = f"{name}-{severity}-{args.test_points}"
            path = Path(args.cache) / f"logits-{args.train_points}-{args.epochs}-{key}.npy"
            logits = np.load(path) if path.is_file() else _logits(
                model, cc.corrupt(X, name, severity), key, args)  # fmt: skip
            yield "corruption", f"{name} {severity}", logits, y
            if severity == 3:
                idx = resample(len(y))
                yield "corruption + label shift", f"{name} 3 + dirichlet", logits[idx], y[idx]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--dataset",
        choices=("fashion-mnist", "cifar10", "generator", "tabular"),
        default="fashion-mnist",
    )
    p.add_argument("--cache", default=".peg-cache/label_free")
    p.add_argument("--bench-cache", default=".peg-cache/bench", help="cifar10: the preset's")
    p.add_argument("--data-root", default=None, help="cifar10: the data folder")
    p.add_argument("--train-points", type=int, default=10000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--val-points", type=int, default=5000)
    p.add_argument("--test-points", type=int, default=5000)
    p.add_argument("--draws", type=int, default=10)
    p.add_argument("--source-copies", type=int, default=2000, help="auto learns from these")
    p.add_argument("--overhead-only", action="store_true", help="only estimate / forward")
    p.add_argument("--skip-learned", action="store_true", help="no learned-mode row (LOFO)")
    args = p.parse_args()
    print(f"machine: {machine()}; commit {git_commit()}")
    t0 = time.perf_counter()
    if args.dataset == "cifar10":
        cifar = CifarSets(args)
        V, VL = cifar.source()
        sets = cifar.sets()

        def timing() -> tuple:  # (model, source inputs, labels, target inputs)
            return cifar.model, cifar.val_images(), torch.from_numpy(VL), cifar.val_images()

        def copies() -> tuple:
            logits = lambda X: _forward(cifar.model, X)  # noqa: E731
            folder = Path(args.cache) / "learn" / "cifar10"
            return source_copies(
                logits, cifar.val_images, VL, CORRUPTIONS, folder, args.source_copies
            )
    elif args.dataset in ("generator", "tabular"):
        made = TabularSets(args.data_root) if args.dataset == "tabular" else generator
        V, VL = made.source()
        sets = made.sets()
        args.skip_learned = True  # no images to corrupt: the learned mode does not apply
    else:
        model = _model(args)
        Xtr, ytr = peg.data.load("fashion-mnist", "train")
        held = slice(len(ytr) - args.val_points, len(ytr))
        V = _logits(model, Xtr[held], f"val-{args.val_points}", args)
        VL = ytr[held].numpy()
        sets = _sets(model, args)

        def timing() -> tuple:
            return model, Xtr[held], ytr[held], peg.data.load("fashion-mnist", "test")[0]

        def copies() -> tuple:
            logits = lambda X: _forward(model, X)  # noqa: E731
            folder = Path(args.cache) / "learn" / "fashion-mnist"
            names = cc.applicable(1)
            return source_copies(logits, lambda: Xtr[held], VL, names, folder, args.source_copies)

    images = args.dataset in ("fashion-mnist", "cifar10")
    if args.overhead_only and images:
        return _overhead(*timing(), copies()[0][:11])
    t = time.perf_counter()
    est = peg.PerformanceEstimator(all_methods=True).fit(V, VL)
    print(
        f"source: {len(VL)} points, accuracy {est.source_accuracy_:.4f}, T = "
        f"{est.temperature_:.3f}; fit (all methods, widths) {time.perf_counter() - t:.1f} s"
    )
    print(
        "width scales q at 90% (half-width = q · (0.02 + disagreement + label-shift residual)): "
        + ", ".join(f"{k} {v:.2f}" for k, v in est.scales_.items())
    )
    lofo = None
    if not args.skip_learned:
        t = time.perf_counter()
        lofo = LeaveOneFamilyOut(V, VL, *copies())
        print(
            f"learned auto: fitted on {len(VL) - args.source_copies} source points and "
            f"{len(lofo.learned.accuracy_)} shifted sets of {args.source_copies} ({_FAMS}) in "
            f"{time.perf_counter() - t:.1f} s"
        )
    rows, clean = [], None
    for kind, name, logits, y in sets:
        clean = logits if kind == "clean" else clean
        truth = float((logits.argmax(1) == y).mean())
        e = est.estimate(logits)
        width = None
        if lofo is not None:
            e.estimates[LEARNED], width = lofo.estimate(name, kind, logits)
        rows.append((family(kind, name), name, truth, e, len(y), width))
    print(
        f"{len(rows)} target sets; true accuracy {min(r[2] for r in rows):.3f} to "
        f"{max(r[2] for r in rows):.3f}"
    )
    seconds = {}
    for key in ESTIMATORS:
        single = peg.PerformanceEstimator(key).fit(V, VL)
        t = time.perf_counter()
        single.estimate(clean)
        seconds[key] = time.perf_counter() - t
    if lofo is not None:
        t = time.perf_counter()
        lofo.estimate("clean", "clean", clean)
        seconds[LEARNED] = time.perf_counter() - t
    table.methods(rows, est, seconds, LEARNED if lofo is not None else None)
    table.default(rows, args.dataset)
    if images:
        _overhead(*timing(), copies()[0][:11])
    print(f"\nwhole run {time.perf_counter() - t0:.0f} s")


LEARNED = "auto, learned (LOFO)"  # shift_points > 0: left out of each target's family
_FAMS = "families: " + ", ".join(sorted(set(_learned.FAMILIES.values())))


@torch.no_grad()
def _forward(model, X) -> np.ndarray:
    return torch.cat([model(X[i : i + 500]) for i in range(0, len(X), 500)]).numpy()


@torch.no_grad()
def _overhead(model, Xv, yv, X, copies) -> None:
    """`estimate` on (at most 10,000 of) the model's inputs `X` against one plain forward pass
    over them in batches of 512: wall and CPU (process) time, best of 5 (the CPU time is the
    steadier one on a shared machine)."""
    X = X[:10000]
    # auto learned from 11 copies (its estimate costs the same whatever it learned from)
    est = peg.PerformanceEstimator().fit(model, (Xv, yv), shifted=copies)
    shifted = cc.corrupt(X, "gaussian_noise", 5)  # a target that opens auto's gate
    best = {k: [np.inf, np.inf] for k in ("forward", "estimate", "shifted")}

    def clock(key, run) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        best[key] = [min(best[key][0], wall), min(best[key][1], cpu)]

    for _ in range(5):
        clock("forward", lambda: [model(X[i : i + 512]) for i in range(0, len(X), 512)])
        clock("estimate", lambda: est.estimate(X))
        clock("shifted", lambda: est.estimate(shifted))
    (fw, fc), (ew, ec), (sw, sc) = best["forward"], best["estimate"], best["shifted"]
    mode = est.estimate(shifted).method
    print(
        f"\nestimate on {len(X)} inputs through the model: {ew:.3f} s wall, {ec:.3f} s CPU; one "
        f"forward pass (batches of 512): {fw:.3f} s wall, {fc:.3f} s CPU; ratio {ew / fw:.2f} "
        f"wall, {ec / fc:.2f} CPU (target ≤ 1.2)\n"
        f"the same inputs under gaussian_noise 5 ({mode}): {sw:.3f} s wall, {sc:.3f} s CPU; "
        f"ratio {sw / fw:.2f} wall, {sc / fc:.2f} CPU"
    )


def family(kind: str, name: str) -> str:
    """The family a set is scored in: corruptions split at severity 4 (the severe ones)."""
    if kind != "corruption":
        return kind
    return "corruption 4-5" if name.split()[-1] in ("4", "5") else "corruption 1-3"


if __name__ == "__main__":
    main()
