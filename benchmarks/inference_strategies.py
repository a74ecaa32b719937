"""Ensemble inference: loop, vmap, folded, chunked, auto, against S × one member's forward.

Targets (issue 7): at large batch (>= 256) the chosen strategy takes at most 1.10 × S × (one
member's forward time); at small batch (1–32) the best strategy beats a plain Python loop over
S separate nn.Modules by >= 1.3× on the MLP. Every number is a ratio measured in this run, on
this machine (printed). The MLP three ways: the library's default (the PEG paper's 2-20-2 toy
model), the UCI regression network (13-50, Gaussian head), and a 784-256-256 Fashion-MNIST MLP,
whose 16 MB of member weights make even a few rows compute- and memory-bound.

    python benchmarks/inference_strategies.py [--members 15] [--repeats 5] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from _timing import round_robin
from torch import nn

from peg.ensemble import Ensemble
from peg.models import RegressionMLP, build
from peg.utils.env import machine


def _time(runs: dict[str, Callable[[], object]], repeats: int, budget: float = 1.0) -> dict:
    """Median seconds of each `run()` over round-robin rounds (`_timing.round_robin`)."""
    samples = round_robin(runs, repeats, budget, most=200)
    return {name: statistics.median(values) for name, values in samples.items()}


def _ensemble(model: nn.Module, members: int) -> Ensemble:
    states = []
    for i in range(members):
        torch.manual_seed(i)
        states.append({k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
                       for k, v in model.state_dict().items()})  # fmt: skip
    return Ensemble.from_state_dicts(model.eval(), states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer models and repeats")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = 2 if args.quick else args.repeats
    fashion_mlp = build("mlp", in_features=784, num_classes=10, hidden=(256, 256))
    cases = [
        # the library's MLP as the papers use it: PEG §5.6 (2-20-2), UCI regression (13-50-2)
        ("MLP 2-20", build("mlp", in_features=2, num_classes=2), (2,)),
        ("UCI 13-50", RegressionMLP(13), (13,)),
        ("MLP 784-256²", fashion_mlp, (1, 28, 28)),
        ("SmallCNN", build("small-cnn", in_channels=1, num_classes=10), (1, 28, 28)),
        ("ResNet-20", build("resnet20", in_channels=3, num_classes=10), (3, 32, 32)),
    ]
    if args.quick:
        cases = cases[:4]
    print(f"machine: {machine()}; {args.members} members; median of >= {repeats} rounds, "
          "every strategy timed in turn")  # fmt: skip
    print("ms per call; plain = a Python loop over S separate nn.Modules; loop = the ensemble's "
          "loop (member modules on views of the stacked weights); folded = members folded into "
          "the batch; auto/(S·1) = auto ÷ (S × one member's forward)")  # fmt: skip
    print(f"{'model':12} {'batch':>5} {'1 member':>8} {'plain':>7} {'loop':>7} {'vmap':>7} "
          f"{'folded':>7} {'chunk 5':>7} {'auto':>7} {'auto/(S·1)':>10} "
          f"{'plain/best':>10}")  # fmt: skip
    for name, model, shape in cases:
        ens = _ensemble(model, args.members)
        for batch in (1, 4, 8, 16, 32, 64, 256, 1024):
            if batch > 256 and name not in ("MLP 784-256²", "SmallCNN"):
                continue
            _row(name, model, ens, torch.randn(batch, *shape), repeats)


def _row(name: str, model: nn.Module, ens: Ensemble, x: torch.Tensor, repeats: int) -> None:
    """Time one model at one batch size with every strategy and print the ratios."""
    batch, S = len(x), len(ens)
    modules = [ens.member_model(i) for i in range(S)]
    strategies = (("loop", None), ("vmap", None), ("folded", None), ("chunked", 5), ("auto", None))
    # the physical limit: a plain forward of one member, timed on its own (its weights stay
    # in cache, as the S members' cannot)
    one = _time({"one": lambda: model(x)}, repeats)["one"]
    runs: dict[str, Callable[[], object]] = {"plain": lambda: [m(x) for m in modules]}
    for strategy, chunk in strategies:
        runs[strategy] = lambda s=strategy, c=chunk: ens.member_logits(
            x, batch, strategy=s, chunk_size=c
        )
    t = _time(runs, repeats)
    best = min(t[s] for s, _ in strategies)
    cells = " ".join(f"{t[k] * 1e3:7.1f}" for k in ("plain", *(s for s, _ in strategies)))
    print(
        f"{name:12} {batch:5d} {one * 1e3:8.2f} {cells} {t['auto'] / (S * one):10.2f} "
        f"{t['plain'] / best:10.2f}"
    )


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
