"""Calibration at 10, 100 and 1000 classes on the CPU (issue 39): every map's held-out NLL and
ECE against temperature scaling (paired differences ± their SE), its fit time as a ratio to
TS's, torch-uncertainty 0.13's unregularised scalers beside, and conformal APS vs RAPS set sizes
at 1000 classes (issue 31, part 4).

Data (validation sets of `--val` sizes, e.g. a small 500 and a large 5000; test sets apart):
- 10 classes, REAL: a CIFAR-10 CNN from the bench's presets (`--preset`, default
  cifar10-adam: SmallCNN width 32, Adam lr 1e-3, no weight decay, constant rate, 25 epochs on
  20,000 training images, seed 0; over-confident: its validation NLL is lowest near epoch 7)
  trained as `peg bench` trains its `single` base (`benchmarks/_cifar_logits.py`; `--epochs`
  cuts the preset's epochs, the spec then named `<preset>-<epochs>ep`) and cached under
  `--cache` (about 5 minutes at one thread here); validation logits from the first `--val` of
  the preset's 10,000 validation images, test logits from its 5,000 test images (`--data`: the
  folder holding cifar10_jpeg_*.tar.gz, else peg's data roots);
- 10 classes, SATURATED: issue 40's logits, randn + 45·one_hot(p), the top class wrong on every
  tenth point;
- 100 and 1000 classes, SYNTHETIC (no such logits or models offline here): `synthetic_logits`
  draws, for each point, a true class k, latent scores z* = 5.5·e_k + 3·[same superclass as
  k] + N(0, 0.5²) over C classes in C/10 random superclasses, and the label y from
  softmax(z*) (at 1000 classes y = k for ~79% of the points: an accuracy near ResNet-50's on
  ImageNet); the "model" reports α_c·(z* + N(0, 0.8²)) + β_c: per-class over-confidence
  α_c ∈ [1.3, 2.1] and biases β_c ~ N(0, 0.3²) (what vector scaling can fix, temperature
  scaling only on average). The classes' structure is seeded (shared by every set).

The maps are fitted through the public API on saved logits (`fit(nn.Identity(), (z, y))`), with
their defaults: vector / matrix scaling and Dirichlet calibration choose their shrinkage
towards TS by cross-validation (`peg.methods.calibration._affine_select`; the time includes
the choice).
Every map and scaler is fitted once on a small set before the timing starts (first-call
imports and lazy initialisation are not timed); TS, peg's and torch-uncertainty's, is timed as
the fastest of three fits, every other map once (one thread); times are ratios within one run.
torch-uncertainty (`--torch-uncertainty DIR`, a `pip install --no-deps --target DIR
torch-uncertainty==0.13.0`; its scalers loaded without the package's heavy imports): its
defaults (LBFGS, lr 0.1, max_iter 100 for TS and vector, 200 for matrix and Dirichlet, no
regularisation), on the same logits (`model=None`, a DataLoader of (logits, labels)).
ECE: 15 equal-width bins of the top-label confidence (`peg.metrics.ece`); its SE from 200
paired bootstrap resamples of the test set.

    OMP_NUM_THREADS=1 python benchmarks/many_classes.py [--classes 10 100 1000]
        [--val 500 5000] [--test 5000] [--torch-uncertainty DIR] [--data DIR]
        [--preset cifar10-adam] [--epochs N] [--cache .peg-cache/bench] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import sys
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _cifar_logits import preset_cnn_logits  # benchmarks/ (the script's folder)
from torch import Tensor, nn

import peg
from peg.utils.env import machine

IDENTITY = nn.Identity()


def synthetic_logits(n: int, seed: int, c: int = 1000) -> tuple[Tensor, Tensor]:
    """(logits `[n, c]` float32, labels `[n]`): see the module doc."""
    g = torch.Generator().manual_seed(seed)
    fixed = torch.Generator().manual_seed(12345)  # the classes' structure: shared by every set
    groups = torch.randint(0, c // 10, (c,), generator=fixed)
    alpha = 1.3 + 0.8 * torch.rand(c, generator=fixed)
    beta = 0.3 * torch.randn(c, generator=fixed)
    k = torch.randint(0, c, (n,), generator=g)
    z = 0.5 * torch.randn(n, c, generator=g)
    z += 3.0 * (groups[None, :] == groups[k][:, None])
    z[torch.arange(n), k] += 5.5
    y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]
    return (alpha * (z + 0.8 * torch.randn(n, c, generator=g)) + beta).float(), y


def saturated_logits(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Issue 40's reproduction: logits 45 apart, every tenth point's top class wrong."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    p = torch.where(torch.arange(n) % 10 == 0, (y + 1) % 10, y)
    return torch.randn(n, 10, generator=g) + 45 * F.one_hot(p, 10), y


def torch_uncertainty(path: str) -> dict[str, Any]:
    """torch-uncertainty's scaler classes, loaded from its files without the package's
    `__init__` (which imports lightning and more)."""
    root = Path(path) / "torch_uncertainty"
    for name in ("torch_uncertainty", "torch_uncertainty.post_processing"):
        module = types.ModuleType(name)
        module.__path__ = [str(root / name.partition(".")[2].replace(".", "/"))]
        sys.modules[name] = module
    calib = types.ModuleType("torch_uncertainty.post_processing.calibration")
    calib.__path__ = [str(root / "post_processing" / "calibration")]
    sys.modules[calib.__name__] = calib

    def load(name: str, file: Path) -> Any:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module

    abstract = load(
        "torch_uncertainty.post_processing.abstract", root / "post_processing/abstract.py"
    )
    sys.modules["torch_uncertainty.post_processing"].PostProcessing = abstract.PostProcessing  # type: ignore[attr-defined]
    out = {}
    folder = root / "post_processing" / "calibration"
    load(f"{calib.__name__}.scaler", folder / "scaler.py")
    load(f"{calib.__name__}.utils", folder / "utils.py")
    for mod, cls in (
        ("temperature_scaler", "TemperatureScaler"),
        ("vector_scaler", "VectorScaler"),
        ("matrix_scaler", "MatrixScaler"),
        ("dirichlet_scaler", "DirichletScaler"),
    ):
        out[cls] = getattr(load(f"{calib.__name__}.{mod}", folder / f"{mod}.py"), cls)
    return out


def tu_fit(cls: Any, z: Tensor, y: Tensor, c: int) -> Any:
    kwargs = {} if cls.__name__ == "TemperatureScaler" else {"num_classes": c}
    scaler = cls(model=None, **kwargs)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(z, y), batch_size=len(y))
    scaler.fit(loader, progress=False)
    return scaler


def timed(run: Callable[[], Any], repeats: int = 1) -> tuple[float, Any]:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    return best, out


def top_label(log_p: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    conf, pred = log_p.exp().max(-1)
    return conf.double(), (pred == y).double()


def ece_of(conf: Tensor, correct: Tensor, bins: int = 15) -> float:
    return peg.metrics.ece(torch.stack([1 - conf, conf], 1), correct.long(), bins=bins)


def paired(nll: Tensor, ref: Tensor) -> str:
    d = nll - ref
    se = float(d.std()) / math.sqrt(len(d))
    return f"{float(nll.mean()):.4f} ({float(d.mean()):+.4f} ± {se:.4f})"


def paired_ece(top: tuple[Tensor, Tensor], ref: tuple[Tensor, Tensor], boots: list[Tensor]) -> str:
    value, base = ece_of(*top), ece_of(*ref)
    diffs = torch.tensor(
        [ece_of(top[0][i], top[1][i]) - ece_of(ref[0][i], ref[1][i]) for i in boots]
    )
    return f"{100 * value:.2f} ({100 * (value - base):+.2f} ± {100 * float(diffs.std()):.2f})"


MAPS: dict[str, Callable[[], Any]] = {
    "TS": peg.TemperatureScaling,
    "vector scaling": peg.VectorScaling,
    "matrix scaling": peg.MatrixScaling,
    "Dirichlet": peg.DirichletCalibration,
    "histogram binning": peg.HistogramBinning,
    "isotonic": peg.IsotonicCalibration,
}


def chosen(fitted: Any) -> str:
    r = getattr(fitted, "regularisation_", None)
    if not r:
        return ""
    k = [r.get("k_diagonal"), r.get("k_off")] if "k_off" in r else [r.get("k_diagonal")]
    return "k " + "/".join("∞" if v is None else f"{v:g}" for v in k)


TU_MAPS = {
    "vector scaling": "VectorScaler",
    "matrix scaling": "MatrixScaler",
    "Dirichlet": "DirichletScaler",
}
SUMMARY: list[str] = []  # one row per (case, map): filled by `case`, printed at the end


def warm_up(tu: Any) -> None:
    """Fit every map and scaler once on 200 points of 10 classes (not timed)."""
    val = synthetic_logits(200, 99, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for make in MAPS.values():
            make().fit(IDENTITY, val)
    for cls in (tu or {}).values():
        tu_fit(cls, *val, 10)


def summarise(name: str, rows: dict[str, tuple[float, Tensor, str]], yt: Tensor) -> None:
    """`SUMMARY`'s rows of one case: each map's NLL − TS's ± SE and fit × TS, with
    torch-uncertainty's fit of the same map beside."""
    ts_seconds, ts_log_p, _ = rows["TS"]
    ref = F.nll_loss(ts_log_p, yt, reduction="none")

    def delta(label: str) -> tuple[str, str]:
        seconds, log_p, _ = rows[label]
        d = F.nll_loss(log_p, yt, reduction="none") - ref
        se = float(d.std()) / math.sqrt(len(d))
        return f"{float(d.mean()):+.4f} ± {se:.4f}", f"{seconds / ts_seconds:.1f}"

    for label in MAPS:
        if label == "TS":
            continue
        nll, times = delta(label)
        tu_label = f"torch-uncertainty {TU_MAPS.get(label, '')}"
        tu_nll, tu_times = delta(tu_label) if tu_label in rows else ("–", "–")
        SUMMARY.append(f"| {name} | {label} | {nll} | {times} | {tu_nll} | {tu_times} |")
    if "torch-uncertainty TemperatureScaler" in rows:
        nll, times = delta("torch-uncertainty TemperatureScaler")
        SUMMARY.append(f"| {name} | TS (torch-uncertainty's) | – | 1.0 | {nll} | {times} |")


