"""What `Ensemble.member_logits` costs per call besides the members' forwards (issue 38).

A 4-4-2 MLP, 8 members, 8 rows, one thread: the forwards are so small that peg's own per-call
work shows. `member_logits(strategy="loop")` against a bare loop over the same ensemble's
member modules (`torch.stack([m(x) for m in modules])` under `inference_mode`), timed in turn;
the median of the paired differences. Run it on two libraries back to back to compare them:

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/member_logits_overhead.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from peg.ensemble import Ensemble
from peg.utils.env import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)) for _ in range(8)]
    ens = Ensemble.from_models(members)
    x = torch.randn(8, 4)
    for _ in range(30):  # past the loop's first batches: the member modules are built
        ens.member_logits(x, 8, strategy="loop")
    modules = ens._member_modules()
    assert modules is not None

    def bare() -> torch.Tensor:
        with torch.inference_mode():
            return torch.stack([m(x) for m in modules])

    def peg() -> torch.Tensor:
        return ens.member_logits(x, 8, strategy="loop")

    seconds: dict[str, list[float]] = {"bare": [], "peg": []}
    for _ in range(args.calls):
        for name, run in (("bare", bare), ("peg", peg)):
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    b, p = (statistics.median(seconds[k]) * 1e6 for k in ("bare", "peg"))
    paired = statistics.median(a - c for a, c in zip(seconds["peg"], seconds["bare"], strict=True))
    print(machine())
    print(f"bare loop over the member modules {b:.1f} us; member_logits(strategy='loop') "
          f"{p:.1f} us; median paired overhead {paired * 1e6:.1f} us")  # fmt: skip


if __name__ == "__main__":
    main()
