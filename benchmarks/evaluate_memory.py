"""Peak memory of `peg.evaluate` on a streamed test set, against the set's size.

A PEG-15 (stacked members, η fixed) of a small CNN with 10 classes, evaluated on a `Dataset`
that makes its images on the fly (3×H×W float32, a seeded function of the index; the images
and the on-the-fly set are `streaming_memory.py`'s), read through a DataLoader (workers=0).
Each N runs in a fresh subprocess, which fits the PEG on 2,000 points, resets its peak RSS
(`/proc/self/clear_refs`), and reports the peak RSS growth over `evaluate` (VmHWM after −
VmRSS before: everything evaluate allocated and held at once) and the time. `evaluate` streams
its metrics (one batch of member logits `[15, 256, 10]` at a time), so the growth should be
flat in N: the target is largest ≤ 1.5 × smallest. The "whole" column measures the path
evaluate took before (every member logit `[15, N, 10]` gathered, then the one-shot metrics)
on the same set, for comparison.

    python benchmarks/evaluate_memory.py                  # N = 10k, 40k, 160k; 3×16×16
    python benchmarks/evaluate_memory.py --sizes 2000 8000 --side 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch
from streaming_memory import Images, _status
from torch import nn
from torch.utils.data import DataLoader

CLASSES = 10


class Images10(Images):
    """`streaming_memory.Images` with 10 classes: the mean of channel 0, binned."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x, _ = super().__getitem__(i)
        return x, int((x[0].mean() * 4 * self.side).floor().clamp(-5, 4)) + 5


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 16, CLASSES),
    ).eval()


def _whole(fitted: object, data: object) -> dict[str, float]:
    """The path evaluate took before streaming: every member logit gathered, then metrics."""
    from peg import metrics
    from peg.methods.calibration.temperature import logits_and_labels

    logits, y = logits_and_labels(fitted, data, 256, None, "X")
    return metrics.classification_metrics(logits, y)


def child(n: int, side: int, whole: bool) -> None:
    import peg

    val = DataLoader(Images10(2000, side), batch_size=256)
    fitted = peg.PEG(n_members=15, eta=0.05, progress=False).fit(small_cnn(), val)
    loader = DataLoader(Images10(n, side), batch_size=256)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS: the fit's peak is not evaluate's
    before = _status("VmRSS")
    start = time.perf_counter()
    out = _whole(fitted, loader) if whole else peg.evaluate(fitted, loader, batch_size=256)
    seconds = time.perf_counter() - start
    grown = _status("VmHWM") - before
    print(json.dumps({"n": n, "grown": grown, "seconds": seconds, "nll": out["nll"]}))


def _run(n: int, side: int, whole: bool) -> dict[str, float]:
    argv = [sys.executable, __file__, "--child", str(n), "--side", str(side)]
    done = subprocess.run(argv + (["--whole"] if whole else []), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"child N={n} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 40_000, 160_000])
    parser.add_argument("--side", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="N = 1k, 4k (a smoke run)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.side, args.whole)
        return
    sizes = [1000, 4000] if args.quick else args.sizes
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )
    print(
        f"PEG-15 (stacked, eta=0.05), small CNN, {CLASSES} classes, images 3×{args.side}×"
        f"{args.side} made on the fly, DataLoader(batch_size=256, workers=0); peak RSS growth "
        "over evaluate (VmHWM − VmRSS before, peak reset after fit), fresh process per N and path"
    )
    print(
        f"{'N':>8} {'set (GB)':>9} {'[M,N,C] (MB)':>13} {'evaluate (MB)':>14} {'(s)':>6} "
        f"{'whole (MB)':>11} {'(s)':>6} {'|Δ nll|':>9}"
    )
    grown = []
    for n in sizes:
        s, w = _run(n, args.side, False), _run(n, args.side, True)
        grown.append(s["grown"])
        held = 15 * n * CLASSES * 4 / 2**20
        print(
            f"{n:>8} {n * 3 * args.side**2 * 4 / 1e9:>9.2f} {held:>13.0f} "
            f"{s['grown'] / 2**20:>14.0f} {s['seconds']:>6.1f} {w['grown'] / 2**20:>11.0f} "
            f"{w['seconds']:>6.1f} {abs(s['nll'] - w['nll']):>9.1e}",
            flush=True,
        )
    print(f"evaluate: largest / smallest peak growth: {max(grown) / min(grown):.2f} (target ≤ 1.5)")


if __name__ == "__main__":
    main()
