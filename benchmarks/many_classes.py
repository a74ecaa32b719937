"""Calibration at 1000 classes on the CPU: fit times as ratios to temperature scaling, held-out
NLL of every map against TS, and conformal APS vs RAPS set sizes (issue 31, part 4).

The logits are SYNTHETIC (no 1000-class logits or model exist offline here): `synthetic_logits`
draws, for each point, a true class k, latent scores z* = 5.5·e_k + 3·[same superclass as k] +
N(0, 0.5²) over 1000 classes in 100 random superclasses (k's own included), and the label y
from softmax(z*) (y = k for ~79% of the points: an accuracy near ResNet-50's on ImageNet);
the "model" reports α_c·(z* + N(0, 0.8²)) + β_c: per-class over-confidence α_c ∈ [1.3, 2.1]
and biases β_c ~ N(0, 0.3²) (what vector scaling can fix, temperature scaling only on
average). Validation and test sets are independent draws.

Timed on the same validation logits, one after the other in this run (one thread): peg's
`fit_temperature`, vector scaling (`fit_affine`, diagonal) and matrix scaling / Dirichlet
calibration with ODIR at a fixed strength (the strength the validation selection below chose:
what one fit costs), and, when importable (`--torch-uncertainty DIR`, a `pip install --no-deps
--target DIR torch-uncertainty`: its scalers are loaded without the package's heavy imports),
torch-uncertainty 0.13's `TemperatureScaler` and `VectorScaler` (LBFGS, lr 0.1, max_iter 100:
its defaults) on the same logits.

ODIR strength (Kull et al. 2019, λ = μ): chosen on the validation data only, as a user would:
the grid `--grid` fitted on 80% of it (seeded split), scored by NLL on the other 20%, the best
refitted on all of it. The held-out NLL ± SE (paired, per point) of every map against TS is on
the test logits.

    OMP_NUM_THREADS=1 python benchmarks/many_classes.py [--val 5000] [--test 5000]
        [--grid 1e4 1e5 1e6] [--dirichlet-grid ...] [--torch-uncertainty DIR] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import peg
from peg._env import machine
from peg.methods._affine import affine, fit_affine
from peg.methods.temperature import fit_temperature

C = 1000


def synthetic_logits(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """(logits `[n, 1000]` float32, labels `[n]`): see the module doc."""
    g = torch.Generator().manual_seed(seed)
    fixed = torch.Generator().manual_seed(12345)  # the classes' structure: shared by every set
    groups = torch.randint(0, 100, (C,), generator=fixed)
    alpha = 1.3 + 0.8 * torch.rand(C, generator=fixed)
    beta = 0.3 * torch.randn(C, generator=fixed)
    k = torch.randint(0, C, (n,), generator=g)
    z = 0.5 * torch.randn(n, C, generator=g)
    z += 3.0 * (groups[None, :] == groups[k][:, None])
    z[torch.arange(n), k] += 5.5
    y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]
    return (alpha * (z + 0.8 * torch.randn(n, C, generator=g)) + beta).float(), y


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
    for mod, cls in (
        ("temperature_scaler", "TemperatureScaler"),
        ("vector_scaler", "VectorScaler"),
    ):
        file = root / "post_processing" / "calibration" / f"{mod}.py"
        if mod == "vector_scaler":
            load(f"{calib.__name__}.utils", file.parent / "utils.py")
        out[cls] = getattr(load(f"{calib.__name__}.{mod}", file), cls)
    load(f"{calib.__name__}.scaler", root / "post_processing/calibration/scaler.py")
    return out


def tu_fit(cls: Any, z: Tensor, y: Tensor) -> Any:
    kwargs = {"num_classes": C} if cls.__name__ == "VectorScaler" else {}
    scaler = cls(model=None, **kwargs)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(z, y), batch_size=len(y))
    scaler.fit(loader, progress=False)
    return scaler


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = run()
    return time.perf_counter() - start, out


def choose_odir(s: Tensor, y: Tensor, grid: list[float], full: bool) -> tuple[float, dict]:
    """λ = μ of the grid with the best NLL on a seeded 20% of the validation data, the maps
    fitted on the other 80%; returns (λ, {λ: held-out NLL})."""
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(y))
    fit_idx, held = perm[:cut], perm[cut:]
    scores = {}
    for lam in grid:
        start = time.perf_counter()
        w, b = fit_affine(s[fit_idx], y[fit_idx], full=full, reg_lambda=lam, reg_mu=lam)
        scores[lam] = float(F.cross_entropy(affine(s[held], w, b), y[held]))
        seconds = time.perf_counter() - start
        print(f"  λ = μ = {lam:g}: held-out NLL {scores[lam]:.4f} (fit {seconds:.0f} s)")
        sys.stdout.flush()
    return min(scores, key=scores.get), scores  # type: ignore[arg-type]


def paired(nll: Tensor, ref: Tensor) -> str:
    d = nll - ref
    se = float(d.std() / math.sqrt(len(d)))
    return f"{float(nll.mean()):.4f} (vs TS {float(d.mean()):+.4f} ± {se:.4f})"


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
    parser.add_argument("--val", type=int, default=5000)
    parser.add_argument("--test", type=int, default=5000)
    parser.add_argument("--grid", type=float, nargs="+", default=[1e4, 1e5, 1e6])
    parser.add_argument("--dirichlet-grid", type=float, nargs="+", default=None)
    parser.add_argument("--torch-uncertainty", default=None)
    parser.add_argument("--quick", action="store_true", help="1000 points, one λ (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.val, args.test, args.grid = 1000, 1000, [1e5]
    torch.set_num_threads(1)
    print(f"Machine: {machine()}")
    print(f"Command: {' '.join(sys.argv)}")
    zv, yv = synthetic_logits(args.val, seed=1)
    zt, yt = synthetic_logits(args.test, seed=2)
    print(
        f"Synthetic logits: {args.val} validation / {args.test} test points x {C} classes; "
        f"test accuracy {float((zt.argmax(-1) == yt).double().mean()):.3f}"
    )
    sv = zv.log_softmax(-1)  # Dirichlet's scores: log p
    print("ODIR strength, matrix scaling (logits):", flush=True)
    lam_m, grid_m = choose_odir(zv, yv, args.grid, full=True)
    print("ODIR strength, Dirichlet calibration (log p):", flush=True)
    lam_d, grid_d = choose_odir(sv, yv, args.dirichlet_grid or args.grid, full=True)
    print(f"ODIR λ = μ, held-out NLL on 20% of the validation set: matrix {grid_m} → {lam_m:g}")
    print(f"  Dirichlet {grid_d} → {lam_d:g}")
    fits: dict[str, tuple[float, Callable[[Tensor], Tensor]]] = {}
    seconds, T = timed(lambda: fit_temperature(zv, yv))
    fits["TS"] = (seconds, lambda z: z.double() / T)
    seconds, (w, b) = timed(lambda: fit_affine(zv, yv, full=False))
    fits["Vector scaling"] = (seconds, lambda z, w=w, b=b: affine(z, w, b))
    seconds, (w, b) = timed(lambda: fit_affine(zv, yv, full=False, reg_mu=lam_d))
    fits[f"Vector scaling (μ {lam_d:g})"] = (seconds, lambda z, w=w, b=b: affine(z, w, b))
    seconds, (w, b) = timed(lambda: fit_affine(zv, yv, full=True, reg_lambda=lam_m, reg_mu=lam_m))
    fits[f"Matrix scaling ODIR (λ {lam_m:g})"] = (seconds, lambda z, w=w, b=b: affine(z, w, b))
    seconds, (w, b) = timed(lambda: fit_affine(sv, yv, full=True, reg_lambda=lam_d, reg_mu=lam_d))
    fits[f"Dirichlet ODIR (λ {lam_d:g})"] = (
        seconds,
        lambda z, w=w, b=b: affine(z.log_softmax(-1), w, b),
    )
    if args.torch_uncertainty:
        tu = torch_uncertainty(args.torch_uncertainty)
        for label, cls in (
            ("TemperatureScaler", "TemperatureScaler"),
            ("VectorScaler", "VectorScaler"),
        ):
            seconds, scaler = timed(lambda cls=cls: tu_fit(tu[cls], zv, yv))
            fits[f"torch-uncertainty {label}"] = (
                seconds,
                lambda z, s=scaler: s._scale(z).detach().double(),
            )
    ref = F.cross_entropy(zt.double() / T, yt, reduction="none")
    ts_seconds = fits["TS"][0]
    print("\n| map | fit s | × TS | test NLL (paired difference to TS ± SE) | test error |")
    print("|---|---:|---:|---|---:|")
    raw = F.cross_entropy(zt.double(), yt, reduction="none")
    error = float((zt.argmax(-1) != yt).double().mean())
    print(f"| uncalibrated | – | – | {paired(raw, ref)} | {error:.4f} |")
    for name, (seconds, apply) in fits.items():
        out = apply(zt)
        nll = F.cross_entropy(out, yt, reduction="none")
        err = float((out.argmax(-1) != yt).double().mean())
        ratio = seconds / ts_seconds
        print(f"| {name} | {seconds:.2f} | {ratio:.1f} | {paired(nll, ref)} | {err:.4f} |")
    conformal(zv, yv, zt, yt, T)


if __name__ == "__main__":
    main()
