"""Why the default η search stops where it does on a CIFAR-10 CNN (issue 60, point 1).

On `_scale_bases.cifar_cnn` (the cifar10-cpu preset's data, 2,000 validation images; PEG-15,
seeds 0-2), one fit per seed, on its members and scoring points (the held-out half, 1,000
points; the first 384 are the default's first chunk):

- the default's and the exhaustive search's scales, scores and points scored;
- a dense exact curve of the held-out NLL (first 384 points and all 1,000) and of the test
  NLL (2,000 test images) over η, and where each is lowest;
- how flat and asymmetric the curve is near its minimum: NLL(η*·f) − NLL(η*) for f in
  {1/2, 2/3, 3/2, 2};
- the paired per-point standard error, on 384 and on 1,000 held-out points, of the difference
  between the two η the default scored, and between the default's η and the exhaustive's;
- the surrogate: the polynomial through the base (η = 0), 0.001 and the default's second η,
  on the first 384 points, against the exact curve, its minimiser, and its predicted gain
  over the best η scored in standard errors (what a third scoring would be decided by).

    OMP_NUM_THREADS=1 python benchmarks/scale_search_why.py [--seeds 0 1 2] [--n 2000]
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from _scale_bases import BASES
from _scale_table import SETTINGS, _Runs, point_losses
from torch import Tensor

from peg.methods.perturbation import _perturb
from peg.methods.perturbation._scale_search import ScaleSearch
from peg.methods.perturbation._surrogate import Interpolant
from peg.methods.perturbation.peg import PEG
from peg.source import Source
from peg.utils.env import machine

FIRST = 384
FACTORS = (0.5, 2 / 3, 1.5, 2.0)


def _paired(a: Tensor, b: Tensor) -> str:
    d = a - b
    sd = float(d.std())
    return f"{float(d.mean()):+.4f} (SE {sd / math.sqrt(len(d)):.4f}, per-point sd {sd:.3f})"


def _seed(base: torch.nn.Module, val: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor],
          seed: int) -> None:  # fmt: skip
    runs = _Runs({k: ScaleSearch(**v) for k, v in (("default", {}), *SETTINGS.items())})
    original = _perturb.SearchRun
    _perturb.SearchRun = runs  # type: ignore[assignment,misc]
    try:
        fitted = PEG(n_members=15, seed=seed, progress=False).fit(base, val)
    finally:
        _perturb.SearchRun = original  # type: ignore[misc]
    _, score = fitted._split(Source(val).rows())
    Xs, ys = val[0][score][:1024], val[1][score][:1024]
    print(f"\n## seed {seed}: {len(val[1])} validation points, {len(score)} held out for "
          f"scoring η (exact scorings on the first {len(ys)}), {len(test[1])} test "
          "points")  # fmt: skip
    for name, r in runs.record.items():
        scored = ", ".join(f"{s:.3g}: {v:.4f} on {k}" for (s, v), (_, k) in
                           zip(r["scores"], r["points"], strict=True))  # fmt: skip
        print(f"  {name:10} chose η {r['scale']:.3g}; scored {scored}")
    cache: dict[float, tuple[Tensor, Tensor, Tensor]] = {}

    def at(eta: float) -> tuple[Tensor, Tensor, Tensor]:
        if eta not in cache:
            ens = fitted.ensemble_at(eta)
            out = ens.member_logits(Xs, 256, progress=False)
            test_out = ens.member_logits(test[0], 256, progress=False)
            cache[eta] = (out, point_losses(out, ys, False), point_losses(test_out, test[1], False))
        return cache[eta]

    grid = torch.logspace(math.log10(3e-4), math.log10(3e-2), 17).tolist()
    chosen = {r["scale"] for r in runs.record.values()}
    etas = sorted(set(grid) | chosen)
    print("  η          held-out NLL (384)  (1,000)   test NLL")
    for eta in etas:
        _, v, t = at(eta)
        mark = " <- chosen" if eta in chosen else ""
        print(f"  {eta:9.3g}  {float(v[:FIRST].mean()):.4f}            {float(v.mean()):.4f}"
              f"    {float(t.mean()):.4f}{mark}")  # fmt: skip
    for what, idx in (("held-out 384", 0), ("held-out 1,000", 1), ("test", 2)):

        def curve(eta: float, idx: int = idx) -> float:
            _, v, t = at(eta)
            return float((v[:FIRST] if idx == 0 else v if idx == 1 else t).mean())

        best = min(grid, key=curve)
        around = "  ".join(f"×{f:.2g}: {curve(best * f) - curve(best):+.4f}" for f in FACTORS)
        print(f"  {what:15} lowest at η {best:.3g} ({curve(best):.4f}); NLL(η*·f) − NLL(η*): "
              f"{around}")  # fmt: skip
    d_rec, e_rec = runs.record["default"], runs.record["exhaustive"]
    d_etas = [s for s, _ in d_rec["scores"]]
    if len(d_etas) >= 2:
        a, b = at(d_etas[0])[1], at(d_etas[1])[1]
        print(f"  the default's pair {d_etas[0]:.3g} − {d_etas[1]:.3g}: on 384 "
              f"{_paired(a[:FIRST], b[:FIRST])}; on 1,000 {_paired(a, b)}")  # fmt: skip
    a, b = at(d_rec["scale"])[1], at(e_rec["scale"])[1]
    ta, tb = at(d_rec["scale"])[2], at(e_rec["scale"])[2]
    print(f"  default η {d_rec['scale']:.3g} − exhaustive η {e_rec['scale']:.3g}: held-out 384 "
          f"{_paired(a[:FIRST], b[:FIRST])}; 1,000 {_paired(a, b)}; test "
          f"{_paired(ta, tb)}")  # fmt: skip
    # the surrogate on the first chunk: polynomial through 0, then the default's scales
    with torch.no_grad():
        zero = fitted.ensemble_at(0.0).member_logits(Xs[:FIRST], 256, progress=False)
    for nodes in (d_etas[:1], d_etas[:2]):
        poly = Interpolant(zero)
        for s in nodes:
            poly.add(s, at(s)[0][:, :FIRST])
        y = ys[:FIRST]
        pred = {e: float(point_losses(poly(e), y, False).mean()) for e in grid}
        best_p = min(pred, key=pred.__getitem__)
        errors = "  ".join(f"{e:.2g}: {pred[e] - float(at(e)[1][:FIRST].mean()):+.4f}"
                           for e in grid[4:14:2])  # fmt: skip
        exact_best = min(grid, key=lambda e: float(at(e)[1][:FIRST].mean()))
        best_scored = min(nodes, key=lambda s: float(at(s)[1][:FIRST].mean()))
        d = point_losses(at(best_scored)[0][:, :FIRST], y, False) - point_losses(
            poly(best_p), y, False
        )
        gain, se = float(d.mean()), float(d.std()) / math.sqrt(FIRST)
        print(f"  surrogate through 0, {', '.join(f'{s:.3g}' for s in nodes)} (384 points): "
              f"minimiser η {best_p:.3g} (exact curve's: {exact_best:.3g}); "
              f"predicted − exact NLL at η = {errors}; predicted gain over the best scored "
              f"{gain:+.4f} = {gain / se:+.2f} SE")  # fmt: skip


def versus_ts(base: torch.nn.Module, val: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor],
               seeds: list[int]) -> None:  # fmt: skip
    """Test NLL of the base, TS, PEG-15 (the default search) and PEG-15 + TS (TS fitted on the
    same validation points, on the PEG ensemble's outputs)."""
    from peg.methods.calibration.temperature import TemperatureScaling

    def nll(model: Any) -> float:
        with torch.no_grad():
            out = model.member_logits(test[0], 256, progress=False)
        return float(point_losses(out, test[1], False).mean())

    ts = TemperatureScaling().fit(base, val)
    with torch.no_grad():
        plain = float(torch.nn.functional.cross_entropy(base(test[0]), test[1]))
    print(f"\n## against temperature scaling: test NLL of the base {plain:.4f}, TS {nll(ts):.4f}")
    for seed in seeds:
        fitted = PEG(n_members=15, seed=seed, progress=False).fit(base, val)
        both = TemperatureScaling().fit(fitted, val)
        print(f"  seed {seed}: PEG-15 η {fitted.eta_:.3g} test NLL {nll(fitted):.4f}; "
              f"PEG-15 + TS {nll(both):.4f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--ts", action="store_true", help="PEG and PEG + TS against TS instead")
    parser.add_argument("--base", default="cifar-cnn", choices=list(BASES), help="with --ts")
    args = parser.parse_args()
    torch.set_grad_enabled(True)
    base, val, test, _ = BASES[args.base if args.ts else "cifar-cnn"]()
    val, test = (val[0][: args.n], val[1][: args.n]), (test[0][:2000], test[1][:2000])
    with torch.no_grad():
        out = base(test[0])
    acc = float((out.argmax(1) == test[1]).float().mean())
    print(f"machine: {machine()}")
    nll = float(torch.nn.functional.cross_entropy(out, test[1]))
    print(f"base: test accuracy {acc:.3f}, NLL {nll:.4f}")
    if args.ts:
        versus_ts(base, val, test, args.seeds)
        return
    for seed in args.seeds:
        _seed(base, val, test, seed)


if __name__ == "__main__":
    main()
