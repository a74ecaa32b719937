"""peg on a GPU (issue 30): what each post-hoc method costs to fit, in units of temperature
scaling's fit, and what PEG-15 costs to predict, in units of the model's forward, on ResNet-50
and ViT-B/16 at 224 px with 1,000 classes. Not in CI (no GPU there): run by hand on the GPU
machine, transcript to results/benchmarks/.

The models are transformers' `ResNetForImageClassification` (ResNet-50's configuration, 25.6 M
parameters) and `ViTForImageClassification` (ViT-B/16, 86.6 M) with random weights, wrapped in
`peg.with_output(model, "logits")`; the data are random images with random labels (`--n`
validation and as many test images): costs depend on the shapes, not on the values. The data
are held on the CPU (what a DataLoader yields) or on the GPU (`--data`), every method fitted on
the same data in one process, each ratio taken in this run. Targets (issue 30, one H100, data on
the GPU): PEG-15 fit ≤ 5 × TS's; last-layer PEG ≤ 1.5 × TS; TS ≤ torch-uncertainty's
`TemperatureScaler` (both warm: each fitted once before it is timed); AutoSelect with its
default candidates, 5 folds, ≤ 60 s; PEG-15 prediction ≈ 15 forwards.

    python benchmarks/gpu.py                                   # both models, data on CPU and GPU
    python benchmarks/gpu.py --models resnet50 --data gpu --out results/benchmarks/gpu.txt
    python benchmarks/gpu.py --quick --device cpu              # a smoke run: tiny shapes, CPU
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import peg
from peg.utils.env import machine


def build(name: str, size: int, quick: bool, classes: int) -> torch.nn.Module:
    """A model of the named architecture with random weights (tiny layers with `quick`)."""
    import transformers

    torch.manual_seed(0)
    if name == "resnet50":
        widths, depths = ([16, 32], [1, 1]) if quick else ([256, 512, 1024, 2048], [3, 4, 6, 3])
        config = transformers.ResNetConfig(
            embedding_size=16 if quick else 64, hidden_sizes=widths, depths=depths,
            layer_type="basic" if quick else "bottleneck", num_labels=classes,
        )  # fmt: skip
        model = transformers.ResNetForImageClassification(config)
    else:
        config = transformers.ViTConfig(
            image_size=size, patch_size=16 if not quick else 8,
            hidden_size=32 if quick else 768, num_hidden_layers=1 if quick else 12,
            num_attention_heads=2 if quick else 12, intermediate_size=64 if quick else 3072,
            num_labels=classes,
        )  # fmt: skip
        model = transformers.ViTForImageClassification(config)
    return peg.with_output(model.eval(), "logits")


def timed(device: torch.device, run: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds of `run()` (the GPU synchronised before and after), and its result."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = run()
    sync()
    return time.perf_counter() - start, out


def uncertainty_ts(model: torch.nn.Module, val: tuple) -> Callable[[], Any] | None:
    """torch-uncertainty's `TemperatureScaler` fitted on the same model and data, if installed."""
    try:
        from torch.utils.data import DataLoader, TensorDataset
        from torch_uncertainty.post_processing import TemperatureScaler
    except ImportError:
        return None
    loader = DataLoader(TensorDataset(*val), batch_size=256)
    device = next(model.parameters()).device  # its temperature stays on the CPU without it
    return lambda: TemperatureScaler(model=model, device=device).fit(loader)


def fits(model: torch.nn.Module, val: tuple, quick: bool) -> dict[str, Callable[[], Any]]:
    """Name -> a fit of that method on (model, val)."""
    small = {"n_members": 15, "seed": 0, **({"grad_batch_size": 16} if quick else {})}
    return {
        "TS": lambda: peg.TemperatureScaling().fit(model, val),
        "Vector scaling": lambda: peg.VectorScaling().fit(model, val),
        "Matrix scaling": lambda: peg.MatrixScaling().fit(model, val),
        "Dirichlet": lambda: peg.DirichletCalibration().fit(model, val),
        "PEG-15": lambda: peg.PEG(**small).fit(model, val),
        "PEG-15 kfac": lambda: peg.PEG(precondition="kfac", **small).fit(model, val),
        "Last-layer PEG-15": lambda: peg.PEG(params="last_layer", **small).fit(model, val),
        "PEP-15": lambda: peg.PEP(n_members=15, seed=0).fit(model, val),
        "Laplace": lambda: peg.Laplace().fit(model, val),
        "AutoSelect (5 folds)": lambda: peg.AutoSelect(cv=5, progress=False).fit(model, val),
    }


