"""The η / σ search: the surrogate search (default) against the golden search and a dense
exact reference, on real bases.

Target (issue 15): the default search for PEG and PEP costs at most 3 exact scorings (S
members on the scoring points, once) beyond the gradients / noise draws, and picks a scale
whose exact held-out score is within one standard error (of the paired per-point score
difference) of the best score of a dense reference search: 25 log-spaced scales over the
grid's range (PEG: 1e-3…1; PEP: its bracket), every scoring point scored, continued at the
same spacing past an edge (at most 3 decades) while the best is on that edge. Reported per base
and method: the scale chosen, the exact scorings it took, its score minus the reference's best in
standard errors (negative: better than every reference scale, found outside the grid's range),
and the time to build the ensemble (search included) against one epoch of training the base
and against fitting temperature scaling — for the surrogate search ("after"; issue 49: at most
2 scorings on 384 points by need), issue 38's surrogate search (up to 3 scorings on 1024 points)
and the golden search with racing, the default before it ("before"), all timed in this run.

Bases (each trained once and cached under .peg-cache/, shared with `peg bench` where it is a
bench preset's): the `fashion-mnist` bench preset (weight decay: well calibrated), the
`fashion-mnist-overfit` paper-tables preset (no weight decay), the `peg demo` Fashion-MNIST base
(over-fitted), the `digits` preset (MLP), the `cifar10-cpu` bench preset (SmallCNN w32 on 20k
CIFAR-10 images, SGD with weight decay), the same CNN trained with Adam and no weight decay
(over-confident), and a UCI regression base (power plant, split 0, Gaussian MLP; criterion:
the members' mixture NLL). Every number is measured in this run, on this machine (printed).

    python benchmarks/scale_search.py [--bases ...] [--repeats 1] [--quick]

`--exact-points 1024 default` (issues 38 and 49) compares instead search settings (`_setting`:
an integer N is issue 38's search, up to 3 scorings on the first N scoring points, "1024" the
default before issue 49; "default" today's, 2 scales on 384 points by need; "key=value,..."
ScaleSearch options), the first against the others:
PEG-15 and PEP-15 fitted with each, for seeds 0, 1, 2 (`--seeds`), on the `digits` preset and on
the Fashion-MNIST SmallCNN of benchmarks/peg_fit_overhead.py (one epoch on 10k images) with
2,000 and 4,000 validation images, and the over-fitted `peg demo` base on 2,000 (or 12,000)
of its validation split (`--points-bases`, e.g. demo-2000); the chosen scale's test NLL (the
preset's test split; Fashion-MNIST: test images 4,000-9,999; demo: test images 0-4,999), minus the
first setting's, paired per test point, in its standard error; pooled over seeds: the
per-point difference averaged over seeds, against issue 49's bar: max(0.002 nats, 5% of the
method's gain over the base).

    OMP_NUM_THREADS=1 python benchmarks/scale_search.py --exact-points 1024 default \
        --points-bases digits fashion-mnist-2000 fashion-mnist-4000 demo-2000 demo-12000

`--table CASES` (issue 60, `_scale_table`): PEG-15's default search against the exhaustive one
(`ScaleSearch.exhaustive()`) on more kinds of base (`_scale_bases`: a CIFAR-10 CNN,
transformers' ResNet, ViT and BERT from small configs, the UCI regression base), per base ×
validation points × seed, every setting run on one fit's members, with the bar and the fit
cost × TS; records cached under .peg-cache/scale-search/table/:

    OMP_NUM_THREADS=1 python benchmarks/scale_search.py --table cifar-cnn-2000 cifar-cnn-4000 \
        hf-resnet-2000 hf-vit-2000 hf-bert-2000 uci-861 --settings default quick --tag final
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from _bases import CACHE, Case, demo, fashion_mnist
from _scale_table import table_main
from _timing import median_time
from torch import Tensor, nn

from peg import data as datasets
from peg.apps.bench.paper import PRESETS
from peg.apps.bench.seed import SeedRun
from peg.apps.bench.spec import find_spec, load_specs
from peg.apps.bench.uci import Split
from peg.losses import gaussian_nll_loss
from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.perturbation._criteria import POINT_LOSSES
from peg.methods.perturbation._scale_search import ScaleSearch
from peg.methods.perturbation.peg import PEG
from peg.methods.perturbation.pep import PEP
from peg.metrics.regression import split_gaussian
from peg.source import Source
from peg.train import Recipe, train
from peg.utils.env import machine

REFERENCE_SCALES = 25
EXTEND_DECADES = 3  # how far past an edge of the grid's range the reference may go


def _seed_run(spec: Any, cache: str, label: str) -> Case:
    spec = dataclasses.replace(spec, methods=())
    run = SeedRun(spec, 0, CACHE / cache, progress=False)
    base = run.bases.get("single").eval()
    one = dataclasses.replace(spec.train, epochs=1)
    return Case(
        f"{spec.name}: {label}",
        base,
        run.val,
        run.train,
        lambda: train(copy.deepcopy(base).train(), run.train, one, seed=1, progress=False),
        spec.score_points if spec.score_points is not None else 10_000,
    )


def _uci() -> Case:
    split = Split("power-plant", 0, CACHE / "bench" / "uci", None, None)
    base = split.single().eval()
    one = dataclasses.replace(split.recipe, epochs=1)
    return Case(
        "UCI power plant, split 0 (Gaussian MLP)",
        base,
        split.val,
        split.train,
        lambda: train(
            copy.deepcopy(base).train(), split.train, one, seed=1, loss=gaussian_nll_loss,
            progress=False,
        ),
        grad_batch_size=min(32, len(split.val[0]) // 2),
        regression=True,
    )  # fmt: skip


ADAM_LABEL = "SmallCNN w32, 20k images, Adam without weight decay (over-confident)"


def _cifar10_adam() -> Any:
    """The cifar10-cpu preset's model and data, trained the way many users train: Adam
    (lr 1e-3), no weight decay, constant rate, 10 epochs."""
    spec = load_specs(find_spec("cifar10-cpu"))[0]
    recipe = Recipe(epochs=10, lr=1e-3, optimizer="adam", weight_decay=0.0, schedule="constant")
    return dataclasses.replace(spec, name="cifar10-adam", train=recipe)


BASES: dict[str, Callable[[], Case]] = {
    "fashion-mnist": lambda: _seed_run(
        load_specs(find_spec("fashion-mnist"))[0], "bench", "bench preset (weight decay)"
    ),
    "fashion-mnist-overfit": lambda: _seed_run(
        PRESETS["fashion-mnist-overfit"], "paper-tables", "no weight decay, 12k"
    ),
    "demo": demo,
    "digits": lambda: _seed_run(PRESETS["digits"], "paper-tables", "MLP"),
    "cifar10-cpu": lambda: _seed_run(
        load_specs(find_spec("cifar10-cpu"))[0], "bench", "SmallCNN w32, 20k images"
    ),
    "cifar10-adam": lambda: _seed_run(_cifar10_adam(), "scale-search", ADAM_LABEL),
    "uci-power-plant": _uci,
}


def _point_losses(outputs: Tensor, y: Tensor, regression: bool) -> Tensor:
    """Per-point losses `[N]` whose mean is the search's criterion (float64)."""
    if not regression:
        return POINT_LOSSES["nll"](outputs.double(), y)
    mean, var = split_gaussian(outputs.double())
    log_p = torch.distributions.Normal(mean, var.sqrt()).log_prob(y.double())  # [M, N]
    return -(torch.logsumexp(log_p, 0) - math.log(len(outputs)))


