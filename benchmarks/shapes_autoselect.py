"""`benchmarks/shapes.py --sections autoselect`: AutoSelect against the best column of
`peg.compare`, on each kind of output, from networks trained here on real MNIST digits
(`peg.data.load("mnist", "test")`, the 10,000 official test digits):

- binary: the binary section's one-logit MLP (odd vs even), its scores `[N]`;
- multilabel: a 784-128-4 MLP with four independent labels per digit (odd, >= 5, prime,
  has a closed loop: 0, 6, 8, 9), `BCEWithLogitsLoss`, 40 epochs of Adam on 4,000 digits
  (over-fitted: over-confident), its logits `[N, 4]` with multi-hot labels `[N, 4]`;
- dense: a 3-layer fully convolutional net (5x5, 5x5, 1x1; 16 channels) labelling every pixel
  of a digit `[B, 11, 28, 28]`: its digit where the ink is > 0.5, background (class 10) where
  < 0.05, ignored (255) in between; 4 epochs of Adam on 2,000 digits.

On each: the validation half fits AutoSelect (its default candidates, `calibrators(kind)`,
5 folds, no time budget: every candidate on every fold) and compare (the model and the same
maps, each fitted on the whole validation half), both scored on the test half by the kind's
NLL. The bar (issue 58): AutoSelect's choice within 0.01 nats of compare's best column.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

import peg

LOOPS = (0, 6, 8, 9)
PRIMES = (2, 3, 5, 7)
BACKGROUND, IGNORED = 10, 255


def _digits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    X, digits = peg.data.load("mnist", "test")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(X), generator=g)
    torch.manual_seed(seed)
    return X[order], digits[order], g


def _train(net: nn.Module, loss_fn: Any, X: torch.Tensor, y: torch.Tensor, epochs: int,
           g: torch.Generator) -> None:  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for batch in torch.randperm(len(X), generator=g).split(64):
            opt.zero_grad()
            loss_fn(net(X[batch]), y[batch]).backward()
            opt.step()


def train_multilabel(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits `[6000, 4]` and multi-hot labels `[6000, 4]` of the multilabel MLP."""
    X, digits, g = _digits(seed)
    X = X.flatten(1)
    attributes = [digits % 2 == 1, digits >= 5, torch.isin(digits, torch.tensor(PRIMES)),
                  torch.isin(digits, torch.tensor(LOOPS))]  # fmt: skip
    y = torch.stack(attributes, 1).float()
    net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 4))
    _train(net, nn.BCEWithLogitsLoss(), X[:4000], y[:4000], 40, g)
    with torch.no_grad():
        return net(X[4000:]).double(), y[4000:].long()


def train_dense(seed: int, n: int = 800) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits `[n, 11, 28, 28]` and per-pixel labels `[n, 28, 28]` (255 ignored) of the fully
    convolutional net, on digits it was not trained on."""
    X, digits, g = _digits(seed)
    ink = X[:, 0]
    y = torch.full(ink.shape, IGNORED, dtype=torch.long)
    y[ink < 0.05] = BACKGROUND
    y = torch.where(ink > 0.5, digits[:, None, None].expand_as(y), y)
    conv = [nn.Conv2d(1, 16, 5, padding=2), nn.Conv2d(16, 16, 5, padding=2)]
    net = nn.Sequential(conv[0], nn.ReLU(), conv[1], nn.ReLU(), nn.Conv2d(16, 11, 1))
    _train(net, nn.CrossEntropyLoss(ignore_index=IGNORED), X[:2000], y[:2000], 4, g)
    with torch.no_grad():
        return net(X[2000 : 2000 + n]), y[2000 : 2000 + n]


def _halves(logits: torch.Tensor, y: torch.Tensor) -> tuple[tuple, tuple]:
    h = len(y) // 2
    return (logits[:h], y[:h]), (logits[h:], y[h:])


def gap_lines(title: str, logits: torch.Tensor, y: torch.Tensor, **options: Any) -> list[str]:
    """AutoSelect and compare on the halves of one kind's logits: a table and the bar."""
    val, test = _halves(logits, y)
    started = time.perf_counter()
    auto = peg.AutoSelect(max_fit_seconds=None, progress=False, **options).fit(*val)
    seconds = time.perf_counter() - started
    result = peg.compare(*val, test, progress=False, say=None, **options)
    nll = {r["method"]: r["nll"] for r in result.table if not r.get("failed")}
    cv = {r["candidate"]: r["cv_mean"] for r in auto.report_}
    best = min(nll, key=lambda k: nll[k])
    chosen = float(peg.evaluate(auto, *test, **options)["nll"])
    gap = chosen - nll[best]
    lines = [
        f"### autoselect, {title}",
        "",
        f"AutoSelect: {seconds:.1f} s; chose {auto.chosen_} (test NLL {chosen:.4f}).",
        "",
        "| column | test NLL (compare) | AutoSelect CV NLL |",
        "|---|---|---|",
        *(
            f"| {n} | {v:.4f} | {cv[n]:.4f} |" if n in cv else f"| {n} | {v:.4f} | – |"
            for n, v in nll.items()
        ),
        "",
        f"- AutoSelect ({auto.chosen_}) − best column ({best}) = {gap:+.4f} nats (bar <= 0.01): "
        f"{'PASS' if gap <= 0.01 else 'FAIL'}",
    ]
    return lines


def run(
    seed: int, train_binary: Callable[[int], tuple[np.ndarray, np.ndarray, float]]
) -> list[str]:
    """The autoselect section's lines (the module doc)."""
    s, y, _ = train_binary(seed)
    lines = gap_lines("binary: the one-logit MLP's scores [N]", torch.as_tensor(s),
                      torch.as_tensor(y))  # fmt: skip
    logits, y = train_multilabel(seed)
    lines += ["", *gap_lines("multilabel: the 4-label MLP's logits [N, 4]", logits, y)]
    logits, y = train_dense(seed)
    lines += ["", *gap_lines("dense: the per-pixel net's logits [B, 11, 28, 28], 255 ignored",
                             logits, y, ignore_index=IGNORED)]  # fmt: skip
    return lines
