"""Streaming metrics on 10⁶ predictions × 100 classes, against the one-shot functions.

Target (issue 7): NLL, error, Brier, ECE/MCE accumulated batch by batch over 10⁶ rows of 100
classes in under 2 seconds here, equal to the one-shot values. Printed: the streaming time for
probabilities `[B, C]` and for member logits `[M, B, C]` (5 members, 2·10⁵ rows, so the
member tensor stays in memory for the one-shot comparison), the one-shot time on the same
data, and the largest difference between the two. The inputs are generated before the clock
starts; every number is measured in this run, on this machine (printed).

    python benchmarks/streaming_metrics.py [--rows 1000000] [--classes 100] [--quick]
"""

from __future__ import annotations

import argparse
import time

import torch

from peg import metrics
from peg.metrics.streaming import StreamingMetrics
from peg.utils.env import machine

KEYS = ("nll", "error", "brier", "ece", "mce")


def _one_shot(pred: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {k: float(getattr(metrics, k)(pred, y)) for k in KEYS}


def _streamed(pred: torch.Tensor, y: torch.Tensor, batch: int, axis: int) -> dict[str, float]:
    stream = StreamingMetrics()
    for p, t in zip(pred.split(batch, axis), y.split(batch), strict=True):
        stream.update(p, t)
    return {k: v for k, v in stream.compute().items() if k in KEYS}


def _case(label: str, pred: torch.Tensor, y: torch.Tensor, batch: int, axis: int) -> None:
    start = time.perf_counter()
    streamed = _streamed(pred, y, batch, axis)
    t_stream = time.perf_counter() - start
    start = time.perf_counter()
    one_shot = _one_shot(pred, y)
    t_one = time.perf_counter() - start
    diff = max(abs(streamed[k] - one_shot[k]) for k in KEYS)
    print(f"{label:44} {t_stream:8.2f} {t_one:8.2f} {diff:10.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--quick", action="store_true", help="10⁴ rows (a smoke run)")
    args = parser.parse_args()
    N, C = (10_000 if args.quick else args.rows), args.classes
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, C, (N,), generator=g)
    logits = 3 * torch.randn(N, C, generator=g)
    logits[torch.arange(N), y] += 2.0  # a classifier that is right about half the time
    probs = logits.softmax(-1)
    M, n_members = 5, N // 5
    members = logits[:n_members] + 0.5 * torch.randn(M, n_members, C, generator=g)
    print(f"machine: {machine()}; batches of {args.batch} rows")
    print(f"{'input':44} {'stream s':>8} {'1-shot s':>8} {'max |diff|':>10}")
    _case(f"probabilities [{N}, {C}]", probs, y, args.batch, 0)
    _case(f"member logits [{M}, {n_members}, {C}]", members, y[:n_members], args.batch, 1)


if __name__ == "__main__":
    main()
