"""Lazy PEG members at the cost of eager ones: prediction of a lazy PEG against the stacked one.

Target (issue 22): `PEG(lazy=True)` predicts in at most 1.15 × the time of the eager (stacked)
ensemble on ViT-S/16 at 224 px, PEG-5. A lazy ensemble keeps the members' direction rows
(`lazy_store="full"`, the default: the eager members bit for bit; "bfloat16" / "float16": half
that memory) and builds the members a chunk at a time at every call; `"regenerate"` keeps no row
and recomputes the S gradients at every call (the only lazy mode before issue 22, shown for
contrast). Also printed: the bytes each holds after `fit` beside the base weights.

Models: transformers' `ViTForImageClassification` from configurations (random weights, nothing
from a hub): ViT-S/16 (hidden 384, 12 layers, 6 heads, 224 px, 22 M parameters) and ViT-Ti/16
(hidden 192, 3 heads, 5.7 M), 10 classes; PEG-5 with η given, K = `--grad-batch` images of the
validation set; one test batch of `--batch` images. Times are medians of round-robin rounds
(every variant timed in turn in each round, after a warm-up call; "regenerate", which
recomputes the gradients, once after them); every number is a ratio measured in this run, on
this machine (printed), with the largest difference of each one's logits from the eager ones.
"CPU × eager" is the process's CPU time (user + system) of one more call, against the eager
call's: what the call costs whatever the other jobs on a shared machine do to wall time.

    python benchmarks/lazy_members.py [--batch 16] [--repeats 5] [--model NAME] [--quick]
"""

from __future__ import annotations

import argparse
import resource
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _timing import median_time, round_robin

import peg
from peg.utils.env import machine

CONFIGS = {
    "ViT-Ti/16": {"hidden_size": 192, "num_attention_heads": 3, "intermediate_size": 768},
    "ViT-S/16": {"hidden_size": 384, "num_attention_heads": 6, "intermediate_size": 1536},
}


def _held(fitted: peg.PEG) -> int:
    """Bytes of the rows and stacked members a fitted PEG holds (not its base weights)."""
    members = fitted.members_
    if hasattr(members, "directions"):
        rows = sum(D.numel() * D.element_size() for D in members.directions)
        stacked = fitted.ensemble_.stacked.values()
        return rows + sum(t.numel() * t.element_size() for t in stacked)
    stored = members.stored or []
    return sum(s.data.numel() * s.data.element_size() for s in stored if s.data is not None)


def _cpu_seconds(run: Callable[[], Any]) -> float:
    """CPU seconds (user + system) of this process for one `run()`: what the call costs,
    whatever else the shared machine runs (wall time grows with the other jobs' load)."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    run()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(name: str, S: int, B: int, K: int, repeats: int) -> None:
    import transformers  # peg[hf]

    torch.manual_seed(0)
    config = transformers.ViTConfig(
        num_hidden_layers=12, image_size=224, patch_size=16, num_labels=10, **CONFIGS[name]
    )
    model = transformers.ViTForImageClassification(config).eval()
    n_params = sum(p.numel() for p in model.parameters())
    X_val, y_val = torch.randn(4 * K, 3, 224, 224), torch.randint(0, 10, (4 * K,))
    X = torch.randn(B, 3, 224, 224)
    options = {"n_members": S, "grad_batch_size": K, "eta": 1e-3, "progress": False}
    eager = peg.PEG(**options).fit(model, (X_val, y_val))
    stores = ["full", "bfloat16", "float16", "regenerate"]
    lazy = {
        s: peg.PEG(lazy=True, lazy_store=s, **options).fit(model, (X_val, y_val)) for s in stores
    }
    want = eager.member_logits(X, B)
    runs = {"base model, one forward": lambda: model(X).logits}
    runs[f"eager PEG-{S} (stacked)"] = lambda: eager.member_logits(X, B)
    for store, fitted in lazy.items():
        runs[f"lazy PEG-{S}, lazy_store={store!r}"] = lambda f=fitted: f.member_logits(X, B)
    slow = {k: runs.pop(k) for k in list(runs) if k.endswith("'regenerate'")}
    with torch.no_grad():
        times = {k: statistics.median(v) for k, v in round_robin(runs, repeats, 0.0).items()}
        for k, f in slow.items():  # once: it recomputes the gradients at every call
            times[k] = median_time(f, 1)[0]
        cpu = {k: _cpu_seconds(f) for k, f in {**runs, **slow}.items()}
    forward, stacked = times["base model, one forward"], times[f"eager PEG-{S} (stacked)"]
    print(
        f"\n{name} ({n_params / 1e6:.1f} M parameters), PEG-{S}, one batch of {B} images at 224 px"
    )
    print(
        f"  {'':44s} {'× forward':>10s} {'× eager':>9s} {'CPU × eager':>12s} {'held (MiB)':>11s}"
        f" {'max |Δ logit|':>14s}"
    )
    for label, t in times.items():
        fitted = eager if label.startswith("eager") else None
        for store, f in lazy.items():
            fitted = f if label.endswith(f"{store!r}") else fitted
        held = f"{_held(fitted) / 2**20:11.0f}" if fitted is not None else f"{'':11s}"
        diff = ""
        if fitted is not None:
            diff = f"{(fitted.member_logits(X, B) - want).abs().max().item():14.2e}"
        ratio = cpu[label] / cpu[f"eager PEG-{S} (stacked)"]
        print(f"  {label:44s} {t / forward:10.2f} {t / stacked:9.2f} {ratio:12.2f} {held} {diff}")
    print(f"  (one forward: {forward * 1e3:.0f} ms; base weights {n_params * 4 / 2**20:.0f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16, help="test images")
    parser.add_argument("--grad-batch", type=int, default=8, help="K, images per gradient")
    parser.add_argument("--repeats", type=int, default=5, help="round-robin rounds")
    parser.add_argument("--quick", action="store_true", help="ViT-Ti only, batch 4, 1 repeat")
    parser.add_argument("--model", choices=list(CONFIGS), help="this one only")
    args = parser.parse_args()
    print(f"machine: {machine()}; torch threads: {torch.get_num_threads()}")
    S, K = args.members, args.grad_batch
    if args.quick:
        run("ViT-Ti/16", S, 4, K, 1)
        return
    for name in [args.model] if args.model else CONFIGS:
        run(name, S, args.batch, K, args.repeats)


if __name__ == "__main__":
    main()
