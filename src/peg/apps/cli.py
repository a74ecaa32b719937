"""The `peg` command (`[project.scripts]`; also `python -m peg.apps`)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from collections.abc import Callable

from peg import distributed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="peg", description="Cheap, well-calibrated ensembles from a trained PyTorch model."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="train a base model and compare Base, Temp-scaled, PEP-15 and PEG-15",
        description="Train a base model, build PEG and PEP ensembles and a temperature-scaled "
        "base on the validation split, print the paper-style table on the test set, and write "
        "results.json, results.md and figures.",
    )
    demo.add_argument(
        "--data",
        default="fashion-mnist",
        choices=["fashion-mnist", "digits", "moons", "two-moons", "three-moons", "linear"],
        help="data set (fashion-mnist falls back to digits when not installed); toy sets also "
        "draw the decision-boundary figure (default: fashion-mnist)",
    )
    demo.add_argument("--quick", action="store_true", help="a smaller run (under a minute)")
    demo.add_argument("--out", default="peg-demo", help="output folder (default: peg-demo)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    tables = sub.add_parser(
        "paper-tables",
        help="reproduce the structure of the PEG paper's Tables 1, 3, 5, 7 and 12",
        description="Train SGD models, a deep ensemble and SWA/SWAG per seed, build PEG and PEP "
        "on top of each as the PEG paper does, and write the tables (mean ± std over seeds) as "
        "markdown and JSON. Trained models and test logits are cached: a rerun resumes.",
    )
    tables.add_argument(
        "--preset",
        default="fashion-mnist",
        choices=["fashion-mnist", "fashion-mnist-overfit", "digits"],
        help="data, model and recipes (default: fashion-mnist)",
    )
    tables.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="default: 0 1 2")
    tables.add_argument("--tables", nargs="+", help="a subset, e.g. 1 3 (default: all)")
    tables.add_argument("--out", default="results", help="output folder (default: results)")
    tables.add_argument(
        "--cache",
        default=".peg-cache/paper-tables",
        help="checkpoints and cached logits (default: .peg-cache/paper-tables)",
    )
    tables.add_argument("--no-progress", action="store_true", help="hide progress bars")
    bench = sub.add_parser(
        "bench",
        help="run a benchmark spec (YAML) or a preset: quick, fashion-mnist, cifar10-cpu, cifar10",
        description="Train or load base models, build every method of the spec, evaluate on the "
        "test, shifted and OOD sets, and write results/<name>/results.{json,md}. Member logits "
        "are cached, so a rerun or an interrupted run resumes.",
    )
    bench.add_argument(
        "spec", help="a YAML file, or the name of a preset (peg/apps/configs/NAME.yaml)"
    )
    bench.add_argument("--seeds", type=int, nargs="+", help="override the spec's seeds")
    bench.add_argument("--out", default="results", help="output folder (default: results)")
    bench.add_argument(
        "--cache", default=".peg-cache/bench", help="cache folder (default: .peg-cache/bench)"
    )
    bench.add_argument("--no-progress", action="store_true", help="hide progress bars")
    compare = sub.add_parser(
        "compare",
        help="which post-hoc method for your model? fit TS, PEP, PEG, ... on its validation "
        "data and compare them on its test data",
        description="Fit post-hoc methods on a trained model and validation data, evaluate them "
        "on test data (and shifted and OOD sets), and print one table: fit time, forwards per "
        "input and memory beside every metric; writes results.{json,md} and reliability "
        "diagrams to --out. Data: a data set name (NAME or NAME:SPLIT), a .npz file (arrays x, "
        "y), a .pt file of tensors (a dict with x, y or a pair), or module:function returning "
        "a Dataset, DataLoader or (X, y). See docs/compare.md.",
    )
    compare.add_argument(
        "--model", required=True, help="module:function returning the trained nn.Module"
    )
    compare.add_argument("--val", required=True, help="validation data the methods are fitted on")
    compare.add_argument("--test", required=True, help="test data")
    compare.add_argument("--shifted", nargs="+", help="shifted labelled sets, [NAME=]DATA each")
    compare.add_argument("--ood", nargs="+", help="out-of-distribution inputs, [NAME=]DATA each")
    compare.add_argument(
        "--methods", nargs="+", help="named methods, e.g. TS PEG 'PEG + TS' (default: all of "
        "Model, TS, PEP, PEG, 'PEG + TS', 'MC dropout' if the model has dropout, "
        "'Last-layer PEG')",
    )  # fmt: skip
    compare.add_argument("--ood-score", default="entropy", help="OOD score (default: entropy)")
    compare.add_argument(
        "--metrics", nargs="+", help="metric columns of the tables, e.g. nll error ece aurc "
        "(default: nll error brier ece adaptive_ece classwise_ece aurc augrc)",
    )  # fmt: skip
    compare.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    compare.add_argument("--batch-size", type=int, default=512, help="default: 512")
    compare.add_argument(
        "--out", default="peg-compare", help="output folder (default: peg-compare)"
    )
    compare.add_argument(
        "--resume",
        action="store_true",
        help="take back the methods an earlier run with the same arguments saved in --out",
    )
    compare.add_argument("--no-progress", action="store_true", help="hide progress bars")
    # ---- peg select (peg.apps.select.command)
    _select_parser(sub)
    # ---- peg diversity (Fort et al. 2019 loss-landscape analyses; see peg.apps.diversity)
    diversity = sub.add_parser(
        "diversity",
        help="function-space diversity: trajectories, t-SNE, diversity-accuracy plane, "
        "radial landscape cut, with PEG, PEP, SWAG-Diag and subspace samplers",
        description="Train models from several random initialisations (cached), build every "
        "method around their solutions, and write figures and JSON (cosine similarity, "
        "disagreement, t-SNE, diversity vs accuracy, ensemble size, radial landscape cut) plus "
        "a table of diversity and ensemble accuracy/NLL per method. Fashion-MNIST by default "
        "(scikit-learn digits when it is not installed).",
    )
    diversity.add_argument(
        "spec",
        nargs="?",
        help="a YAML file of settings, or a preset's name (default: built-in settings)",
    )
    diversity.add_argument(
        "--quick", action="store_true", help="digits, few epochs (well under a minute)"
    )
    diversity.add_argument(
        "--out", default="results/diversity", help="output folder (default: results/diversity)"
    )
    diversity.add_argument(
        "--cache",
        default=".peg-cache/diversity",
        help="cached trajectories (default: .peg-cache/diversity)",
    )
    diversity.add_argument("--no-progress", action="store_true", help="hide progress bars")
    # ---- end peg diversity
    perf = sub.add_parser(
        "bench-perf",
        help="run the performance benchmarks (benchmarks/*.py of a checkout) and keep the output",
        description="Run the scripts in the checkout's benchmarks/ folder one after another "
        "(inference strategies, PEG creation cost, streaming metrics, memory, Packed speed), "
        "show their output and write each to results/benchmarks/<name>.txt with the command and "
        "commit. Every figure is a ratio measured in one run, on the machine it names.",
    )
    perf.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    perf.add_argument("--quick", action="store_true", help="smoke runs; writes no files")
    perf.add_argument("--dir", default="benchmarks", help="scripts folder (default: benchmarks)")
    perf.add_argument(
        "--out", help="output folder (default: results/benchmarks; none with --quick)"
    )
    args = parser.parse_args(argv)
    command = " ".join(["peg", *(sys.argv[1:] if argv is None else argv)])
    try:
        status = _run(args, command)
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        # bad input named by the library (specs, presets, folders, options): a message, not a
        # traceback (PEG_TRACEBACK=1 shows it); exit status 2 as argparse's own errors
        if os.environ.get("PEG_TRACEBACK") and not distributed.joined():
            raise
        if not distributed.joined():
            parser.exit(2, f"peg {args.command}: error: {e}\n")
        sys.stderr.write(f"peg {args.command}: error: {e}\n")
        status = 2
    except Exception:
        if not distributed.joined():
            raise
        traceback.print_exc()  # e.g. a RankFailure naming the rank that failed
        status = 1
    if distributed.joined():  # under torchrun: end without the teardown that can abort
        distributed.end_process(status)
    return status


def _demo(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.demo import run

    data = "two-moons" if args.data == "moons" else args.data
    run(
        data=data,
        quick=args.quick,
        out=args.out,
        seed=args.seed,
        progress=progress,
        command=command,
    )
    return 0


def _bench(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.bench.runner import run_spec
    from peg.apps.bench.spec import find_spec, load_specs, load_uci_spec
    from peg.apps.bench.uci import run_uci

    path = find_spec(args.spec)
    uci = load_uci_spec(path)
    if uci is not None:
        run_uci(**uci, out=args.out, cache=args.cache, progress=progress, command=command)
        return 0
    for spec in load_specs(path):
        if args.seeds:
            spec = dataclasses.replace(spec, seeds=tuple(args.seeds))
        run_spec(spec, args.out, args.cache, progress=progress, command=command)
    return 0


def _paper_tables(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.bench.paper import run

    run(
        preset=args.preset,
        seeds=args.seeds,
        out=args.out,
        cache=args.cache,
        tables=args.tables,
        progress=progress,
        command=command,
    )
    return 0


def _compare(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.compare import compare, sources

    model = sources.model(args.model)
    val, test = sources.val_and_test(args.val, args.test, args.seed, print)
    result = compare(
        model,
        val,
        test,
        args.methods,
        shifted=sources.named(args.shifted, "--shifted", labelled=True),
        ood=sources.named(args.ood, "--ood", labelled=False),
        ood_score=args.ood_score,
        metrics=args.metrics,
        seed=args.seed,
        batch_size=args.batch_size,
        progress=progress,
        out=args.out,
        command=command,
        resume=args.resume,
    )
    print()
    print(result.to_markdown())
    return _compare_status(result)


def _compare_status(result: object) -> int:
    """0, or 3 when some methods failed (each said on stderr; the table has the others)."""
    failed = getattr(result, "failed", {})
    for name, error in failed.items():
        sys.stderr.write(f"peg compare: {name} failed: {error['type']}: {error['message']}\n")
    return 3 if failed else 0


def _select_parser(sub: argparse._SubParsersAction) -> None:
    select = sub.add_parser(
        "select",
        help="the best post-hoc predictor for your model, chosen by cross-validation on its "
        "validation data only (peg.AutoSelect)",
        description="Cross-fit TS, vector/matrix scaling, Dirichlet, PEG, PEP, ... on K folds "
        "of the validation data, keep the cheapest within one paired SE of the best, refit it, "
        "print the report; --save DIR writes results.{json,md} and chosen.peg. See "
        "docs/select.md.",
    )
    select.add_argument("--model", required=True, help="module:function returning the model")
    select.add_argument("--val", required=True, help="validation data (as peg compare's)")
    select.add_argument("--candidates", nargs="+", help="named methods (default: see the guide)")
    select.add_argument("--cv", type=int, default=5, help="folds (default: 5)")
    select.add_argument("--criterion", default="nll", help="nll or brier (default: nll)")
    select.add_argument("--max-forwards", type=float, help="prediction budget, forwards/input")
    select.add_argument("--max-fit-seconds", type=float, help="fit budget in seconds")
    select.add_argument("--best", action="store_true", help="the best CV score, not one-SE")
    select.add_argument("--nested", action="store_true", help="nested-CV estimate (cv x cost)")
    select.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    select.add_argument("--batch-size", type=int, default=512, help="default: 512")
    select.add_argument("--save", help="folder for results.json, results.md and chosen.peg")
    select.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _select(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.select.command import run

    return run(args, command, progress)


def _diversity(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.diversity import study

    config = study.load_config(args.spec, quick=args.quick)
    study.run(config, out=args.out, cache=args.cache, progress=progress, command=command)
    return 0


def _bench_perf(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.bench.perf import run_benchmarks

    out = args.out or (None if args.quick else "results/benchmarks")
    status = run_benchmarks(args.names, args.dir, out, args.quick)
    return 1 if any(status.values()) else 0


# each command's handler; the applications are imported only when their command runs
COMMANDS: dict[str, Callable[[argparse.Namespace, str, bool | None], int]] = {
    "demo": _demo,
    "bench": _bench,
    "paper-tables": _paper_tables,
    "compare": _compare,
    "select": _select,
    "diversity": _diversity,
    "bench-perf": _bench_perf,
}


def _run(args: argparse.Namespace, command: str) -> int:
    """Carry out one parsed `peg` command."""
    progress = False if getattr(args, "no_progress", False) else None
    return COMMANDS[args.command](args, command, progress)


if __name__ == "__main__":
    sys.exit(main())
