"""benchmarks/shapes.py's sections on images made of several real digits (its module doc):

- "multilabel": a multi-label network. Each image is a 2 × 2 grid of 14 × 14 cells (28 × 28
  pixels); three of the four cells hold a real MNIST digit (pooled 2 × 2), one is empty. The
  labels are the K = 10 flags "digit d is present" (multi-hot `[N, 10]`). A 784-256-10 MLP
  (`BCEWithLogitsLoss`, Adam, over-fitted: over-confident) is trained on 8,000 such images
  made of the first 5,000 digits of a seeded shuffle; the validation images (4,000) and the
  test images (4,000) are made of two other, disjoint, pools of 2,500 digits each.
  Temperature scaling with one shared temperature is fitted on the validation logits
  `[N, 10]` with their multi-hot labels as they are (multi-label input) and checked against
  the best one-scale fit, a grid of 4,001 temperatures, log-spaced over [0.25, 8], of the
  validation NLL (mean binary NLL over every label entry); the per-label maps
  (`per_label=True`) against the shared ones; `peg.ConformalMultilabel` (conformal risk
  control of the false-negative rate, α = 0.1) fitted on the calibrated validation
  probabilities, its recall and set size on the test images. Bars (the issue's): TS within
  0.001 nats of the grid's best, test recall >= 1 − α − 0.02.
- "segmentation": a small segmentation network. Each image is a 32 × 32 canvas with two real
  digits (pooled to 14 × 14) pasted at random places, one in each half; the per-pixel labels
  are 0 for the background and 1 + d for a pixel of digit d (ink > 0.5), C = 11 classes, and
  255 (ignored, as VOC marks object boundaries) for the faint pixels at a digit's border
  (0.1 < ink <= 0.5). A fully convolutional network (3 convolutions, two 2 × 2 max-pools, a
  1 × 1 classifier, bilinear upsampling back to 32 × 32) is trained with
  `cross_entropy(ignore_index=255)` on 3,000 canvases of one pool of digits; TS and vector
  scaling are fitted on the validation maps `[B, 11, 32, 32]` with `ignore_index=255`
  (dense input) and scored, per pixel not ignored, on the test maps: NLL, error, Brier and
  ECE (`peg.evaluate`), before and after.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import peg
from peg.methods.conformal._kinds import false_negative_rate

ALPHA = 0.1
IGNORE = 255


def _digits(seed: int) -> tuple[Tensor, Tensor]:
    """MNIST's 10,000 digits pooled to 14 × 14 `[10000, 14, 14]` and their labels `[10000]`,
    in a seeded order."""
    X, digits = peg.data.load("mnist", "test")
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    return F.avg_pool2d(X[order], 2)[:, 0], digits[order]


def _grids(x: Tensor, d: Tensor, n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """`n` 28 × 28 images, a 2 × 2 grid with three of the pool's digits `x` `[P, 14, 14]` and
    one empty cell, and their multi-hot labels `[n, 10]`."""
    images, labels = torch.zeros(n, 28, 28), torch.zeros(n, 10, dtype=torch.long)
    for i in range(n):
        picks = torch.randint(0, len(x), (3,), generator=g)
        cells = torch.randperm(4, generator=g)[:3]
        for j, c in zip(picks.tolist(), cells.tolist(), strict=True):
            r, col = 14 * (c // 2), 14 * (c % 2)
            images[i, r : r + 14, col : col + 14] = x[j]
            labels[i, d[j]] = 1
    return images.flatten(1), labels


def _fit(net: nn.Module, X: Tensor, y: Tensor, loss_fn, epochs: int, seed: int) -> nn.Module:
    """`epochs` of Adam (lr 1e-3, batches of 128) on (X, y)."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for batch in torch.randperm(len(X), generator=g).split(128):
            opt.zero_grad()
            loss_fn(net(X[batch]), y[batch]).backward()
            opt.step()
    return net.eval()


