"""`peg bench SPEC.yaml`: train or load the bases, build every method, evaluate, tabulate.

Per seed (`peg.apps.bench.seed.SeedRun`): the training split is divided (stratified, seeded)
into training and validation parts; bases are trained lazily and checkpointed
(`peg.apps.bench.bases`); each method is built on its base through the method registry
(`peg.apps.registry`) and predicts every evaluation set: the test split, its shifted versions
(rotations, corruptions at chosen severities) and the OOD sets. Member logits are cached per
(seed, method, data set) as safetensors, so metrics and tables are recomputed without re-running
models and an interrupted run resumes where it stopped. Metrics (`peg.apps.scores`): NLL, error,
Brier, ECE, MCE, adaptive and classwise ECE, AURC and AUGRC on the test and shifted sets, all in
results.json (the spec's `metrics:` chooses the rows of results.md); AUROC, AUPR (OOD
positive) and FPR95 of the OOD sets against the test set.

Writes `results/<name>/results.json` (shape: `{"command", "commit", "machine", "datasets":
{DATASET: {METHOD: {METRIC: {"mean", "std", "n"}}}}, ...}`) and `results/<name>/results.md`
(one table per data set; rows metrics, columns methods; mean ± std over seeds) and
`results/<name>/reliability-test.png` and `risk-coverage-test.png` (reliability diagrams and
risk–coverage curves on the test set of the first seed, of the spec's `figures` columns: by
default every column).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peg import distributed, plots
from peg.apps import registry
from peg.apps.bench.folders import claim_bench
from peg.apps.bench.seed import SeedRun, fit_images
from peg.apps.bench.spec import BASE_PATTERN, SWAG_BASES, MethodSpec, Spec
from peg.apps.bench.tables import COST_ROWS, OOD_ROWS, markdown_table, metric_rows
from peg.apps.conformal import conformal_cells, conformal_table
from peg.apps.results import write_results
from peg.apps.scores import labelled_metrics, ood_detection
from peg.metrics import reliability, risk_coverage_curve
from peg.utils.env import git_commit, machine
from peg.utils.progress import bar


def check_methods(spec: Spec) -> None:
    """Configure every method once (`peg.apps.registry`) so bad options fail before any
    training."""
    site = registry.Site(seed=spec.seeds[0], progress=False, score_points=spec.score_points)
    registry.check_all(((m.name, m.method, m.options) for m in spec.methods), site)


def _summary(values: list[float]) -> dict[str, float]:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "n": len(values)}


def _family(spec: Spec, method: MethodSpec) -> str:
    """The training a method shares with others: "deep-ensemble" (Single, DeepEns-N and what is
    built on them), "swag" (SWA, SWAG, SWAG-Diag and what is built on them), or the method's own
    key (Packed, EMP and ECMP each train a model of their own); a method on an earlier column
    is in that column's family."""
    by_name = {m.name: m for m in spec.methods}
    while not BASE_PATTERN.match(method.base):
        method = by_name[method.base]
    if registry.entry(method.method).trains:
        return method.key
    return "swag" if method.base in SWAG_BASES else "deep-ensemble"


def work_units(spec: Spec) -> list[tuple[int, list[MethodSpec]]]:
    """(seed, methods) units that share no training, family by family, then seed by seed.

    Under torchrun, unit i goes to rank i mod W, in rounds of W units: with a number of seeds
    that is a multiple of W, the units of one round are one family on different seeds, so the
    ranks of a round do the same amount of work.
    """
    families: dict[str, list[MethodSpec]] = {}
    for method in spec.methods:
        families.setdefault(_family(spec, method), []).append(method)
    return [(seed, methods) for methods in families.values() for seed in spec.seeds]