def _scoring_points(fitted: PEG | PEP, val: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The points the search scored on (the same split and subsample as `fit`'s)."""
    X, y = val
    _, score = fitted._split(Source(val).rows())
    if score is None:
        cap = fitted._search().max_points or len(y)
        return X[:cap], y[:cap]
    return X[score], y[score]


def _best(scores: dict[float, Tensor]) -> float:
    return min(scores, key=lambda s: float(scores[s].mean()))


def _compare(case: Case, method: str, repeats: int, ts_seconds: float, epoch: float) -> None:
    make = PEG if method == "PEG" else PEP
    options: dict[str, Any] = {"n_members": 15, "seed": 0, "progress": False}
    points = case.score_points
    if method == "PEG":
        options["grad_batch_size"] = case.grad_batch_size
    warm = {"eta" if method == "PEG" else "sigma": 0.01, "n_members": 2}
    make(**{**options, **warm}).fit(case.base, case.val)  # warm-up, untimed
    fits = {}
    seconds = {}
    searches = {
        "golden": ScaleSearch(method="golden", max_points=points),
        "surrogate": ScaleSearch(max_points=points),
        "surrogate-1024": ScaleSearch(
            max_points=points, exact_points=1024, first_points=1024, scorings=3
        ),
    }
    for search, made in searches.items():
        seconds[search], fits[search] = median_time(
            lambda m=made: make(**options, search=m).fit(case.base, case.val), repeats
        )
    after = fits["surrogate"]
    Xs, ys = _scoring_points(after, case.val)
    lo, hi = (math.log(s) for s in (min(after.default_grid), max(after.default_grid)))
    step = (hi - lo) / (REFERENCE_SCALES - 1)

    def losses(fitted: PEG | PEP, scale: float) -> Tensor:
        outputs = fitted.ensemble_at(scale).member_logits(Xs, 512, progress=False)
        if not torch.isfinite(outputs).all():
            return torch.full((len(ys),), math.inf, dtype=torch.float64)
        return _point_losses(outputs, ys, case.regression)

    limit = math.ceil(EXTEND_DECADES * math.log(10) / step)
    start = time.perf_counter()
    reference = {math.exp(lo + i * step): None for i in range(REFERENCE_SCALES)}
    reference = {s: losses(after, s) for s in reference}
    for edge, sign in ((lo, -1), (hi, 1)):  # best on an edge: go on at the same spacing
        k = 1
        while _best(reference) == math.exp(edge + sign * (k - 1) * step) and k <= limit:
            scale = math.exp(edge + sign * k * step)
            reference[scale] = losses(after, scale)
            k += 1
    dense = time.perf_counter() - start
    best = _best(reference)
    name = "η" if method == "PEG" else "σ"
    print(f"  {method}-15: dense reference {len(reference)} scales in {dense:.1f} s, best "
          f"{name} = {best:.3g}, score {float(reference[best].mean()):.4f}")  # fmt: skip
    labels = {
        "golden": "before: golden, raced",
        "surrogate-1024": "issue 38's, 1024 points",  # the default before issue 49
        "surrogate": "after: surrogate",
    }
    for search, label in labels.items():
        fitted = fits[search]
        scale = fitted.eta_ if method == "PEG" else fitted.sigma_
        chosen = losses(fitted, scale)
        d = chosen - reference[best]
        se = float(d.std()) / math.sqrt(len(d))
        gap = float(d.mean()) / se if se > 0 else 0.0
        verdict = "yes" if float(d.mean()) <= se else "NO"
        print(f"  {label:24} {name} = {scale:9.3g}  scored {len(fitted.search_):2d}  score "
              f"{float(chosen.mean()):.4f}  (score - best)/SE {gap:6.2f}  within 1 SE: {verdict:3}"
              f"  {seconds[search]:6.2f} s = {seconds[search] / epoch:5.2f} epochs = "
              f"{seconds[search] / ts_seconds:6.1f} × temperature scaling")  # fmt: skip
    print(f"  speed-up of the search (golden / surrogate, whole fit): "
          f"{seconds['golden'] / seconds['surrogate']:.2f} ×")  # fmt: skip


def _points_bases(names: list[str]) -> dict[str, tuple[nn.Module, Any, Any]]:
    """(base, val, test) per name: "digits" (the preset's split) and "fashion-mnist-<n>"."""
    bases = {}
    for name in names:
        if name.startswith("demo-"):  # the over-fitted `peg demo` base, n of its val split
            case, n = demo(), int(name.rsplit("-", 1)[1])
            X, y = datasets.load("fashion-mnist", "test")
            bases[name] = (case.base, (case.val[0][:n], case.val[1][:n]), (X[:5000], y[:5000]))
        elif name == "digits":
            run = SeedRun(dataclasses.replace(PRESETS["digits"], methods=()), 0,
                          CACHE / "paper-tables", progress=False)  # fmt: skip
            bases[name] = (run.bases.get("single").eval(), run.val, run.test)
        else:
            n = int(name.rsplit("-", 1)[1])
            model, val = fashion_mnist(n)
            X, y = datasets.load("fashion-mnist", "test")
            bases[name] = (model, val, (X[4000:], y[4000:]))
    return bases


def _setting(token: str) -> ScaleSearch:
    """A search setting by its name on the command line: an integer N is issue 38's search
    (up to 3 exact scorings, each on the first N scoring points: "1024" is the default before
    issue 49), "default" today's default, "key=value,..." the default with these ScaleSearch
    options (e.g. "first_points=128,scorings=3")."""
    if token == "default":
        return ScaleSearch()
    if "=" in token:
        options = dict(item.split("=", 1) for item in token.split(","))
        return ScaleSearch(**{k: (float if "." in v else int)(v) for k, v in options.items()})
    return ScaleSearch(exact_points=int(token), first_points=int(token), scorings=3)


def _points_fit(
    make: type,
    seed: int,
    setting: str,
    name: str,
    base: nn.Module,
    val: Any,
    test: Any,
    cache: bool,
) -> dict[str, Any]:
    """One fit with a search setting: its scale, points scored, fit seconds and per-point test
    losses. An integer setting (issue 38's search, fixed code) is cached under
    .peg-cache/scale-search/points/ when `cache`: the reference is fitted once per machine."""
    path = CACHE / "scale-search" / "points" / f"{name}-{make.__name__}-{seed}-{setting}.pt"
    if cache and setting.isdigit() and path.exists():
        return {**torch.load(path), "cached": " (cached)"}
    start = time.perf_counter()
    fitted = make(n_members=15, seed=seed, progress=False, search=_setting(setting)).fit(base, val)
    took = time.perf_counter() - start
    out = fitted.ensemble_.member_logits(test[0], 512, progress=False)
    run = {
        "losses": _point_losses(out, test[1], False),
        "scale": float(getattr(fitted, f"{make.scale_name}_")),
        "points": list(fitted.search_points_.values()),
        "took": took,
    }
    if cache and setting.isdigit():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(run, path)
    return {**run, "cached": ""}


def points_main(
    points: list[str],
    seeds: list[int],
    names: list[str],
    methods: tuple[type, ...] = (PEG, PEP),
    cache: bool = True,
) -> None:
    """The chosen scale's test NLL with each search setting (`_setting`), against the first's."""
    print(f"machine: {machine()}; settings {points}, seeds {seeds}")
    for name, (base, val, test) in _points_bases(names).items():
        with torch.no_grad():
            nll = float(nn.functional.cross_entropy(base(test[0]), test[1]))
        print(f"\n## {name}: {len(val[1])} validation points, {len(test[1])} test points; "
              f"the base's test NLL {nll:.4f}")  # fmt: skip
        for make in methods:
            losses: dict[str, list[Tensor]] = {p: [] for p in points}
            for seed in seeds:
                for p in points:
                    run = _points_fit(make, seed, p, name, base, val, test, cache)
                    losses[p].append(run["losses"])
                    d = losses[p][-1] - losses[points[0]][-1]
                    se = float(d.std()) / math.sqrt(len(d))
                    scale, took = run["scale"], run["took"]
                    scored = "/".join(str(k) for k in run["points"])
                    print(f"  {make.__name__}-15 seed {seed} {p:>9}: "
                          f"{make.scale_name} = {scale:9.3g}  scored {len(run['points'])} on "
                          f"{scored:9}  fit {took:6.2f} s{run['cached']} test NLL "
                          f"{float(losses[p][-1].mean()):.4f}  - {points[0]}'s: "
                          f"{float(d.mean()):+.4f} (SE {se:.4f})")  # fmt: skip
            gain = nll - float(torch.stack(losses[points[0]]).mean())
            bar = max(0.002, 0.05 * gain)
            for p in points[1:]:
                d = torch.stack(losses[p]).mean(0) - torch.stack(losses[points[0]]).mean(0)
                se = float(d.std()) / math.sqrt(len(d))
                gap = float(d.mean()) / se if se > 0 else 0.0
                verdict = "within" if float(d.mean()) <= bar else "OUTSIDE"
                print(f"  {make.__name__}-15 pooled over seeds: {p} - {points[0]}: "
                      f"{float(d.mean()):+.4f} test NLL (SE {se:.4f}, {gap:+.2f} SE); the bar "
                      f"max(0.002, 5% of the gain {gain:.4f}) = {bar:.4f}: {verdict}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bases", nargs="+", default=list(BASES), choices=list(BASES))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the digits base only")
    parser.add_argument(
        "--exact-points", nargs="+", help="compare these search settings instead (`_setting`)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=["PEG", "PEP"], choices=["PEG", "PEP"])
    parser.add_argument(
        "--points-bases", nargs="+", default=["digits", "fashion-mnist-2000", "fashion-mnist-4000"]
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="--exact-points: refit an integer setting (issue 38's search) even where its "
        "result is cached under .peg-cache/scale-search/points/ (a fit's time shows '(cached)' "
        "when it comes from there)",
    )
    parser.add_argument(
        "--table",
        nargs="+",
        help="the default against the exhaustive search on these cases (`_scale_table`), "
        "<base>-<validation points> of _scale_bases.BASES, e.g. cifar-cnn-2000 hf-vit-2000",
    )
    parser.add_argument(
        "--settings", nargs="+", default=["default"], help="--table: the settings compared"
    )
    parser.add_argument("--tag", default="dev", help="--table: the library state's tag")
    parser.add_argument(
        "--cached-only", action="store_true", help="--table: print the cached records, fit nothing"
    )
    args = parser.parse_args()
    if args.table:
        table_main(args.table, args.seeds, args.settings, args.tag, args.cached_only)
        return
    if args.exact_points:
        methods = tuple({"PEG": PEG, "PEP": PEP}[m] for m in args.methods)
        points_main(args.exact_points, args.seeds, args.points_bases, methods, not args.no_cache)
        return
    if args.quick:
        args.bases = ["digits"]
    print(f"machine: {machine()}; median of {args.repeats}")
    for name in args.bases:
        case = BASES[name]()
        case.epoch()  # warm-up, untimed
        epoch, _ = median_time(case.epoch, args.repeats)
        ts = 0.0
        if not case.regression:
            ts, _ = median_time(
                lambda c=case: TemperatureScaling().fit(c.base, c.val), args.repeats
            )
        print(f"\n## {case.label}: {len(case.val[1])} validation points, "
              f"{len(case.train[1])} training; one epoch {epoch:.2f} s; temperature scaling "
              f"{ts:.2f} s")  # fmt: skip
        for method in ("PEG", "PEP"):
            _compare(case, method, args.repeats, ts if ts > 0 else math.nan, epoch)


if __name__ == "__main__":
    main()
