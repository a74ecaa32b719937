"""Peak memory of a PEG fit on a streamed validation set, against the set's size.

PEG-15 (η searched) of a tiny CNN fitted on a `Dataset` that makes its images on the fly
(3×H×W float32, a seeded function of the index), read through a DataLoader (workers=0). Each N
runs in a fresh subprocess, which reports its peak RSS growth over the fit (VmHWM after − VmRSS
before: everything the fit allocated and held at once) and the time. Nothing gathers the set,
the scoring points are capped (`max_score_points`, 10,000 by default), so the growth should be
flat in N: the target is largest ≤ 1.5 × smallest.

To keep the run under ~5 minutes on 2 cores, the images are 3×16×16 and the scoring cap is
2,000 (`--score-points`; the library's default is 10,000, which makes each η of the search
cost 5× more forward passes but no more memory per N once N ≥ 2 × cap).

    python benchmarks/streaming_memory.py                 # N = 10k, 40k, 160k; 3×16×16
    python benchmarks/streaming_memory.py --sizes 2000 8000 --side 32 --score-points 10000

`--loader-case` measures the case of issue 22 instead: PEG-15 with a fixed η (no search: the
pass in order, then the gradients) on a DataLoader over 40,000 images of 3×64×64 (1.97 GB made
on the fly, batch_size=256), in 5 fresh processes; the target is a peak RSS growth within
+0.3 GB in every one. Before the fix (the pass in order kept each batch's labels as a small
tensor allocated after the batch, pinning glibc's heap once its dynamic mmap threshold had
risen past the batch size) it grew +1.0 to +1.9 GB.

    python benchmarks/streaming_memory.py --loader-case   # ~2 minutes on 2 cores
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
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    """N images 3×side×side made on the fly; the label is the sign of the mean of channel 0."""

    def __init__(self, n: int, side: int) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(int(i))
        x = torch.randn(3, self.side, self.side, generator=g)
        return x, int(x[0].mean() > 0)


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 16, 2),
    ).eval()


def _status(key: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(n: int, side: int, score_points: int, eta: float | None = None) -> None:
    import peg

    model = tiny_cnn()
    loader = DataLoader(Images(n, side), batch_size=256)
    before = _status("VmRSS")
    start = time.perf_counter()
    points = peg.ScaleSearch(max_points=score_points)
    search = dict(eta="search", search=points) if eta is None else dict(eta=eta)
    fitted = peg.PEG(n_members=15, progress=False, **search).fit(model, loader)
    seconds = time.perf_counter() - start
    grown = _status("VmHWM") - before
    points = fitted.meta_["validation_points"]
    print(json.dumps({"n": n, "grown": grown, "seconds": seconds, "points": points}))


def _run_child(n: int, side: int, score_points: int, eta: float | None = None) -> dict:
    extra = [] if eta is None else ["--eta", str(eta)]
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            *("--child", str(n), "--side", str(side), "--score-points", str(score_points)),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _header() -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"$ python benchmarks/streaming_memory.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"commit: {commit}")
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )


def loader_case(n: int = 40_000, side: int = 64, runs: int = 5, limit_gb: float = 0.3) -> None:
    """Issue 22's case: PEG-15, fixed η, on a 1.97 GB loader, `runs` fresh processes."""
    _header()
    print(
        f"PEG-15, eta=0.01 (fixed: the pass in order, then the gradients), tiny CNN, {n} images "
        f"3×{side}×{side} made on the fly ({n * 3 * side * side * 4 / 1e9:.2f} GB), "
        "DataLoader(batch_size=256, workers=0); peak RSS growth over fit (VmHWM − VmRSS "
        "before), one fresh process per run"
    )
    print(f"{'run':>4} {'peak growth (GB)':>17} {'fit (s)':>8}")
    grown = []
    for run in range(runs):
        r = _run_child(n, side, 0, eta=0.01)
        grown.append(r["grown"] / 1e9)
        print(f"{run + 1:>4} {grown[-1]:>17.2f} {r['seconds']:>8.1f}", flush=True)
    ok = max(grown) <= limit_gb
    print(
        f"largest peak growth: +{max(grown):.2f} GB (target ≤ +{limit_gb} GB in every run: "
        f"{'met' if ok else 'MISSED'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 40_000, 160_000])
    parser.add_argument("--side", type=int, default=16)
    parser.add_argument("--score-points", type=int, default=2000)
    parser.add_argument("--loader-case", action="store_true", help="issue 22's case (see above)")
    parser.add_argument("--eta", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.side, args.score_points, args.eta)
        return
    if args.loader_case:
        loader_case()
        return
    _header()
    gb = 3 * args.side * args.side * 4 / 1e9
    print(
        f"PEG-15, eta='search' (holdout=0.5, max_points={args.score_points}), tiny CNN, "
        f"images 3×{args.side}×{args.side} made on the fly, DataLoader(batch_size=256, "
        "workers=0); peak RSS growth over fit (VmHWM − VmRSS before), fresh process per N"
    )
    print(f"{'N':>8} {'set (GB)':>9} {'scoring':>8} {'peak growth (MB)':>17} {'fit (s)':>8}")
    rows = []
    for n in args.sizes:
        r = _run_child(n, args.side, args.score_points)
        rows.append(r)
        print(
            f"{n:>8} {n * gb:>9.2f} {r['points']['scoring']:>8} {r['grown'] / 2**20:>17.0f} "
            f"{r['seconds']:>8.1f}",
            flush=True,
        )
    grown = [r["grown"] for r in rows]
    print(f"largest / smallest peak growth: {max(grown) / min(grown):.2f} (target ≤ 1.5)")


if __name__ == "__main__":
    main()
