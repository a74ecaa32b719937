"""The `peg` command (`[project.scripts]`; also `python -m peg.apps`).

Each command is one `Command` in `COMMANDS`: its help, its arguments (`_<name>_arguments`, or
`peg.apps.arguments`, built without importing torch: `peg --help` starts at once) and
the function that runs it (`_<name>`, which imports its application only then). Adding a
command is adding those two functions and one entry.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from peg.apps import arguments, input_checks, presets
from peg.apps._warnings import one_line_warnings
from peg.apps.arguments import no_progress as _no_progress
from peg.apps.arguments import overwrite as _overwrite

Parser = argparse.ArgumentParser


@dataclass(frozen=True)
class Command:
    """One `peg` command: `help` (in `peg -h`), `description` (in `peg NAME -h`), `arguments`
    (adds its options to its parser) and `run(args, command, progress) -> exit status`."""

    help: str
    description: str
    arguments: Callable[[Parser], None]
    run: Callable[[argparse.Namespace, str, bool | None], int]


# ---------------------------------------------------------------- peg demo
def _demo_arguments(p: Parser) -> None:
    p.add_argument(
        "--data",
        default="fashion-mnist",
        choices=["fashion-mnist", "digits", "moons", "two-moons", "three-moons", "linear"],
        help="data set (fashion-mnist falls back to digits when not installed); toy sets also "
        "draw the decision-boundary figure (default: fashion-mnist)",
    )
    p.add_argument("--quick", action="store_true", help="a smaller run (under a minute)")
    p.add_argument("--out", default="peg-demo", help="output folder (default: peg-demo)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    _overwrite(p, "--out", "demo")
    _no_progress(p)


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
        overwrite=args.overwrite,
    )
    return 0


# ---------------------------------------------------------------- peg paper-tables
def _paper_tables_arguments(p: Parser) -> None:
    p.add_argument(
        "--preset",
        default="fashion-mnist",
        choices=["fashion-mnist", "fashion-mnist-overfit", "digits"],
        help="data, model and recipes (default: fashion-mnist)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="default: 0 1 2")
    p.add_argument("--tables", nargs="+", help="a subset, e.g. 1 3 (default: all)")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.add_argument(
        "--cache",
        default=".peg-cache/paper-tables",
        help="checkpoints and cached logits (default: .peg-cache/paper-tables)",
    )
    _overwrite(p, "--out", "paper-tables")
    _no_progress(p)


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
        overwrite=args.overwrite,
    )
    return 0


# ---------------------------------------------------------------- peg bench
def _bench_arguments(p: Parser) -> None:
    p.add_argument("spec", help=f"a YAML file, or a preset: {', '.join(presets.names())}")
    p.add_argument("--seeds", type=int, nargs="+", help="override the spec's seeds")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.add_argument(
        "--cache", default=".peg-cache/bench", help="cache folder (default: .peg-cache/bench)"
    )
    _overwrite(p, "--out", "bench")
    _no_progress(p)


def _bench(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.bench.folders import claim_bench
    from peg.apps.bench.runner import run_spec
    from peg.apps.bench.spec import find_spec, load_specs, load_uci_spec
    from peg.apps.bench.uci import run_uci

    path = find_spec(args.spec)
    uci = load_uci_spec(path)
    if uci is not None:
        run_uci(
            **uci,
            out=args.out,
            cache=args.cache,
            progress=progress,
            command=command,
            overwrite=args.overwrite,
        )
        return 0
    specs = load_specs(path)
    for spec in specs:  # every spec's folder before the first runs
        claim_bench(args.out, spec.name, args.overwrite)
    for spec in specs:
        if args.seeds:
            spec = dataclasses.replace(spec, seeds=tuple(args.seeds))
        run_spec(
            spec, args.out, args.cache, progress=progress, command=command, overwrite=args.overwrite
        )
    return 0


# ---------------------------------------------------------------- peg compare
def _compare(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.compare.command import run

    return run(args, command, progress)


# ---------------------------------------------------------------- peg select
def _select(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.select.command import run

    return run(args, command, progress)


# ---------------------------------------------------------------- peg monitor, peg apply
def _monitor(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.monitor.command import run

    return run(args, command, progress)


def _apply(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.apply import run

    return run(args, command, progress)


# ---------------------------------------------------------------- peg diversity
def _diversity_arguments(p: Parser) -> None:
    p.add_argument(
        "spec",
        nargs="?",
        help="a YAML file of settings, or a preset's name (default: built-in settings)",
    )
    p.add_argument("--quick", action="store_true", help="digits, few epochs (well under a minute)")
    p.add_argument(
        "--out", default="results/diversity", help="output folder (default: results/diversity)"
    )
    p.add_argument(
        "--cache",
        default=".peg-cache/diversity",
        help="cached trajectories (default: .peg-cache/diversity)",
    )
    _overwrite(p, "--out", "diversity")
    _no_progress(p)


def _diversity(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.diversity import study

    config = study.load_config(args.spec, quick=args.quick)
    study.run(
        config,
        out=args.out,
        cache=args.cache,
        progress=progress,
        command=command,
        overwrite=args.overwrite,
    )
    return 0


# ---------------------------------------------------------------- peg bench-perf
def _bench_perf_arguments(p: Parser) -> None:
    p.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    p.add_argument("--quick", action="store_true", help="smoke runs; writes no files")
    p.add_argument("--dir", default="benchmarks", help="scripts folder (default: benchmarks)")
    p.add_argument("--out", help="output folder (default: results/benchmarks; none with --quick)")


def _bench_perf(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.bench.perf import run_benchmarks

    out = args.out or (None if args.quick else "results/benchmarks")
    status = run_benchmarks(args.names, args.dir, out, args.quick)
    return 1 if any(status.values()) else 0


# ---------------------------------------------------------------- the commands, in `peg -h` order
# what users come for first (select, apply, compare, monitor), then the demo and the benchmarks
COMMANDS: dict[str, Command] = {
    "select": Command(
        help="the best calibration map for saved validation logits (--val-logits, --val-labels), "
        "or post-hoc method for a model (--model, --val), chosen by cross-validation",
        description="Cross-fit TS, vector/matrix scaling, Dirichlet, PEG, PEP, ... on K folds "
        "of the validation data, keep the cheapest within one paired SE of the best, refit it, "
        "print the table and the choice (--verbose: why each candidate was dropped); --save DIR "
        "writes results.{json,md} and chosen.peg (the fitted map; without --save it is not "
        "kept). See docs/select.md.",
        arguments=arguments.select,
        run=_select,
    ),
    "apply": Command(  # a map fitted on saved logits, on new logits (peg.apps.apply)
        help="apply a calibration map fitted on saved logits to a new .npy of logits",
        description=arguments.APPLY,
        arguments=arguments.apply,
        run=_apply,
    ),
    "compare": Command(
        help="which post-hoc method for your model? fit TS, PEP, PEG, ... on its validation "
        "data and compare them on its test data",
        description="Fit post-hoc methods on a trained model and validation data, evaluate them "
        "on test data (and shifted and OOD sets), and print one table: fit time, forwards per "
        "input and memory beside every metric; writes results.{json,md} and reliability "
        "diagrams to --out. Data: a data set name (NAME or NAME:SPLIT), a .npz file (arrays x, "
        "y), a .pt file of tensors (a dict with x, y or a pair), or module:function returning "
        "a Dataset, DataLoader or (X, y). See docs/compare.md.",
        arguments=arguments.compare,
        run=_compare,
    ),
    "monitor": Command(  # without labels after deployment (peg.apps.monitor)
        help="estimate a deployed model's accuracy without labels, chunk by chunk, with alerts",
        description=arguments.MONITOR,
        arguments=arguments.monitor,
        run=_monitor,
    ),
    "demo": Command(
        help="train a base model and compare Base, Temp-scaled, PEP-15 and PEG-15",
        description="Train a base model, build PEG and PEP ensembles and a temperature-scaled "
        "base on the validation split, print the paper-style table on the test set, and write "
        "results.json, results.md and figures.",
        arguments=_demo_arguments,
        run=_demo,
    ),
    "paper-tables": Command(
        help="reproduce the structure of the PEG paper's Tables 1, 3, 5, 7 and 12",
        description="Train SGD models, a deep ensemble and SWA/SWAG per seed, build PEG and PEP "
        "on top of each as the PEG paper does, and write the tables (mean ± std over seeds) as "
        "markdown and JSON. Trained models and test logits are cached: a rerun resumes.",
        arguments=_paper_tables_arguments,
        run=_paper_tables,
    ),
    "bench": Command(
        help=f"run a benchmark spec (YAML) or a preset: {', '.join(presets.names())}",
        description="Train or load base models, build every method of the spec, evaluate on the "
        "test, shifted and OOD sets, and write results/<name>/results.{json,md}. Member logits "
        "are cached, so a rerun or an interrupted run resumes.",
        arguments=_bench_arguments,
        run=_bench,
    ),
    "diversity": Command(  # Fort et al. 2019's loss-landscape analyses (peg.apps.diversity)
        help="function-space diversity: trajectories, t-SNE, diversity-accuracy plane, "
        "radial landscape cut, with PEG, PEP, SWAG-Diag and subspace samplers",
        description="Train models from several random initialisations (cached), build every "
        "method around their solutions, and write figures and JSON (cosine similarity, "
        "disagreement, t-SNE, diversity vs accuracy, ensemble size, radial landscape cut) plus "
        "a table of diversity and ensemble accuracy/NLL per method. Fashion-MNIST by default "
        "(scikit-learn digits when it is not installed).",
        arguments=_diversity_arguments,
        run=_diversity,
    ),
    "bench-perf": Command(
        help="run the performance benchmarks (benchmarks/*.py of a checkout) and keep the output",
        description="Run the scripts in the checkout's benchmarks/ folder one after another "
        "(inference strategies, PEG creation cost, streaming metrics, memory, Packed speed), "
        "show their output and write each to results/benchmarks/<name>.txt with the command and "
        "commit. Every figure is a ratio measured in one run, on the machine it names.",
        arguments=_bench_perf_arguments,
        run=_bench_perf,
    ),
}


def parser() -> Parser:
    """The `peg` argument parser: one sub-command per entry of `COMMANDS`."""
    top = Parser(
        prog="peg",
        description="Calibrate a trained classifier and choose how: peg select (saved logits "
        "or a model: the best map, by cross-validation), peg apply (that map on new logits), "
        "peg compare (every post-hoc method on test data), peg monitor (accuracy without "
        "labels after deployment); PEG and PEP ensembles; the paper's benchmarks.",
    )
    sub = top.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.arguments(sub.add_parser(name, help=command.help, description=command.description))
    return top


def main(argv: list[str] | None = None) -> int:
    """Run `peg ARGV` (default: the process's arguments); returns the exit status."""
    top = parser()
    args = top.parse_args(argv)
    command = arguments.printable(" ".join(["peg", *(sys.argv[1:] if argv is None else argv)]))
    check = input_checks.CHECKS.get(args.command)
    if check is not None:  # inputs missing or mixed: an argument error, before torch loads
        try:
            check(args)
        except ValueError as e:
            if os.environ.get("PEG_TRACEBACK"):
                raise
            top.exit(2, f"peg {args.command}: error: {e}\n")
    from peg import distributed  # after the arguments are checked: it imports torch

    try:
        with one_line_warnings(f"peg {args.command}", _as_typed):
            status = _run(args, command)
    except (
        FileNotFoundError,
        FileExistsError,
        NotADirectoryError,
        IsADirectoryError,
        PermissionError,
        ValueError,
    ) as e:
        # bad input named by the library (specs, presets, folders, options): a message, not a
        # traceback (PEG_TRACEBACK=1 shows it); exit status 2 as argparse's own errors
        if os.environ.get("PEG_TRACEBACK") and not distributed.joined():
            raise
        said = _as_typed(str(e))
        if not distributed.joined():
            top.exit(2, f"peg {args.command}: error: {said}\n")
        sys.stderr.write(f"peg {args.command}: error: {said}\n")
        status = 2
    except Exception:
        if not distributed.joined():
            raise
        traceback.print_exc()  # e.g. a RankFailure naming the rank that failed
        status = 1
    if distributed.joined():  # under torchrun: end without the teardown that can abort
        distributed.end_process(status)
    return status


def _as_typed(message: str) -> str:
    """A library error in the words typed: `methods[0]` is the first of `--methods`."""
    return f"--{message}" if message.startswith(("methods[", "candidates[")) else message


def _run(args: argparse.Namespace, command: str) -> int:
    """Carry out one parsed `peg` command."""
    progress = False if getattr(args, "no_progress", False) else None
    return COMMANDS[args.command].run(args, command, progress)


if __name__ == "__main__":
    sys.exit(main())
