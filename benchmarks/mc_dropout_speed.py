"""MC dropout prediction against its limit: S samples should cost S forwards of the model.

SmallCNN (3×32×32 inputs, dropout 0.2 before the classifier, random weights), 1,024 inputs in
batches of 512, 2 threads. Timed in turn, median of `--rounds`: one forward pass of the model
over the inputs (eval mode), MC dropout-15 `member_logits` with the masks drawn as peg draws
them (`SampledDropout`: `rand >= p`), and the same with `nn.Dropout`'s own `bernoulli_` masks
(what MC dropout did before). The ratio to one forward is the figure (target ≤ 15.5 for 15
samples; the issue measured 24.8 in `peg.compare` on a CIFAR-10 CNN).

    python benchmarks/mc_dropout_speed.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time

import torch

import peg
from peg.methods import dropout
from peg.models.cnn import SmallCNN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="cpu: process time"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    extra = (f" --threads {args.threads}" if args.threads else "") + f" --clock {args.clock}"
    print(f"$ python benchmarks/mc_dropout_speed.py --rounds {args.rounds}{extra}")
    print(f"commit: {commit}")
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores (shared with "
        f"other jobs), torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )
    torch.manual_seed(0)
    model = SmallCNN(in_channels=3, dropout=0.2).eval()
    X = torch.randn(1024, 3, 32, 32)
    fast = peg.MCDropout(n_members=args.samples, progress=False).fit(model)
    plain = peg.MCDropout(n_members=args.samples, progress=False).fit(model)
    for name, m in list(plain.model_.named_modules()):
        if isinstance(m, dropout.SampledDropout):  # back to nn.Dropout's bernoulli_ masks
            plain.model_.set_submodule(name, torch.nn.Dropout(m.p))
    plain._prepare()

    def one() -> None:
        with torch.no_grad():
            for a in range(0, len(X), 512):
                model(X[a : a + 512])

    runs: dict[str, list[float]] = {"one forward": [], "MC dropout": [], "bernoulli_": []}
    calls = {"one forward": one, "MC dropout": lambda: fast.member_logits(X, 512)}
    calls["bernoulli_"] = lambda: plain.member_logits(X, 512)
    for f in calls.values():
        f()  # warm-up
    for _ in range(args.rounds):
        for k, f in calls.items():
            started = clock()
            f()
            runs[k].append(clock() - started)
    base = statistics.median(runs["one forward"])
    print(
        f"SmallCNN, {len(X)} inputs, batches of 512, MC dropout-{args.samples}; medians of "
        f"{args.rounds} rounds timed in turn"
    )
    for k in ("MC dropout", "bernoulli_"):
        ratio = statistics.median(runs[k]) / base
        label = "rand >= p masks (peg)" if k == "MC dropout" else "bernoulli_ masks (before)"
        print(f"  {label:<28} {ratio:6.2f} × one forward (target ≤ {args.samples + 0.5})")


if __name__ == "__main__":
    main()
