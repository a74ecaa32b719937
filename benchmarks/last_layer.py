"""Last-layer PEG, nearly free: prediction and creation against one forward of the base model.

Targets (issue 14): last-layer PEG-15 (`params="last_layer"`) of ResNet-20 predicts a batch of
256 in at most 1.3 × one forward of the base model (the trunk runs once per batch, only the 15
heads per member: `peg.runtime.heads`), where 15 members of the whole network take ~15 ×; creating
it with η searched costs a small multiple of one forward pass over the validation set (the 15
gradients need a forward of K rows each; the search computes the trunk's features of the
scoring points once and scores every η on the heads alone). Also shown: the same members
without the trunk/head split (every member's whole forward, as before issue 14) and the archive
sizes (members: base + S·head; recipe: the base).

Set-up: ResNet-20 (random weights: the costs do not depend on them), CIFAR-shaped synthetic
validation data (`--val` images; labels the base's predictions, a quarter of them replaced at
random). Then a transformers model, `BertForSequenceClassification` from a small config (4
layers, width 128, sequences of 64 tokens; random weights, nothing from a hub), predicting
HuggingFace dict batches (`input_ids`, `attention_mask`): its last-layer PEG-15 is fitted with η
given (0.1) on token tensors, and only prediction is timed. Every number is a ratio measured in
this run, on this machine (printed).

    python benchmarks/last_layer.py [--members 15] [--val 2000] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

import peg
from peg.models import build
from peg.runtime import heads as _heads
from peg.utils.env import machine


def _time(run: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of `repeats` calls (after one warm-up call), and the last result."""
    out = run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), out


def _round_robin(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each `run()` over `repeats` rounds, timed in turn after a warm-up
    round (a slow spell of the machine touches every run alike)."""
    for run in runs.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=15)
    parser.add_argument("--val", type=int, default=2000, help="validation images")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="500 images, 1 repeat")
    args = parser.parse_args()
    n_val, repeats = (500, 1) if args.quick else (args.val, args.repeats)
    S, B = args.members, args.batch
    print(f"machine: {machine()}; torch threads: {torch.get_num_threads()}; median of {repeats}")
    torch.manual_seed(0)
    model = build("resnet20", in_channels=3, num_classes=10).eval()
    X = torch.randn(n_val, 3, 32, 32)
    with torch.no_grad():
        y = torch.cat([model(x).argmax(-1) for x in X.split(B)])
    noisy = torch.rand(n_val) < 0.25
    y[noisy] = torch.randint(0, 10, (int(noisy.sum()),))
    batch = X[:B]

    # ---------------------------------------------------------------- creation
    with torch.no_grad():
        forward_val, _ = _time(lambda: torch.cat([model(x) for x in X.split(B)]), repeats)

    def create() -> peg.PEG:
        return peg.PEG(n_members=S, params="last_layer", progress=False, batch_size=B).fit(
            model, (X, y)
        )

    created, fitted = _time(create, repeats)
    print(f"\nResNet-20, last-layer PEG-{S} ({fitted.param_names_}), {n_val} validation images")
    print(f"  one forward pass over the validation set: {forward_val:.2f} s")
    print(
        f"  PEG-{S} creation, η searched ({len(fitted.search_)} η scored, η = "
        f"{fitted.eta_:.3g}): {created:.2f} s = {created / forward_val:.2f} × that forward pass"
    )

    # ---------------------------------------------------------------- prediction
    ensemble = fitted.ensemble_
    print(f"\nprediction of one batch of {B} (ratio to one forward of the base model)")
    runs: dict[str, Callable[[], Any]] = {"base model, one forward": lambda: model(batch)}
    for strategy in ("auto", "folded", "loop"):
        label = f"last-layer PEG-{S}, {strategy} (trunk once, {S} heads)"
        runs[label] = lambda s=strategy: ensemble.member_logits(batch, B, strategy=s)
    with torch.no_grad():
        times = _round_robin(runs, repeats if args.quick else max(7, repeats))
        saved = _heads.candidates
        _heads.candidates = lambda *_: []  # no split: every member's whole forward
        _heads._SPLITS.clear()
        try:
            whole = peg.Ensemble(ensemble.skeleton, ensemble.stacked, ensemble.shared)
            runs = {"base model, one forward": runs["base model, one forward"]}
            for strategy in ("auto", "folded"):
                label = f"last-layer PEG-{S}, {strategy}, no split (as before)"
                runs[label] = lambda s=strategy: whole.member_logits(batch, B, strategy=s)
            before = _round_robin(runs, 1)  # its own base time: the ratio within its rounds
        finally:
            _heads.candidates = saved
            _heads._SPLITS.clear()
    base = times["base model, one forward"]
    rows = [(label, t / base) for label, t in times.items()]
    rows += [
        (label, t / before["base model, one forward"])
        for label, t in before.items()
        if label.startswith("last")
    ]
    for label, ratio in rows:
        print(f"  {label:<52} {ratio:6.2f} ×")
    print(f"  (one forward of the base model: {1000 * base:.0f} ms)")

    # ---------------------------------------------------------------- archives
    def size(nbytes: float) -> str:
        return f"{nbytes / 2**20:.2f} MiB"

    weights = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    head = sum(v.numel() * v.element_size() for v in model.head.state_dict().values())
    with tempfile.TemporaryDirectory() as tmp:
        members = os.path.getsize(fitted.save(os.path.join(tmp, "m.peg"), materialize=True))
        recipe = os.path.getsize(fitted.save(os.path.join(tmp, "r.peg")))
    print(f"\narchives: base weights {size(weights)}, head {head / 1024:.1f} KiB")
    print(f"  members (materialize=True): {size(members)} (base + {S}·head = "
          f"{size(weights + (S - 1) * head)})")  # fmt: skip
    print(f"  recipe: {size(recipe)}")
    _bert(S, B, repeats if args.quick else max(7, repeats))


def _bert(S: int, B: int, repeats: int) -> None:
    """Last-layer PEG-S of a BERT classifier: prediction of one dict batch of B sequences."""
    import transformers  # peg[hf]

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=512, max_position_embeddings=64, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(1, 1000, (512, 64))
    labels = torch.randint(0, 2, (512,))
    fitted = peg.PEG(n_members=S, params="last_layer", eta=0.1, progress=False).fit(
        model, (ids, labels)
    )
    batch = {"input_ids": ids[:B], "attention_mask": torch.ones(B, 64, dtype=torch.long)}
    ensemble = fitted.ensemble_
    runs: dict[str, Callable[[], Any]] = {
        "base model, one forward": lambda: model(**batch).logits,
        f"last-layer PEG-{S}, auto (trunk once, {S} heads)": lambda: ensemble.member_logits(
            batch, B
        ),
    }
    with torch.no_grad():
        times = _round_robin(runs, repeats)
    base = times["base model, one forward"]
    size = sum(p.numel() for p in model.parameters())
    print(f"\nBERT classifier ({size:,} parameters), last-layer PEG-{S} "
          f"({fitted.param_names_}): one dict batch of {B} × 64 tokens")  # fmt: skip
    for label, t in times.items():
        print(f"  {label:<52} {t / base:6.2f} ×")
    print(f"  (one forward of the base model: {1000 * base:.0f} ms)")


if __name__ == "__main__":
    main()
