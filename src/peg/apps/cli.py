"""The `peg` command (`[project.scripts]`; also `python -m peg.apps`).

Each command is one `Command` in `COMMANDS`: its help, its arguments (`_<name>_arguments`) and
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

from peg import distributed
from peg.apps import apply, html, presets
from peg.apps._warnings import one_line_warnings
from peg.apps.compare.methods import typed_names
from peg.apps.monitor import command as monitor

Parser = argparse.ArgumentParser


@dataclass(frozen=True)
class Command:
    """One `peg` command: `help` (in `peg -h`), `description` (in `peg NAME -h`), `arguments`
    (adds its options to its parser) and `run(args, command, progress) -> exit status`."""

    help: str
    description: str
    arguments: Callable[[Parser], None]
    run: Callable[[argparse.Namespace, str, bool | None], int]


def _no_progress(p: Parser) -> None:
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _overwrite(p: Parser, option: str, app: str) -> None:
    """`--overwrite`: write into OPTION's folder though peg APP did not make it."""
    p.add_argument("--overwrite", action="store_true", help=f"write into {option} even if it is "
                   f"a non-empty folder peg {app} did not make")  # fmt: skip


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
        run_uci(**uci, out=args.out, cache=args.cache, progress=progress, command=command,
                overwrite=args.overwrite)  # fmt: skip
        return 0
    specs = load_specs(path)
    for spec in specs:  # every spec's folder before the first runs
        claim_bench(args.out, spec.name, args.overwrite)
    for spec in specs:
        if args.seeds:
            spec = dataclasses.replace(spec, seeds=tuple(args.seeds))
        run_spec(spec, args.out, args.cache, progress=progress, command=command,
                 overwrite=args.overwrite)  # fmt: skip
    return 0


# ---------------------------------------------------------------- peg compare
def _compare_arguments(p: Parser) -> None:
    p.add_argument("--model", help="module:function returning the trained nn.Module")
    p.add_argument("--val", help="validation data the methods are fitted on")
    p.add_argument("--test", help="test data")
    p.add_argument("--logits", help="saved validation logits [N, C], a .npy (with --labels, "
                   "--test-logits and --test-labels, instead of --model, --val and "
                   "--test)")  # fmt: skip
    p.add_argument("--labels", help="their integer labels [N], a .npy")
    p.add_argument("--test-logits", help="saved test logits [N, C], a .npy")
    p.add_argument("--test-labels", help="their integer labels [N], a .npy")
    p.add_argument("--shifted", nargs="+", help="shifted labelled sets, [NAME=]DATA each")
    p.add_argument("--ood", nargs="+", help="out-of-distribution inputs, [NAME=]DATA each")
    p.add_argument(
        "--methods", nargs="+", help="named methods (any case, '->' for '→'): "
        f"{typed_names()} (default: Model, TS, PEP, PEG, 'PEG + TS', 'MC dropout' if the "
        "model has dropout, 'Last-layer PEG')",
    )  # fmt: skip
    p.add_argument("--ood-score", default="entropy", help="OOD score (default: entropy)")
    p.add_argument(
        "--metrics", nargs="+", help="metric columns of the tables, e.g. nll error ece aurc "
        "(default: nll error brier ece adaptive_ece classwise_ece aurc augrc)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--batch-size", type=int, default=512, help="default: 512")
    p.add_argument("--out", default="peg-compare", help="output folder (default: peg-compare)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="take back the methods an earlier run with the same arguments saved in --out",
    )
    _overwrite(p, "--out", "compare")
    html.add_options(p, "--out")
    _no_progress(p)


def _compare(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.compare.command import run

    return run(args, command, progress)


# ---------------------------------------------------------------- peg select
def _select_arguments(p: Parser) -> None:
    p.add_argument("--model", help="module:function returning the model")
    p.add_argument("--val", help="validation data (as peg compare's)")
    p.add_argument("--logits", help="saved validation logits [N, C], a .npy (instead of "
                   "--model and --val)")  # fmt: skip
    p.add_argument("--labels", help="their integer labels [N], a .npy (with --logits)")
    p.add_argument("--candidates", nargs="+", help="named methods (any case, '->' for '→'): "
                   f"{typed_names()} (default: see the guide)")  # fmt: skip
    p.add_argument("--cv", type=int, default=5, help="folds (default: 5)")
    p.add_argument("--criterion", default="nll", help="nll or brier (default: nll)")
    p.add_argument("--max-forwards", type=float, help="prediction budget, forwards/input")
    p.add_argument("--max-fit-seconds", default="auto",
                   help="the whole fit's budget in seconds, 'auto' (25 x a TS fit, at least "
                   "10 s; the default) or 'none' (every candidate on every fold)")  # fmt: skip
    p.add_argument("--best", action="store_true", help="the best CV score, not one-SE")
    p.add_argument("--nested", action="store_true", help="nested-CV estimate (cv x cost)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--batch-size", type=int, default=512, help="default: 512")
    p.add_argument("--save", help="folder for results.json, results.md and chosen.peg")
    _overwrite(p, "--save", "select")
    html.add_options(p, "--save")
    _no_progress(p)


def _select(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.select.command import run

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
    study.run(config, out=args.out, cache=args.cache, progress=progress, command=command,
              overwrite=args.overwrite)  # fmt: skip
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
COMMANDS: dict[str, Command] = {
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
    "compare": Command(
        help="which post-hoc method for your model? fit TS, PEP, PEG, ... on its validation "
        "data and compare them on its test data",
        description="Fit post-hoc methods on a trained model and validation data, evaluate them "
        "on test data (and shifted and OOD sets), and print one table: fit time, forwards per "
        "input and memory beside every metric; writes results.{json,md} and reliability "
        "diagrams to --out. Data: a data set name (NAME or NAME:SPLIT), a .npz file (arrays x, "
        "y), a .pt file of tensors (a dict with x, y or a pair), or module:function returning "
        "a Dataset, DataLoader or (X, y). See docs/compare.md.",
        arguments=_compare_arguments,
        run=_compare,
    ),
    "select": Command(
        help="the best post-hoc predictor for your model, chosen by cross-validation on its "
        "validation data only (peg.AutoSelect)",
        description="Cross-fit TS, vector/matrix scaling, Dirichlet, PEG, PEP, ... on K folds "
        "of the validation data, keep the cheapest within one paired SE of the best, refit it, "
        "print the report; --save DIR writes results.{json,md} and chosen.peg. See "
        "docs/select.md.",
        arguments=_select_arguments,
        run=_select,
    ),
    "monitor": Command(**monitor.COMMAND),  # without labels after deployment (apps/monitor)
    "apply": Command(  # a map fitted on saved logits, on new logits (peg.apps.apply)
        help="apply a calibration map fitted on saved logits to a new .npy of logits",
        description=apply.DESCRIPTION,
        arguments=apply.arguments,
        run=apply.run,
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
        prog="peg", description="Cheap, well-calibrated ensembles from a trained PyTorch model."
    )
    sub = top.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.arguments(sub.add_parser(name, help=command.help, description=command.description))
    return top


def main(argv: list[str] | None = None) -> int:
    """Run `peg ARGV` (default: the process's arguments); returns the exit status."""
    top = parser()
    args = top.parse_args(argv)
    command = " ".join(["peg", *(sys.argv[1:] if argv is None else argv)])
    try:
        with one_line_warnings(f"peg {args.command}", _as_typed):
            status = _run(args, command)
    except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
            PermissionError, ValueError) as e:  # fmt: skip
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