def case(name: str, val: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], tu: Any) -> None:
    """One table: every map fitted on `val`, scored on `test`, against TS."""
    (zv, yv), (zt, yt) = val, test
    c = zv.shape[1]
    print(f"\n### {name}: {len(yv)} validation / {len(yt)} test points, {c} classes", flush=True)
    rows: dict[str, tuple[float, Tensor, str]] = {}
    for label, make in MAPS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seconds, fitted = timed(
                lambda make=make: make().fit(IDENTITY, val), 3 if label == "TS" else 1
            )
        note = chosen(fitted)
        if any("per class on average" in str(w.message) for w in caught):
            note += " (few-points warning)"
        rows[label] = (seconds, fitted.member_logits(zt)[0].double().log_softmax(-1), note)
    if tu is not None:
        for label, cls in (
            ("TemperatureScaler", "TemperatureScaler"),
            ("VectorScaler", "VectorScaler"),
            ("MatrixScaler", "MatrixScaler"),
            ("DirichletScaler", "DirichletScaler"),
        ):
            repeats = 3 if cls == "TemperatureScaler" else 1
            seconds, scaler = timed(lambda cls=cls: tu_fit(tu[cls], zv, yv, c), repeats)
            with torch.no_grad():
                out = scaler._scale(zt).double().log_softmax(-1)
            rows[f"torch-uncertainty {label}"] = (seconds, out, "unregularised")
    summarise(f"{name}, {len(yv)} val", rows, yt)
    ts_seconds, ts_log_p, _ = rows["TS"]
    ref = F.nll_loss(ts_log_p, yt, reduction="none")
    ref_top = top_label(ts_log_p, yt)
    g = torch.Generator().manual_seed(0)
    boots = [torch.randint(0, len(yt), (len(yt),), generator=g) for _ in range(200)]
    raw = zt.double().log_softmax(-1)
    print("| map | fit s | × TS | test NLL (vs TS ± SE) | ECE % (vs TS ± SE) | error | chosen |")
    print("|---|---:|---:|---|---|---:|---|")
    err = float((raw.argmax(-1) != yt).double().mean())
    print(
        f"| uncalibrated | – | – | {paired(F.nll_loss(raw, yt, reduction='none'), ref)} | "
        f"{paired_ece(top_label(raw, yt), ref_top, boots)} | {err:.4f} | |"
    )
    for label, (seconds, log_p, note) in rows.items():
        nll = F.nll_loss(log_p, yt, reduction="none")
        err = float((log_p.argmax(-1) != yt).double().mean())
        print(
            f"| {label} | {seconds:.2f} | {seconds / ts_seconds:.1f} | {paired(nll, ref)} | "
            f"{paired_ece(top_label(log_p, yt), ref_top, boots)} | {err:.4f} | {note} |",
            flush=True,
        )


