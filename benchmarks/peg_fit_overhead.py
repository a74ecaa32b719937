"""PEG-15's fit over temperature scaling's where the forwards are cheap and peg's own work shows
(issue 30): a small transformers ResNet (`benchmarks/gpu.py --quick`'s, 10 classes) on 512
validation images at 32 px, one thread. On a GPU the forwards are cheap too, so what this
measures is what PEG-15 spends besides them: a profile of PEG-15 on ResNet-50 on an H200 found
2.5 of its 11.9 s in building member modules (`_strategies._member_modules`), which the loop
now builds only for an ensemble used on many batches (`LOOP_MODULES_AFTER`).

Issue 38 adds PEP-15 (target: no slower than PEG-15), K-FAC and diagonal PEG-15 (target
<= 10 x TS; PEG-15 <= 5 x TS) and `--model fashion-mnist`: the library's SmallCNN (width 32)
trained one epoch (Adam) on 10,000 Fashion-MNIST training images (cached under .peg-cache/),
fitted on `--n` (e.g. 2000) test images. `--fewer-points` adds the default search with its exact
scorings on 512 and 256 points instead of 1024 (`ScaleSearch(exact_points=...)`) for PEG-15 and
PEP-15, and on 512 for K-FAC / diagonal PEG-15, in the same run (issue 38; its transcripts name
the flag `--before`, when the default was 256, then 512, and the extra rows 1024 and the other).

    OMP_NUM_THREADS=1 python benchmarks/peg_fit_overhead.py            # ratios in one run
    OMP_NUM_THREADS=1 python benchmarks/peg_fit_overhead.py --rounds 5
    OMP_NUM_THREADS=1 python benchmarks/peg_fit_overhead.py --model fashion-mnist --n 2000
    OMP_NUM_THREADS=1 python benchmarks/peg_fit_overhead.py --model fashion-mnist --fewer-points

Issue 49 (points by need: the default search scores 384 held-out points, more only while its
two scales are undecided, at most 2 scales): `--model demo` is the over-fitted `peg demo`
Fashion-MNIST base of benchmarks/scale_search.py, fitted on `--n` of its validation split;
`--issue-38` adds every PEG/PEP row with the search before it (`ScaleSearch(exact_points=1024,
first_points=1024, scorings=3)`: up to 3 scorings of 1,024 points) in the same run. Targets
(2,000 validation points, one thread, the median over the Fashion-MNIST CNN and the demo base):
PEG-15 <= 5 x TS (worst base <= 8 x), K-FAC and diagonal PEG-15 <= 10 x, PEP-15 <= PEG-15.

    OMP_NUM_THREADS=1 python benchmarks/peg_fit_overhead.py --model demo --n 2000 --issue-38
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import peg
from peg.runtime import strategies as _strategies
from peg.utils.env import machine

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bases
from _bases import fashion_mnist
from gpu import build


def demo(n: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The over-fitted `peg demo` base (`_bases.demo`, cached) and `n` points of its validation
    split."""
    case = _bases.demo()
    return case.base, (case.val[0][:n], case.val[1][:n])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one round, 256 images")
    parser.add_argument("--model", choices=("resnet", "fashion-mnist", "demo"), default="resnet")
    parser.add_argument("--no-variants", action="store_true", help="TS, PEG-15 and PEP-15 only")
    parser.add_argument("--fewer-points", action="store_true", help="exact_points 512 and 256")
    parser.add_argument("--no-batch0", action="store_true", help="leave out the batch-0 row")
    parser.add_argument(
        "--issue-38", action="store_true", help="the PEG/PEP rows with issue 38's search too"
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time each fit by this process's CPU time (time.process_time), not wall time: on a "
        "machine shared with other jobs, one thread's CPU seconds move far less than its wall "
        "seconds",
    )
    parser.add_argument(
        "--channels-last",
        action="store_true",
        help="the model channels-last (model.to(memory_format=torch.channels_last)), as PyTorch "
        "advises for CNNs: peg's members take its layout (Ensemble._hold)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.n = 1, 256
    torch.set_num_threads(1)
    if args.model == "fashion-mnist":
        model, val = fashion_mnist(args.n)
    elif args.model == "demo":
        model, val = demo(args.n)
    else:
        model = build("resnet50", 32, True, 10)
        g = torch.Generator().manual_seed(0)
        images = torch.randn(args.n, 3, 32, 32, generator=g)
        val = (images, torch.randint(0, 10, (args.n,), generator=g))
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    after = _strategies.LOOP_MODULES_AFTER
    quiet = {"n_members": 15, "seed": 0, "progress": False}

    def fit(made: type, **options: object) -> Callable[[], object]:
        return lambda: made(**quiet, **options).fit(model, val)

    fits: dict[str, tuple[type, dict[str, object]]] = {
        "PEG-15": (peg.PEG, {}),
        "PEP-15": (peg.PEP, {}),
    }
    if not args.no_variants:
        fits["PEG-15 K-FAC"] = (peg.PEG, {"precondition": "kfac"})
        fits["PEG-15 diag"] = (peg.PEG, {"precondition": "diag"})
    runs: dict[str, Callable[[], object]] = {"TS": lambda: peg.TemperatureScaling().fit(model, val)}
    runs.update({name: fit(made, **options) for name, (made, options) in fits.items()})
    if not args.no_variants and not args.no_batch0:
        runs["PEG-15, modules from batch 0"] = fit(peg.PEG)
    if args.issue_38:
        before = peg.ScaleSearch(exact_points=1024, first_points=1024, scorings=3)
        for name, (made, options) in fits.items():
            runs[f"{name}, issue 38's search"] = fit(made, **options, search=before)
    if args.fewer_points:
        for points in (512, 256):
            search = peg.ScaleSearch(exact_points=points)
            runs[f"PEG-15, exact_points={points}"] = fit(peg.PEG, search=search)
            runs[f"PEP-15, exact_points={points}"] = fit(peg.PEP, search=search)
        if not args.no_variants:
            fewer = peg.ScaleSearch(exact_points=512)
            for variant in ("kfac", "diag"):
                runs[f"PEG-15 {variant}, exact_points=512"] = fit(
                    peg.PEG, precondition=variant, search=fewer
                )
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for name, run in runs.items():  # warm: the first call pays set-up
        _strategies.LOOP_MODULES_AFTER = 0 if "batch 0" in name else after
        run()
    for _ in range(args.rounds):  # round robin: a slow spell touches every run of a round alike
        for name, run in runs.items():
            _strategies.LOOP_MODULES_AFTER = 0 if "batch 0" in name else after
            clock = time.process_time if args.cpu_time else time.perf_counter
            start = clock()
            run()
            seconds[name].append(clock() - start)
    _strategies.LOOP_MODULES_AFTER = after
    command = shlex.join(["benchmarks/peg_fit_overhead.py", *(argv or sys.argv[1:])])
    print(f"$ OMP_NUM_THREADS=1 python {command}")
    print(machine())
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (the 2 cores shared with others)")
    ts = statistics.median(seconds["TS"])
    for name, values in seconds.items():
        median = statistics.median(values)
        unit = "CPU s" if args.cpu_time else "s"
        print(f"{name}: {median:.3f} {unit} (median of {args.rounds}) = {median / ts:.1f} x TS")


if __name__ == "__main__":
    main()