def _fill_cache(
    spec: Spec,
    cache: Path,
    root: str | None,
    progress: bool | None,
    say: Callable[[str], None],
) -> None:
    """Under torchrun: every rank caches the member logits of its share of `work_units`.

    The ranks meet after every round (`distributed.guarded`): a rank that raised stops every
    rank with a `RankFailure` naming it, before the next round starts.
    """
    rank, size = distributed.world()
    units = work_units(spec)
    runs: dict[int, SeedRun] = {}

    def do(seed: int, methods: list[MethodSpec]) -> None:
        say(f"{spec.name}: rank {rank}: seed {seed}: {', '.join(m.name for m in methods)}")
        if seed not in runs:
            runs[seed] = SeedRun(spec, seed, cache, root, progress)
        for method in bar(methods, f"{spec.name} seed {seed} rank {rank}", len(methods), progress):
            runs[seed].logits(method)

    for first in range(0, len(units), size):
        if first + rank < len(units):
            seed, methods = units[first + rank]
            task = functools.partial(do, seed, methods)
            what = f"{spec.name}, seed {seed}, {', '.join(m.name for m in methods)}"
        else:  # the last round has fewer units than ranks
            task, what = (lambda: None), f"{spec.name}, idle"
        distributed.guarded(task, what)


def run_spec(
    spec: Spec,
    out: str | Path = "results",
    cache: str | Path = ".peg-cache/bench",
    root: str | None = None,
    progress: bool | None = None,
    command: str | None = None,
    say: Callable[[str], None] = print,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run one benchmark; write and return its results (see the module docstring).

    `out/<name>` is refused before any work where it is a non-empty folder peg bench did not
    make, unless `overwrite` (`peg.apps.bench.folders`).

    Under torchrun (`peg.distributed.world()` finds W > 1 ranks) the ranks share the work units
    (`work_units`) and fill the cache; then rank 0 alone computes the metrics from it and
    writes the results, which every rank returns: those of one process (`commit`,
    `wall_seconds` and `command` aside). If any rank fails, every rank raises
    `peg.distributed.RankFailure` naming it, and no results are written (the logits cached so
    far stay: a rerun resumes from them).
    """
    check_methods(spec)
    claim_bench(out, spec.name, overwrite)
    started = time.perf_counter()
    rank, size = distributed.world()

    def finish() -> dict[str, Any]:
        per_seed, costs, bases, curves = _per_seed(spec, Path(cache), root, progress, say)
        wall = time.perf_counter() - started
        results = _write(spec, per_seed, costs, bases, out, command, wall, say)
        _figures(spec, curves, Path(out) / spec.name)
        return results

    if size == 1:
        return finish()
    _fill_cache(spec, Path(cache), root, progress, say)
    return distributed.guarded(finish if rank == 0 else lambda: None, f"{spec.name}, results")[0]


Values = dict[str, dict[str, list[float]]]
Curves = dict[str, dict[str, dict[str, Any]]]  # figure → column → curve data


def _figures(spec: Spec, curves: Curves, folder: Path) -> None:
    """The reliability diagrams and risk–coverage curves of the first seed's test set."""
    title = f"{spec.name}: test set, seed {spec.seeds[0]}"
    plots.reliability_diagram(curves["reliability"], folder / "reliability-test.png", title)
    plots.risk_coverage(curves["risk-coverage"], folder / "risk-coverage-test.png", title=title)


def _per_seed(
    spec: Spec, cache: Path, root: str | None, progress: bool | None, say: Callable[[str], None]
) -> tuple[dict[str, Values], Values, dict[str, dict[str, list[float]]], Curves]:
    """Data set → method → metric → one value per seed, from the member logits (built and
    cached where the cache does not have them yet); method → cost (`COST_ROWS`, with the
    chosen η, σ, T) → one value per seed; seed → how the deep-ensemble members trained;
    figure → method → curve data on the test set of the first seed (`_figures`)."""
    per_seed: dict[str, Values] = {}
    costs: Values = {}
    bases: dict[str, dict[str, list[float]]] = {}
    curves: Curves = {"reliability": {}, "risk-coverage": {}}
    drawn = spec.figures or [m.name for m in spec.methods]
    for seed in spec.seeds:
        say(f"{spec.name}: seed {seed}")
        run = SeedRun(spec, seed, cache, root, progress)
        y = run.test[1]
        for method in bar(spec.methods, f"{spec.name} seed {seed}", len(spec.methods), progress):
            logits = run.logits(method)
            if seed == spec.seeds[0] and method.name in drawn:
                curves["reliability"][method.name] = reliability(logits["test"], y)
                curves["risk-coverage"][method.name] = risk_coverage_curve(logits["test"], y)
            info = {k: float("nan") for k, *_ in COST_ROWS} | run.info(method)
            if method.base in costs:  # on an earlier column: its forwards are made too
                info["forwards"] = max(info["forwards"], costs[method.base]["forwards"][-1])
            for k, v in info.items():
                costs.setdefault(method.name, {}).setdefault(k, []).append(float(v))
            for name, value in logits.items():
                cell = per_seed.setdefault(name, {}).setdefault(method.name, {})
                if name.endswith("(OOD)"):
                    m = ood_detection(logits["test"], value, spec.ood_score)
                else:
                    m = labelled_metrics(value, y)
                for k, v in m.items():
                    cell.setdefault(k, []).append(v)
            if spec.conformal is not None and spec.conformal.applies(method.name):
                for name, m in conformal_cells(logits, y, spec.conformal).items():
                    for k, v in m.items():
                        per_seed[name][method.name].setdefault(k, []).append(v)
        roots = {spec.root(m) for m in spec.methods}
        if any(r == "single" or r.startswith("deepens-") for r in roots):
            bases[f"seed-{seed}"] = run.bases.training()
    return per_seed, costs, bases, curves


def _write(
    spec: Spec,
    per_seed: dict[str, Values],
    costs: Values,
    bases: dict[str, dict[str, list[float]]],
    out: str | Path,
    command: str | None,
    wall: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The results (see the module docstring), written to results.json and results.md."""
    results = {
        "command": command or f"peg bench {spec.name}",
        "commit": git_commit(),
        "machine": machine(),
        "name": spec.name,
        "data": spec.data,
        "model": spec.model,
        "seeds": list(spec.seeds),
        "wall_seconds": wall,
        "ood": {"positive": "ood", "score": spec.ood_score, "against": "test"},
        "datasets": {
            d: {m: {k: _summary(v) for k, v in cell.items()} for m, cell in methods.items()}
            for d, methods in per_seed.items()
        },
        "per_seed": per_seed,
        "costs": costs,
        "train": spec.train.to_dict(),
        "base_training": bases,
    }
    text = report(results, spec)
    write_results(Path(out) / spec.name, results, text)
    say(text)
    return results


def report(results: dict[str, Any], spec: Spec) -> str:
    """Markdown: a header with provenance, then one table per data set."""
    lines = [
        f"# {spec.name}: {spec.data}, {spec.model['name']}",
        "",
        f"Seeds {results['seeds']} (mean ± std). Command: `{results['command']}`; commit "
        f"{results['commit']}; machine: {results['machine']}; wall time "
        f"{results['wall_seconds']:.0f} s (cached logits are not recomputed). OOD sets: OOD is "
        f"the positive class, score = {spec.ood_score}, against the test set.",
        "",
    ]
    for dataset, methods in results["per_seed"].items():
        rows = OOD_ROWS if dataset.endswith("(OOD)") else metric_rows(spec.metrics)
        lines += [f"## {dataset}", "", markdown_table(methods, rows), ""]
        if spec.conformal is not None and not dataset.endswith("(OOD)"):
            lines += conformal_table(methods, spec.conformal)
    if results.get("costs"):
        lines += [
            "## costs",
            "",
            "Fit seconds: the post-hoc fit on the validation split (a base's training is not "
            "counted; a column on an earlier column counts that column's fit too). Predict "
            "seconds: the test set. Forwards: members (passes of the network) per input.",
            "",
            markdown_table(results["costs"], COST_ROWS),
            "",
        ]
    for seed, trained in results.get("base_training", {}).items():
        done = "; ".join(f"{k} {[int(v) for v in values]}" for k, values in trained.items())
        lines += [f"Base training (deep-ensemble members), {seed}: {done}", ""]
    return "\n".join(lines)


__all__ = ["SeedRun", "check_methods", "fit_images", "run_spec", "work_units"]