def conformal(zv: Tensor, yv: Tensor, zt: Tensor, yt: Tensor, temperature: float) -> None:
    """APS and RAPS sets at α = 0.1 on the temperature-scaled logits."""

    class Saved:  # saved logits as a predictor (a model without parameters is issue 31 part 3)
        def member_logits(self, X: Tensor, *args: Any, **kwargs: Any) -> Tensor:
            return (X / temperature)[None]

    print("\nConformal sets at α = 0.1 (TS-calibrated logits; calibrated on the validation set):")
    print("| score | coverage | mean set size | median |\n|---|---:|---:|---:|")
    for name, options in (
        ("APS", {"score": "aps"}),
        ("APS (randomised)", {"score": "aps", "randomized": True}),
        ("RAPS (k_reg 5, λ 0.01)", {"score": "raps", "k_reg": 5, "lam": 0.01}),
        (
            "RAPS (k_reg 5, λ 0.01, randomised)",
            {"score": "raps", "k_reg": 5, "lam": 0.01, "randomized": True},
        ),
    ):
        cp = peg.ConformalClassifier(alpha=0.1, **options).fit(Saved(), (zv, yv))  # type: ignore[arg-type]
        sets = cp.predict_set(zt)
        size = sets.sum(1).double()
        cover = float(sets[torch.arange(len(yt)), yt].double().mean())
        print(f"| {name} | {cover:.3f} | {float(size.mean()):.2f} | {float(size.median()):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--val", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--test", type=int, default=5000)
    parser.add_argument("--torch-uncertainty", default=None)
    parser.add_argument("--data", default=None, help="where the CIFAR-10 archives are")
    parser.add_argument("--preset", default="cifar10-adam", help="the 10-class CNN's preset")
    parser.add_argument("--epochs", type=int, default=None, help="its epochs (else the preset's)")
    parser.add_argument("--cache", default=".peg-cache/bench", help="the CNN's checkpoint cache")
    parser.add_argument(
        "--quick", action="store_true", help="100 classes, 500 points (a smoke run)"
    )
    args = parser.parse_args()
    if args.quick:
        args.classes, args.val, args.test = [100], [500], 1000
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # torch-uncertainty's "model is None" on every fit
    print(f"Machine: {machine()}")
    print(f"Command: {' '.join(sys.argv)}")
    tu = torch_uncertainty(args.torch_uncertainty) if args.torch_uncertainty else None
    warm_up(tu)
    for c in args.classes:
        if c == 10:
            val, test, line = preset_cnn_logits(args.preset, args.epochs, args.cache, args.data)
            print(f"\n10-class CNN: {line}", flush=True)
            for n in args.val:
                n = min(n, len(val[1]))
                case(f"CIFAR-10 CNN ({args.preset})", (val[0][:n], val[1][:n]), test, tu)
            case(
                "saturated logits (issue 40)",
                saturated_logits(500, 0),
                saturated_logits(args.test, 1),
                tu,
            )
            continue
        test = synthetic_logits(args.test, 2, c)
        for n in args.val:
            case(f"synthetic, {c} classes", synthetic_logits(n, 1, c), test, tu)
        if c == 1000 and max(args.val) >= 5000:
            zv, yv = synthetic_logits(max(args.val), 1, c)
            T = peg.TemperatureScaling().fit(IDENTITY, (zv, yv)).temperature_
            conformal(zv, yv, *test, T)
    print("\nSummary: test NLL − TS's (± paired SE) and fit time × TS's (TS: peg's, this run)")
    print("| case | map | peg: NLL − TS | peg: × TS | torch-uncertainty: NLL − TS | × TS |")
    print("|---|---|---|---:|---|---:|")
    print("\n".join(SUMMARY))


if __name__ == "__main__":
    main()