def describe_selection(selector: Any, say: Callable) -> None:
    """AutoSelect's choice, its own cost figures and each candidate's fate, one line each."""
    cost = selector.cost_
    budget = cost["budget_seconds"]
    say(f"  chose {selector.chosen_}; its own clock {cost['seconds']:.1f}s = "
        f"{cost['times_reference']:.1f} x its TS reference "
        f"({cost['reference_seconds']:.2f}s); budget "
        f"{'none' if budget is None else f'{budget:.1f}s'}")  # fmt: skip
    for row in selector.report_:
        mean, seconds = row.get("cv_mean"), row.get("fit_seconds")
        score = "" if mean is None else f" cv {mean:.4f}"
        spent = "" if seconds is None else f" {seconds:.2f}s/fold"
        why = f": {row['why']}" if row.get("why") else ""
        say(f"    {row['candidate']}: {row['status']}{score}{spent}{why}"[:240])


def profile_fit(name: str, fit: Callable[[], Any], path: str, say: Callable) -> None:
    """cProfile of `fit` (its second call) appended to `path`, 30 lines by cumulative time."""
    import cProfile
    import io
    import pstats

    fit()
    profiler = cProfile.Profile()
    profiler.runcall(fit)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
    with open(path, "a") as f:
        f.write(f"\n## {name} (second call)\n{text.getvalue()}")
    say(f"profile of {name} written to {path}")


def run_model(name: str, args: argparse.Namespace, device: torch.device, say: Callable) -> None:
    model = build(name, args.size, args.quick, args.classes).to(device)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2 * args.n, 3, args.size, args.size, generator=g)
    labels = torch.randint(0, args.classes, (2 * args.n,), generator=g)
    for where in ["cpu", "gpu"] if args.data == "both" else [args.data]:
        on = device if where == "gpu" else torch.device("cpu")
        val = (images[: args.n].to(on), labels[: args.n].to(on))
        test = images[args.n :].to(on)
        say(f"\n## {name}: {params:.1f} M parameters, data on the {where} ({on})")
        one = peg.Ensemble.from_models([model])
        timed(device, lambda e=one, t=test: e.member_logits(t))  # warm: cuDNN picks kernels
        forward, _ = timed(device, lambda e=one, t=test: e.member_logits(t))
        say(f"one forward over {args.n} test images: {forward:.3f}s")
        timed(device, fits(model, val, args.quick)["TS"])  # warm: the first call pays set-up
        ts, _ = timed(device, fits(model, val, args.quick)["TS"])
        say(f"fit TS: {ts:.2f}s = 1.00 x TS fit")
        reference = uncertainty_ts(model, val)
        if reference is not None:
            timed(device, reference)
            seconds, _ = timed(device, reference)
            say(f"fit torch-uncertainty TemperatureScaler: {seconds:.2f}s = {seconds / ts:.2f} x")
        else:
            say("torch-uncertainty: not installed (its TemperatureScaler not timed)")
        if args.profile:
            for method in ("TS", "PEG-15"):
                profile_fit(f"{name} {where} {method}", fits(model, val, args.quick)[method],
                            args.profile, say)  # fmt: skip
        for method, fit in fits(model, val, args.quick).items():
            if method == "TS" or (args.methods and method not in args.methods):
                continue
            try:
                seconds, fitted = timed(device, fit)
            except Exception as e:  # a failing method is a line of its own
                say(f"FAIL fit {method}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            say(f"fit {method}: {seconds:.2f}s = {seconds / ts:.2f} x TS fit")
            if method.startswith("AutoSelect"):
                describe_selection(fitted, say)
            if method in ("PEG-15", "Last-layer PEG-15"):
                predict, _ = timed(device, lambda f=fitted, t=test: f.predict_proba(t))
                say(f"  predict: {predict:.3f}s = {predict / forward:.2f} forwards")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "vit-b16"])
    parser.add_argument("--data", choices=["cpu", "gpu", "both"], default="both")
    parser.add_argument("--n", type=int, default=2048, help="validation (and test) images")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--methods", nargs="*", help="only these (TS always runs)")
    parser.add_argument("--quick", action="store_true", help="tiny models and shapes")
    parser.add_argument("--out", help="also write the transcript here")
    parser.add_argument("--profile", help="append cProfiles of TS's and PEG-15's fits here")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.size, args.classes = min(args.n, 64), 32, min(args.classes, 4)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device here, nothing measured (it is for the GPU "
              "machine; --device cpu --quick is a smoke run)")  # fmt: skip
        return
    out = open(args.out, "w") if args.out else None  # noqa: SIM115 (written line by line)

    def say(line: str) -> None:  # each line kept at once: a run cut at its limit keeps its start
        print(line, flush=True)
        if out is not None:
            out.write(line + "\n")
            out.flush()

    say("$ python " + shlex.join(["benchmarks/gpu.py", *(argv or sys.argv[1:])]))
    say(machine())
    for name in args.models:
        run_model(name, args, device, say)
    if out is not None:
        out.close()


if __name__ == "__main__":
    main()
