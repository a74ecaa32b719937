"""Ensemble inference: loop vs vmap vs chunked vs auto, against S × one member's forward time.

Targets (issue 7): at large batch (>= 256) the chosen strategy takes at most 1.10 × S × (one
member's forward time); at small batch (1–32) the best strategy beats a plain Python loop over
S separate nn.Modules by >= 1.3× on the MLP. Every number is a ratio measured in this run, on
this machine (printed).

    python benchmarks/inference_strategies.py [--members 15] [--repeats 5] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from peg._env import machine
from peg.ensemble import Ensemble
from peg.models import build


def _time(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


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
    cases = [
        ("MLP", build("mlp", in_features=784, num_classes=10, hidden=(256, 256)), (1, 28, 28)),
        ("SmallCNN", build("small-cnn", in_channels=1, num_classes=10), (1, 28, 28)),
        ("ResNet-20", build("resnet20", in_channels=3, num_classes=10), (3, 32, 32)),
    ]
    if args.quick:
        cases = cases[:2]
    print(f"machine: {machine()}; {args.members} members; median of {repeats}")
    print("ms per call; plain = a Python loop over S separate nn.Modules; loop = the ensemble's "
          "loop (functional_call); auto/(S·1) = auto ÷ (S × one member's forward)")  # fmt: skip
    print(f"{'model':10} {'batch':>5} {'1 member':>8} {'plain':>7} {'loop':>7} {'vmap':>7} "
          f"{'chunk 5':>7} {'auto':>7} {'auto/(S·1)':>10} {'plain/best':>10}")  # fmt: skip
    for name, model, shape in cases:
        ens = _ensemble(model, args.members)
        for batch in (1, 8, 32, 256, 1024):
            if name == "ResNet-20" and batch > 256:
                continue
            _row(name, model, ens, torch.randn(batch, *shape), repeats)


def _row(name: str, model: nn.Module, ens: Ensemble, x: torch.Tensor, repeats: int) -> None:
    """Time one model at one batch size with every strategy and print the ratios."""
    batch, S = len(x), len(ens)
    one = _time(lambda: model(x), repeats)  # the physical limit: a plain forward of one member
    modules = [ens.member_model(i) for i in range(S)]
    t = {"plain": _time(lambda: [m(x) for m in modules], repeats)}  # S separate nn.Modules
    for strategy, chunk in (("loop", None), ("vmap", None), ("chunked", 5), ("auto", None)):
        t[strategy] = _time(
            lambda s=strategy, c=chunk: ens.member_logits(x, batch, strategy=s, chunk_size=c),
            repeats,
        )
    best = min(t["vmap"], t["chunked"], t["loop"])
    cells = " ".join(f"{t[k] * 1e3:7.1f}" for k in ("plain", "loop", "vmap", "chunked", "auto"))
    print(
        f"{name:10} {batch:5d} {one * 1e3:8.2f} {cells} {t['auto'] / (S * one):10.2f} "
        f"{t['plain'] / best:10.2f}"
    )


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
