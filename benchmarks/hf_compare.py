"""`peg.compare` on real-size HuggingFace models: per-method fit seconds, forwards per input and
peak memory (issue 22, point 4). Not in CI: minutes per model on a CPU.

The models are built from the real configurations with random weights (the shapes and code
paths are what matter, not the accuracy): ViT-S/16 at 224 px (`ViTForImageClassification`,
22 M parameters, 1,000 classes, dropout 0.1 as ViT was trained), ResNet-50
(`ResNetForImageClassification`, 25.6 M, 1,000 classes; no dropout, so MC dropout is left out
as compare leaves it out) and BERT-base (`BertForSequenceClassification`, 110 M, 2 classes,
sequences of `--tokens` tokens). Each model runs in a fresh process (its peak RSS is its own).

The data are random inputs with random labels, and few of them (`--val`, `--test` points):
each method's costs depend on the shapes, not on the values. Tensor pairs, the model wrapped in
`peg.with_output(model, "logits")`, so that Laplace (laplace-torch takes tensors) runs on the
same data as every other method. The methods: compare's defaults plus Laplace, with the scales
of full PEG and PEP fixed (η = 1e-3, σ = 1e-3: a search costs ~10 × 15 members × the scoring
points, hours at this size on a shared CPU; last-layer PEG searches η, on the heads alone) and
PEG's mini-batches of `--grad-batch` points (the validation set is small); PEG and PEP with
`lazy="auto"` (compare holds every fitted predictor, and two eager 15-member ensembles of
BERT-base's 110 M parameters would hold 13 GB: lazy when they would not fit half the free memory).

Columns: fit seconds; `forwards` = FLOPs of predicting over the model's own FLOPs
(`peg.apps.compare.costs`, counted, not timed); `predict ×` = the method's test prediction
seconds over the model's (timed, in the same run: noisy on a shared machine); `held MB` = the
tensors the predictor keeps; the process's peak RSS at the end. Targets (issue 22): last-layer
PEG fit ≤ 1.5 × TS's, last-layer PEG prediction ≤ 1.2 forwards, PEG-15 and MC dropout-15
prediction ≤ 15.5 forwards.

    python benchmarks/hf_compare.py                      # the three models, ~1 hour on 2 busy cores
    python benchmarks/hf_compare.py --models vit-s16 --val 32 --test 8
    python benchmarks/hf_compare.py --models resnet50 --methods TS "Last-layer PEG"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import torch

MODELS = ("vit-s16", "resnet50", "bert-base")


def build(name: str, tokens: int) -> tuple[torch.nn.Module, callable]:
    """(model with random weights, inputs maker n -> tensor) for a model name."""
    import transformers

    torch.manual_seed(0)
    if name == "vit-s16":
        config = transformers.ViTConfig(
            image_size=224,
            patch_size=16,
            hidden_size=384,
            num_hidden_layers=12,
            num_attention_heads=6,
            intermediate_size=1536,
            hidden_dropout_prob=0.1,
            num_labels=1000,
        )
        model = transformers.ViTForImageClassification(config)
    elif name == "resnet50":
        config = transformers.ResNetConfig(
            embedding_size=64,
            hidden_sizes=[256, 512, 1024, 2048],
            depths=[3, 4, 6, 3],
            layer_type="bottleneck",
            num_labels=1000,
        )
        model = transformers.ResNetForImageClassification(config)
    else:
        model = transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=2))
    classes = model.config.num_labels

    def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        if name == "bert-base":
            x = torch.randint(1000, 30000, (n, tokens), generator=g)
        else:
            x = torch.randn(n, 3, 224, 224, generator=g)
        return x, torch.randint(0, classes, (n,), generator=g)

    return model.eval(), data


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(
    name: str, val: int, test: int, tokens: int, grad_batch: int, only: list[str] | None
) -> None:
    import peg
    from peg.apps.compare import method

    model, data = build(name, tokens)
    wrapped = peg.with_output(model, "logits")
    params = sum(p.numel() for p in model.parameters())
    methods = [
        "Model",
        "TS",
        # compare keeps every fitted predictor: lazy="auto" keeps PEP's and PEG's members as
        # rows (or regenerates them) when the stacked members would not fit half the free
        # memory (BERT-base: 15 eager members are 6.6 GB, their rows as much again)
        method("PEP", "pep", sigma=1e-3, lazy="auto"),
        method("PEG", "peg", eta=1e-3, grad_batch_size=grad_batch, lazy="auto"),
        method("PEG + TS", "temperature", on="PEG"),
        method("Last-layer PEG", "peg", params="last_layer", grad_batch_size=grad_batch),
        "Laplace",
    ]
    if name != "resnet50":  # ResNet-50 has no dropout layer: compare leaves MC dropout out
        methods.insert(5, "MC dropout")
    if only:
        methods = [m for m in methods if (m if isinstance(m, str) else m.name) in {"Model", *only}]
    before = _status("VmRSS")
    started = time.perf_counter()
    result = peg.compare(
        wrapped, data(val, 1), data(test, 2), methods, batch_size=8, say=None, progress=False
    )
    rows = []
    model_seconds = result.table[0]["predict_seconds"]
    for row in result.table:
        rows.append(
            {
                "method": row["method"],
                "fit_seconds": row["fit_seconds"],
                "forwards": row["forwards"],
                "predict_ratio": row["predict_seconds"] / model_seconds,
                "held_mb": row["memory_mb"],
            }
        )
    out = {
        "model": name,
        "params": params,
        "rows": rows,
        "peak_gb": _status("VmHWM") / 1e9,
        "grown_gb": (_status("VmHWM") - before) / 1e9,
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(out))


def report(r: dict, val: int, test: int, tokens: int) -> None:
    shape = f"{tokens} tokens" if r["model"] == "bert-base" else "3×224×224"
    print(
        f"\n{r['model']}: {r['params'] / 1e6:.1f} M parameters, inputs {shape}, {val} validation "
        f"and {test} test points; peak RSS {r['peak_gb']:.2f} GB (+{r['grown_gb']:.2f} GB over "
        f"compare), {r['seconds']:.0f} s in all"
    )
    print(f"{'method':<16} {'fit (s)':>8} {'forwards':>9} {'predict ×':>10} {'held MB':>9}")
    for row in r["rows"]:
        held = "-" if row["held_mb"] is None else f"{row['held_mb']:.0f}"
        fwd = "-" if row["forwards"] is None else f"{row['forwards']:.2f}"
        print(
            f"{row['method']:<16} {row['fit_seconds']:>8.1f} {fwd:>9} "
            f"{row['predict_ratio']:>10.2f} {held:>9}"
        )
    by = {row["method"]: row for row in r["rows"]}
    checks = []
    if "Last-layer PEG" in by:
        ll, ts = by["Last-layer PEG"], by["TS"]
        checks.append(("last-layer PEG fit / TS fit", ll["fit_seconds"] / ts["fit_seconds"], 1.5))
        checks.append(("last-layer PEG forwards", ll["forwards"], 1.2))
    for name in ("PEG", "MC dropout"):
        if name in by:
            checks.append((f"{name}-15 forwards", by[name]["forwards"], 15.5))
            checks.append((f"{name}-15 predict × (timed)", by[name]["predict_ratio"], 15.5))
    for what, value, target in checks:
        verdict = "met" if value <= target else f"MISSED by {value / target:.2f}×"
        print(f"  {what}: {value:.2f} (target ≤ {target}): {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--val", type=int, default=32)
    parser.add_argument("--test", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--grad-batch", type=int, default=8)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="only these rows (and Model), e.g. TS 'Last-layer PEG'",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.val, args.test, args.tokens, args.grad_batch, args.methods)
        return
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"$ python benchmarks/hf_compare.py {shlex.join(sys.argv[1:])}".rstrip())
    print(f"commit: {commit}")
    print(
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores (shared with "
        f"other jobs), torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )
    for name in args.models:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                *("--child", name, "--val", str(args.val), "--test", str(args.test)),
                *("--tokens", str(args.tokens), "--grad-batch", str(args.grad_batch)),
                *(("--methods", *args.methods) if args.methods else ()),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            print(f"\n{name}: failed\n{out.stderr[-2000:]}", flush=True)
            continue
        report(json.loads(out.stdout.strip().splitlines()[-1]), args.val, args.test, args.tokens)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