def _mean_bce(z: Tensor, y: Tensor) -> float:
    """The mean binary NLL of logits `z` `[N, K]` against multi-hot `y` `[N, K]`."""
    return float(F.binary_cross_entropy_with_logits(z, y.double()))


def _row(name: str, m: dict, extra: str = "") -> str:
    return f"| {name} | {m['nll']:.4f} | {m['brier']:.4f} | {100 * m['ece']:.2f} |{extra}"


def multilabel(seed: int) -> list[str]:
    """The multi-label section's lines (the module doc)."""
    t0 = time.perf_counter()
    x, d = _digits(seed)
    g = torch.Generator().manual_seed(seed)
    Xtr, ytr = _grids(x[:5000], d[:5000], 8000, g)
    Xv, yv = _grids(x[5000:7500], d[5000:7500], 4000, g)
    Xt, yt = _grids(x[7500:], d[7500:], 4000, g)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    loss = nn.BCEWithLogitsLoss()
    _fit(net, Xtr, ytr.float(), loss, 40, seed)
    with torch.no_grad():
        zv, zt = net(Xv).double(), net(Xt).double()
    trained = time.perf_counter() - t0
    shared = peg.TemperatureScaling().fit(zv, yv)  # [N, K] with multi-hot [N, K]: multilabel
    grid = torch.logspace(torch.log10(torch.tensor(0.25)), torch.log10(torch.tensor(8.0)), 4001)
    grid_nll = torch.tensor([_mean_bce(zv / t, yv) for t in grid.double()])
    best_t, best = float(grid[grid_nll.argmin()]), float(grid_nll.min())
    ts_nll = _mean_bce(zv / shared.temperature_, yv)
    maps = {
        "TS, one shared temperature": shared,
        "TS, a temperature per label": peg.TemperatureScaling(per_label=True).fit(zv, yv),
        "Platt, one shared (a, b)": peg.PlattScaling().fit(zv, yv),
        "Platt, per label": peg.PlattScaling(per_label=True).fit(zv, yv),
        "Isotonic, per label": peg.IsotonicCalibration(per_label=True).fit(zv, yv),
    }
    rows = [_row("uncalibrated", peg.evaluate(zt, yt))]
    for name, m in maps.items():
        rows.append(_row(name, peg.evaluate(m, zt, yt)))
    crc = peg.ConformalMultilabel(alpha=ALPHA).fit(shared.predict_proba(zv), yv)
    sets = crc.predict_set(shared.predict_proba(zt))
    recall = 1 - float(false_negative_rate(sets, yt).mean())
    size = float(sets.sum(1).double().mean())
    accuracy = float(((zt > 0).long() == yt).double().mean())
    lines = [
        '### multilabel: MLP on 2 × 2 grids of three MNIST digits, K = 10 labels "digit present"',
        "",
        f"8,000 training / {len(zv)} val / {len(zt)} test images (three disjoint pools of "
        f"digits); trained in {trained:.0f} s; per-entry accuracy on the test images "
        f"{100 * accuracy:.2f}%; 3 labels or fewer per image (a digit can repeat).",
        "",
        "| map (fitted on val) | test NLL (mean binary) | Brier | ECE % |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Conformal risk control of the FNR (α = {ALPHA}) on the shared TS probabilities: "
        f"threshold {crc.threshold_:.4f}, test recall {recall:.4f}, {size:.2f} labels per set.",
        "",
    ]
    checks = [
        (f"shared TS T = {shared.temperature_:.4f}, val NLL {ts_nll:.6f}; grid best T = "
         f"{best_t:.4f}, val NLL {best:.6f}; gap {ts_nll - best:+.2e} nats (bar <= 0.001)",
         ts_nll <= best + 0.001),
        (f"test recall {recall:.4f} >= 1 − α − 0.02 = {1 - ALPHA - 0.02:.2f}",
         recall >= 1 - ALPHA - 0.02),
    ]  # fmt: skip
    return lines + [f"- {text}: {'PASS' if ok else 'FAIL'}" for text, ok in checks]


