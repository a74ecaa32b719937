"""PEG-15's fit against temperature scaling's, and what scoring the η search on a prefix of
the scoring points costs in quality (issue 25).

Per base: temperature scaling's fit; PEG-15's and PEP-15's fit with the scale fixed (the
gradients / noise and the members: what no search can save) and with the default surrogate
search, scoring every scoring point ("before") or its first `SEARCH_POINTS` = 1024 ("after",
the default now); the share of the fit the search takes; and each choice's exact score on
every scoring point against a dense reference (25 log-spaced scales over the grid's range,
continued past an edge while the best is on it), in standard errors of the paired per-point
difference, as benchmarks/scale_search.py reports it. Bases as scale_search.py's (trained once,
cached under .peg-cache/).

    python benchmarks/peg_cost.py [--bases fashion-mnist-adam digits ...]
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch
from scale_search import BASES, _point_losses, _scoring_points
from torch import Tensor

from peg.apps.bench.spec import find_spec, load_specs
from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.perturbation._scale_search import ScaleSearch
from peg.methods.perturbation.peg import PEG
from peg.methods.perturbation.pep import PEP
from peg.utils.env import machine

REFERENCE_SCALES = 25


def _timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def _reference(fitted: PEG | PEP, losses: Any) -> tuple[float, Tensor]:
    lo, hi = (math.log(s) for s in (min(fitted.default_grid), max(fitted.default_grid)))
    step = (hi - lo) / (REFERENCE_SCALES - 1)
    ref = {math.exp(lo + i * step): None for i in range(REFERENCE_SCALES)}
    ref = {s: losses(s) for s in ref}

    def best() -> float:
        return min(ref, key=lambda s: float(ref[s].mean()))

    for edge, sign in ((lo, -1), (hi, 1)):
        k = 1
        while best() == math.exp(edge + sign * (k - 1) * step) and k <= math.ceil(3 * 2.3 / step):
            scale = math.exp(edge + sign * k * step)
            ref[scale] = losses(scale)
            k += 1
    return best(), ref[best()]


def _compare(case: Any, method: str, ts: float) -> None:
    make = PEG if method == "PEG" else PEP
    options: dict[str, Any] = {"n_members": 15, "seed": 0, "progress": False}
    options["search"] = ScaleSearch(max_points=case.score_points)
    fixed_s, _ = _timed(lambda: make(**options, **{make.scale_name: 0.01}).fit(case.base, case.val))
    fits = {}
    for label, points in (("before: every scoring point", None), ("after: first 1024", 1024)):
        options["search"] = ScaleSearch(max_points=case.score_points, exact_points=points)
        fits[label] = _timed(lambda: make(**options).fit(case.base, case.val))
    first = next(iter(fits.values()))[1]
    Xs, ys = _scoring_points(first, case.val)

    def losses(fitted: PEG | PEP, scale: float) -> Tensor:
        outputs = fitted.ensemble_at(scale).member_logits(Xs, 512, progress=False)
        if not torch.isfinite(outputs).all():
            return torch.full((len(ys),), math.inf, dtype=torch.float64)
        return _point_losses(outputs, ys, case.regression)

    best, best_losses = _reference(first, lambda s: losses(first, s))
    name = "η" if method == "PEG" else "σ"
    print(f"  {method}-15 with {name} fixed (no search): {fixed_s:.2f} s = "
          f"{fixed_s / ts:.1f} × TS; dense reference best {name} = {best:.3g}, score "
          f"{float(best_losses.mean()):.4f} on {len(ys)} points")  # fmt: skip
    for label, (seconds, fitted) in fits.items():
        scale = fitted._scale
        d = losses(fitted, scale) - best_losses
        se = float(d.std()) / math.sqrt(len(d))
        gap = float(d.mean()) / se if se > 0 else 0.0
        search = max(seconds - fixed_s, 0.0) / seconds
        print(f"  {label:28} {name} = {scale:9.3g} scored {len(fitted.search_)} "
              f"(score - best)/SE {gap:6.2f}  fit {seconds:6.2f} s = {seconds / ts:5.1f} × TS "
              f"(search ≈ {search:.0%} of it)")  # fmt: skip


def _fashion_mnist_adam() -> Any:
    from scale_search import _seed_run

    spec = load_specs(find_spec("fashion-mnist-adam"))[0]
    return _seed_run(spec, "bench", "bench preset (Adam, no weight decay: over-confident)")


def main() -> None:
    bases = {"fashion-mnist-adam": _fashion_mnist_adam, **BASES}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bases", nargs="+", default=list(bases), choices=list(bases))
    args = parser.parse_args()
    print(f"machine: {machine()}")
    for name in args.bases:
        case = bases[name]()
        if case.regression:
            continue
        TemperatureScaling().fit(case.base, case.val)  # warm-up, untimed
        ts, _ = _timed(lambda c=case: TemperatureScaling().fit(c.base, c.val))
        print(f"\n## {case.label}: {len(case.val[1])} validation points; temperature scaling "
              f"{ts:.2f} s")  # fmt: skip
        for method in ("PEG", "PEP"):
            _compare(case, method, ts)


if __name__ == "__main__":
    main()
