"""Ensemble inference against a plain Python loop over S separate modules (issue 15, part 3).

Baseline: S deep copies of the model in eval mode, `torch.stack([m(x) for m in copies])`,
under `torch.no_grad()` and under `torch.inference_mode()` (the faster of the two counts).
peg: an `Ensemble` of the same member weights, `member_logits(x, batch_size=len(x))` with the
default strategy ("auto"; the column `auto` says what it chose). Every run is timed in turn
(round robin), the median kept. Targets: loop / peg >= 1.0 everywhere, and at batch 512
peg / (S × one member's forward) <= 1.10. Models: a CNN (conv 3→32→64, BatchNorm; `SmallCNN`
on 32×32), an MLP 64-256-256-10 and ResNet-20 (32×32), S = 8 and 15, batch 1, 8, 64, 512.
With `--torch-uncertainty DIR` (`pip install --no-deps --target DIR torch-uncertainty`; its
`methods/deep_ensembles.py` is loaded from its file, without the package's heavy imports) also
torch-uncertainty's `deep_ensembles` wrapper over the same copies, under `no_grad`, and the
column tu/peg (issue 38: >= 1.0 for the CNN and the MLP at batch 8 and 512). With `--before DIR`
(DIR holds another library's `peg/`, e.g. `git archive <commit> src | tar -x -C /tmp/b`, DIR
/tmp/b/src) that library's `Ensemble` too, in the same rounds: columns before and tu/before.
`--clock cpu` (with `--threads 1`) times the main thread's CPU seconds: on a machine other jobs
load, the time a run spends preempted is not counted. `--shuffle`: each round in another order.

    python benchmarks/ensemble_vs_loop.py [--threads 2] [--repeats 5] [--budget 1.5] [--quick]
                                          [--models CNN MLP ResNet-20] [--batches 8 512]
                                          [--members 8 15]
                                          [--torch-uncertainty DIR] [--before DIR]
                                          [--clock {wall,cpu}] [--shuffle]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _timing import round_robin
from torch import nn

from peg.ensemble import Ensemble
from peg.models import build
from peg.utils.env import git_commit, machine

BATCHES = (1, 8, 64, 512)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "CNN": (lambda: build("small-cnn", in_channels=3, num_classes=10, width=32), (3, 32, 32)),
    "MLP": (lambda: build("mlp", in_features=64, num_classes=10, hidden=(256, 256)), (64,)),
    "ResNet-20": (lambda: build("resnet20", in_channels=3, num_classes=10), (3, 32, 32)),
}


def _time(
    runs: dict[str, Callable[[], object]], repeats: int, budget: float, clock: str, shuffle: bool
) -> dict:
    """Seconds of each `run()` per round (`_timing.round_robin`). `clock="cpu"`: the calling
    thread's CPU seconds instead of wall seconds (with one torch thread all the work is on it):
    on a machine other jobs load, time spent preempted is not counted. `shuffle`: each round
    runs them in another order (seeded), so that no run always follows the same one (the run
    before leaves the caches and the allocator's heap to the next)."""
    if clock == "wall" and not shuffle:
        return round_robin(runs, repeats, budget)
    now = time.thread_time if clock == "cpu" else time.perf_counter
    order, rng = list(runs), random.Random(0)
    seconds: dict[str, list[float]] = {name: [] for name in runs}

    def slot(i: int) -> Callable[[], None]:
        def call() -> None:
            if i == 0 and shuffle:
                rng.shuffle(order)
            start = now()
            runs[order[i]]()
            seconds[order[i]].append(now() - start)

        return call

    round_robin({str(i): slot(i) for i in range(len(order))}, repeats, budget)
    return {name: v[1:] for name, v in seconds.items()}  # [0]: the warm-up call


def _ratio(num: list[float], den: list[float], scale: float = 1.0) -> float:
    """Median over rounds of num / (scale · den), each round's two timings taken side by side."""
    return statistics.median(a / (scale * b) for a, b in zip(num, den, strict=True))


def _members(model: nn.Module, S: int) -> list[dict[str, torch.Tensor]]:
    """S state dicts: the model's floating-point entries perturbed per member (seeded)."""
    states = []
    for i in range(S):
        torch.manual_seed(i)
        states.append({k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
                       for k, v in model.state_dict().items()})  # fmt: skip
    return states


def deep_ensembles(path: str | None) -> Callable[[list[nn.Module]], nn.Module] | None:
    """torch-uncertainty's `deep_ensembles` from its file under `path` (None: not asked for)."""
    if path is None:
        return None
    file = Path(path) / "torch_uncertainty" / "methods" / "deep_ensembles.py"
    spec = importlib.util.spec_from_file_location("tu_deep_ensembles", file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--torch-uncertainty: no {file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.deep_ensembles


def ensemble_class(path: str | None) -> type | None:
    """`Ensemble` of the library under `path` (None: not asked for), imported while `peg` names
    that library; this process's own `peg` modules are put back after (the old classes keep
    their own modules' globals)."""
    if path is None:
        return None
    ours = {k: m for k, m in sys.modules.items() if k == "peg" or k.startswith("peg.")}
    for k in ours:
        del sys.modules[k]
    sys.path.insert(0, path)
    try:
        cls = importlib.import_module("peg.ensemble").Ensemble
        if not Path(sys.modules["peg"].__file__ or "").is_relative_to(Path(path).resolve()):
            raise SystemExit(f"--before: no peg package under {path}")
    finally:
        sys.path.remove(path)
        for k in [k for k in sys.modules if k == "peg" or k.startswith("peg.")]:
            del sys.modules[k]
        sys.modules.update(ours)
    return cls


def _row(name: str, model: nn.Module, S: int, x: torch.Tensor, args: argparse.Namespace) -> str:
    """Time the loop, its inference-mode twin, peg and one forward on `x`; one table row."""
    states = _members(model, S)
    copies = [copy.deepcopy(model) for _ in states]
    for m, state in zip(copies, states, strict=True):
        m.load_state_dict(state)
        m.eval()
    ens = Ensemble.from_state_dicts(model, states)

    def loop() -> object:
        with torch.no_grad():
            return torch.stack([m(x) for m in copies])

    def loop_inference() -> object:
        with torch.inference_mode():
            return torch.stack([m(x) for m in copies])

    def one() -> object:
        with torch.no_grad():
            return copies[0](x)

    def peg() -> object:
        return ens.member_logits(x, len(x))

    runs: dict[str, Callable[[], Any]] = {"no_grad": loop, "inference": loop_inference, "peg": peg}
    if args.wrapper is not None:
        wrapped = args.wrapper(copies).eval()

        def tu() -> object:
            with torch.no_grad():
                return wrapped(x)

        runs["tu"] = tu
    if args.before is not None:
        old = args.before.from_state_dicts(model, states)

        def before() -> object:
            return old.member_logits(x, len(x))

        runs["before"] = before
    if len(x) >= BATCHES[-1]:
        runs["one"] = one
    repeats = 3 if len(x) >= 512 and name == "ResNet-20" else args.repeats  # seconds per call
    samples = _time(runs, repeats, args.budget, args.clock, args.shuffle)
    t = {k: statistics.median(v) for k, v in samples.items()}
    base = samples[min(("no_grad", "inference"), key=t.__getitem__)]  # the faster loop
    chosen = ens._choose(x, None)  # what "auto" ran
    bound = f"{_ratio(samples['peg'], samples['one'], S):9.2f}" if "one" in t else f"{'':9}"
    tu = f" {t['tu'] * 1e3:9.2f} {_ratio(samples['tu'], samples['peg']):7.3f}" if "tu" in t else ""
    if "before" in t:
        tu += f" {t['before'] * 1e3:9.2f}" + (
            f" {_ratio(samples['tu'], samples['before']):9.3f}" if "tu" in t else ""
        )
    return (
        f"{name:9} {S:3d} {len(x):5d} {t['no_grad'] * 1e3:9.2f} {t['inference'] * 1e3:9.2f} "
        f"{t['peg'] * 1e3:9.2f} {chosen:>7} {_ratio(base, samples['peg']):10.3f} {bound}{tu}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds at least")
    parser.add_argument("--budget", type=float, default=1.5, help="seconds per row, about")
    parser.add_argument("--quick", action="store_true", help="S = 8, batches 1 and 8 only")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    parser.add_argument("--members", nargs="+", type=int, default=[8, 15], help="S values")
    parser.add_argument("--torch-uncertainty", default=None, metavar="DIR")
    parser.add_argument("--before", default=None, metavar="DIR", help="another library's peg")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the main thread's CPU time (with --threads 1; loaded machines)",
    )
    parser.add_argument("--shuffle", action="store_true", help="each round in another order")
    args = parser.parse_args()
    args.wrapper = deep_ensembles(args.torch_uncertainty)
    args.before = ensemble_class(args.before)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu: times the main thread only; use it with --threads 1")
    torch.set_num_threads(args.threads)
    print(f"$ python {shlex.join(['benchmarks/ensemble_vs_loop.py', *sys.argv[1:]])}")
    print(f"commit: {git_commit()}")
    print(f"machine: {machine()}; median of >= {args.repeats} round-robin rounds "
          "(3 for ResNet-20 at 512)")  # fmt: skip
    cpu = " (CPU time of the main thread)" if args.clock == "cpu" else ""
    print(f"clock: {args.clock}{cpu}; order: {'shuffled per round' if args.shuffle else 'fixed'}")
    print("ms per call; loop = torch.stack([m(x) for m in S deep copies]) under no_grad / "
          "inference_mode; peg = Ensemble.member_logits(x, len(x)), strategy 'auto' (what it "
          "chose); loop/peg = the faster loop ÷ peg (>= 1.0: peg at least as fast); "
          "peg/(S·1) = peg ÷ (S × one member's forward), batch 512; ratios: the median of the "
          "rounds' own ratios")  # fmt: skip
    print(f"{'model':9} {'S':>3} {'batch':>5} {'no_grad':>9} {'inference':>9} {'peg':>9} "
          f"{'auto':>7} {'loop/peg':>10} {'peg/(S·1)':>9}"
          + (f" {'tu':>9} {'tu/peg':>7}" if args.wrapper else "")
          + (f" {'before':>9}" if args.before else "")
          + (f" {'tu/before':>9}" if args.before and args.wrapper else ""))  # fmt: skip
    for name in args.models:
        make, shape = MODELS[name]
        for S in (8,) if args.quick else args.members:
            for batch in BATCHES[:2] if args.quick else args.batches:
                torch.manual_seed(0)
                model = make().eval()
                print(_row(name, model, S, torch.randn(batch, *shape), args), flush=True)


if __name__ == "__main__":
    main()