def _canvases(x: Tensor, d: Tensor, n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """`n` canvases `[n, 1, 32, 32]` with two of the pool's digits, one per half, and their
    per-pixel labels `[n, 32, 32]` (0 background, 1 + digit, IGNORE at a digit's border)."""
    images = torch.zeros(n, 32, 32)
    labels = torch.zeros(n, 32, 32, dtype=torch.long)
    for i in range(n):
        picks = torch.randint(0, len(x), (2,), generator=g).tolist()
        for half, j in enumerate(picks):
            r = int(torch.randint(0, 19, (1,), generator=g))
            c = 16 * half + int(torch.randint(0, 3, (1,), generator=g))
            ink = x[j]
            images[i, r : r + 14, c : c + 14] = torch.maximum(
                images[i, r : r + 14, c : c + 14], ink
            )
            cell = labels[i, r : r + 14, c : c + 14]
            cell[ink > 0.1] = IGNORE
            cell[ink > 0.5] = 1 + int(d[j])
    return images[:, None], labels


def _fcn() -> nn.Module:
    """A fully convolutional network `[B, 1, 32, 32]` -> `[B, 11, 32, 32]` (the module doc)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 11, 1),
        nn.Upsample(scale_factor=4, mode="bilinear", align_corners=False),
    )


def _dense_row(name: str, m: dict) -> str:
    return (f"| {name} | {m['nll']:.4f} | {100 * m['error']:.2f} | {m['brier']:.4f} | "
            f"{100 * m['ece']:.2f} |")  # fmt: skip


def segmentation(seed: int) -> list[str]:
    """The segmentation section's lines (the module doc)."""
    t0 = time.perf_counter()
    x, d = _digits(seed)
    g = torch.Generator().manual_seed(seed)
    Xtr, ytr = _canvases(x[:5000], d[:5000], 3000, g)
    Xv, yv = _canvases(x[5000:7500], d[5000:7500], 1000, g)
    Xt, yt = _canvases(x[7500:], d[7500:], 1000, g)
    net = _fit(_fcn(), Xtr, ytr, nn.CrossEntropyLoss(ignore_index=IGNORE), 12, seed)
    with torch.no_grad():
        zv, zt = net(Xv), net(Xt)  # [B, 11, 32, 32]
    trained = time.perf_counter() - t0
    ts = peg.TemperatureScaling(ignore_index=IGNORE).fit(zv, yv)
    vs = peg.VectorScaling(ignore_index=IGNORE).fit(zv, yv)
    before = peg.evaluate(zt, yt, ignore_index=IGNORE)
    kept = int((yt != IGNORE).sum())
    lines = [
        "### segmentation: a small FCN on 32 × 32 canvases of two MNIST digits, 11 classes",
        "",
        f"3,000 training / {len(zv)} val / {len(zt)} test canvases (three disjoint pools of "
        f"digits); trained in {trained:.0f} s; test pixels scored: {kept:,} of "
        f"{yt.numel():,} ({100 * (1 - kept / yt.numel()):.1f}% ignored, label 255); "
        f"TS temperature {ts.temperature_:.4f}.",
        "",
        "| map (fitted on val, dense) | test NLL per pixel | error % | Brier | ECE % |",
        "|---|---|---|---|---|",
        _dense_row("uncalibrated", before),
        _dense_row("TS", peg.evaluate(ts, zt, yt)),
        _dense_row("vector scaling", peg.evaluate(vs, zt, yt)),
        "",
    ]
    after = peg.evaluate(ts, zt, yt)
    ok = after["nll"] <= before["nll"]
    verdict = "PASS" if ok else "FAIL"
    return [*lines, f"- TS lowers the test NLL per pixel: {before['nll']:.4f} -> "
            f"{after['nll']:.4f}: {verdict}"]  # fmt: skip
