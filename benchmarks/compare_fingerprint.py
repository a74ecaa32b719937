"""What `peg.compare`'s resume key costs: SHA-256 of the data and the weights, against one
forward pass of the model over the same data.

Target (issue 40, defect 3): the fingerprint that replaced shape + sum + abs-sum (which missed
labels rolled by one, swapped rows and permuted weights) hashes every byte, streamed batch by
batch, and costs less than one forward pass over the set (compare makes one per method and
set; the fingerprint is taken once per set, only with `out=`).

Cases, each on a test set of N points, timed in round-robin rounds (`_timing.round_robin`):
the fingerprint of the pair `(X, y)` (tensors, hashed in chunks), of a DataLoader over it (one
pass over its batches, as a user's loader is read), of the model's weights, and one forward pass
of the model over X in batches of 512 under `torch.no_grad()`, sliced from the tensor and read
from the loader (a loader's own cost, collating item by item, is paid by every pass over it).
Models: a SmallCNN (width 16) on 28 × 28 images, Fashion-MNIST's shape (random inputs: the
bytes, not their values, cost); and the small MLP of the toy sets on 2 features, the case where
data is largest against the model's work. Every figure is a ratio measured in this run, on
the machine printed.

    OMP_NUM_THREADS=1 python benchmarks/compare_fingerprint.py [--points 10000] [--quick]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _timing import round_robin
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peg.apps.compare.state import fingerprint
from peg.models import MLP, SmallCNN
from peg.utils.env import git_commit, machine


def _forward(model: nn.Module, X: torch.Tensor) -> None:
    with torch.no_grad():
        for start in range(0, len(X), 512):
            model(X[start : start + 512])


def _forward_loader(model: nn.Module, loader: DataLoader) -> None:
    with torch.no_grad():
        for x, _ in loader:
            model(x)


def _case(name: str, model: nn.Module, X: torch.Tensor, y: torch.Tensor, budget: float) -> None:
    model.eval()
    loader = DataLoader(TensorDataset(X, y), batch_size=512)
    runs = {
        "forward pass": lambda: _forward(model, X),
        "fingerprint (X, y)": lambda: fingerprint((X, y)),
        "forward pass over the loader": lambda: _forward_loader(model, loader),
        "fingerprint loader": lambda: fingerprint(loader),
        "fingerprint weights": lambda: fingerprint(model),
    }
    times = {k: statistics.median(v) for k, v in round_robin(runs, 3, budget).items()}
    size = (X.numel() * X.element_size() + y.numel() * y.element_size()) / 1e6
    print(f"\n{name}: {len(X):,} points, {size:.1f} MB of data, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")  # fmt: skip
    print("| case | median s | × forward pass |\n|---|---:|---:|")
    for k, t in times.items():
        print(f"| {k} | {t:.4f} | {t / times['forward pass']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10000, help="test points (default 10000)")
    parser.add_argument("--quick", action="store_true", help="1,000 points, a short budget")
    args = parser.parse_args()
    n, budget = (1000, 1.0) if args.quick else (args.points, 10.0)
    print(f"commit: {git_commit()}")
    print(f"machine: {machine()}; torch threads: {torch.get_num_threads()}")
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (n,), generator=g)
    torch.manual_seed(0)
    _case("SmallCNN (width 16), 1 × 28 × 28", SmallCNN(1, 10, width=16),
          torch.randn(n, 1, 28, 28, generator=g), y, budget)  # fmt: skip
    _case("MLP (2 → 20 → 2), two features", MLP(2, 2, hidden=(20,)),
          torch.randn(n, 2, generator=g), y % 2, budget)  # fmt: skip


if __name__ == "__main__":
    main()
