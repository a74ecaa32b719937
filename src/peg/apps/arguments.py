"""The options of `peg compare`, `peg select`, `peg monitor` and `peg apply`, built without
importing torch or NumPy: `peg --help` and an argument error answer in a fraction of a second
(`peg.apps.cli`; each command's work imports what it needs when it runs).

Saved logits are named alike in every command: `--val-logits` / `--val-labels` for the
labelled validation (reference) data a method is fitted on, `--logits` for the data a
fitted map is applied to or monitored on (`peg monitor`, `peg apply`). The earlier spellings
still work, hidden from the help: `--logits` / `--labels` of `peg select` and `peg compare`,
`--reference-logits` / `--reference-labels` of `peg monitor`; an error names the option as the
user typed it (`typed`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

Parser = argparse.ArgumentParser

# peg.apps.compare.methods.CATALOGUE's names beyond the calibrators' own, for the help
# (tests/apps/test_cli_start.py holds them equal): that module imports torch. Every registered
# map's display name is a method too; the registry lists them, not this module
METHOD_NAMES = (
    "Model",
    "PEP",
    "PEG",
    "PEG + TS",
    "MC dropout",
    "Last-layer PEG",
    "PEG (ascent)",
    "TS → PEG",
    "Laplace",
    "PEG (kfac)",
    "PEG (diag)",
    "Last-layer PEG (kfac)",
    "Last-layer PEG + TS",
    "PEG → Matrix scaling",
    "PEG → Dirichlet",
    "PEG → Vector scaling",
    "Dirichlet → PEG",
    "Matrix scaling → PEG",
    "Dirichlet → last-layer PEG",
)
# peg.apps.html's FORMATS, REPORT and CSV (held equal by the same test)
FORMATS = ("md", "csv", "json")
REPORT = "report.html"
CSV = "results.csv"
SPELLED = "_spelled"  # the Namespace attribute: dest -> the option string the user typed


def printable(name: str) -> str:
    """`name` (a command-line argument, a file name) as text any output takes: bytes that are
    not UTF-8 (which Python keeps as surrogates, `os.fsdecode`) as backslash escapes, `\\xff`.
    Applied once, where a file name becomes a display name (a set's, a chunk's source, the
    command recorded in results files)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def typed_names() -> str:
    """The named methods as a command line takes them (quoted where they hold spaces)."""
    named = ", ".join(f"'{n}'" if " " in n else n for n in METHOD_NAMES)
    return f"{named}, or any calibrator's name (docs/calibration.md)"


class _Spelled(argparse.Action):
    """Stores the value as `store` does and remembers which spelling was typed."""

    def __call__(
        self,
        parser: Parser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        spelled = dict(getattr(namespace, SPELLED, {}))
        spelled[self.dest] = option_string
        setattr(namespace, SPELLED, spelled)


def aliased(p: Parser, name: str, old: Sequence[str], help: str, **options: Any) -> None:
    """Option `name` with `old` spellings that still work, hidden from the help."""
    dest = name[2:].replace("-", "_")
    p.add_argument(name, dest=dest, action=_Spelled, help=help, **options)
    for spelling in old:
        p.add_argument(spelling, dest=dest, action=_Spelled, help=argparse.SUPPRESS, **options)


def typed(args: argparse.Namespace, dest: str) -> str:
    """The option of `dest` as the user typed it (its name where none was typed)."""
    return getattr(args, SPELLED, {}).get(dest) or "--" + dest.replace("_", "-")


def no_progress(p: Parser) -> None:
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def verbose(p: Parser) -> None:
    p.add_argument(
        "--verbose",
        action="store_true",
        help="progress lines on stderr even "
        "when it is not a terminal, and why each candidate was dropped",
    )


def overwrite(p: Parser, option: str, app: str) -> None:
    """`--overwrite`: write into OPTION's folder though peg APP did not make it."""
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"write into {option} even if it is a non-empty folder peg {app} did not make",
    )


def report_options(p: Parser, folder: str) -> None:
    """`--format` and `--html` of `peg compare` and `peg select` (`folder`: their results
    folder's option; checked and written by `peg.apps.html`)."""
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="md",
        help=f"the table printed; csv also writes it as {CSV} in {folder} (default: md)",
    )
    p.add_argument(
        "--html",
        action="store_true",
        help=f"also write {REPORT} in {folder}: one "
        "self-contained file (tables, figures), to open in a browser or send",
    )


# `peg.source._kinds.TASKS` (this module imports no torch; a test holds them equal)
TASKS = ("auto", "multiclass", "binary", "multilabel")
TASK = (
    "the kind of the saved logits (default: auto, read from the shapes: binary [N], "
    "multilabel [N, K] with [N, K] labels, dense [B, C, *S] with [B, *S], multiclass [N, C])"
)


def kinds(p: Parser) -> None:
    """`--task` and `--ignore-index`: how saved logits of any kind are read."""
    p.add_argument("--task", default="auto", choices=TASKS, help=TASK)
    p.add_argument("--ignore-index", type=int, default=-100, help="label left out (-100)")


def val_logits(p: Parser, old: Sequence[str], what: str) -> None:
    """`--val-logits` and `--val-labels` (`old`: the earlier spellings of the two)."""
    aliased(p, "--val-logits", old[:1], f"saved validation logits [N, C], a .npy ({what})")
    aliased(p, "--val-labels", old[1:], "their integer labels [N], a .npy")


# ---------------------------------------------------------------- peg compare
def compare(p: Parser) -> None:
    p.add_argument("--model", help="module:function returning the trained nn.Module")
    p.add_argument("--val", help="validation data the methods are fitted on")
    p.add_argument("--test", help="test data")
    val_logits(
        p,
        ("--logits", "--labels"),
        "with --val-labels, --test-logits and --test-labels, instead of --model, --val and --test",
    )
    p.add_argument("--test-logits", help="saved test logits [N, C], a .npy")
    p.add_argument("--test-labels", help="their integer labels [N], a .npy")
    kinds(p)
    p.add_argument(
        "--shifted",
        nargs="+",
        help="shifted labelled sets, [NAME=]DATA each (an "
        "existing file's path is DATA, '=' and all)",
    )
    p.add_argument("--ood", nargs="+", help="out-of-distribution inputs, [NAME=]DATA each")
    p.add_argument(
        "--methods",
        nargs="+",
        help="named methods (any case, '->' for '→'): "
        f"{typed_names()} (default: Model, TS, PEP, PEG, 'PEG + TS', 'MC dropout' if the "
        "model has dropout, 'Last-layer PEG')",
    )
    p.add_argument("--ood-score", default="entropy", help="OOD score (default: entropy)")
    p.add_argument(
        "--metrics",
        nargs="+",
        help="metric columns of the tables, e.g. nll error ece aurc "
        "(default: nll error brier ece adaptive_ece classwise_ece aurc augrc)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--batch-size", type=int, default=512, help="default: 512")
    p.add_argument("--out", default="peg-compare", help="output folder (default: peg-compare)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="take back the methods an earlier run with the same arguments saved in --out",
    )
    overwrite(p, "--out", "compare")
    report_options(p, "--out")
    no_progress(p)


# ---------------------------------------------------------------- peg select
def select(p: Parser) -> None:
    val_logits(p, ("--logits", "--labels"), "with --val-labels; instead of --model and --val")
    kinds(p)
    p.add_argument("--model", help="module:function returning the model")
    p.add_argument("--val", help="validation data (as peg compare's)")
    p.add_argument(
        "--candidates",
        nargs="+",
        help=f"named methods (any case, '->' for '→'): {typed_names()} (default: see the guide)",
    )
    p.add_argument("--cv", type=int, default=5, help="folds (default: 5)")
    p.add_argument("--criterion", default="nll", help="nll or brier (default: nll)")
    p.add_argument("--max-forwards", type=float, help="prediction budget, forwards/input")
    p.add_argument(
        "--max-fit-seconds",
        default="auto",
        help="the whole fit's budget in seconds, 'auto' (25 x a TS fit, at least "
        "10 s; the default) or 'none' (every candidate on every fold)",
    )
    p.add_argument("--best", action="store_true", help="the best CV score, not one-SE")
    p.add_argument("--nested", action="store_true", help="nested-CV estimate (cv x cost)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--batch-size", type=int, default=512, help="default: 512")
    p.add_argument(
        "--save",
        help="folder for results.json, results.md and chosen.peg (the "
        "fitted map; without --save it is not kept)",
    )
    overwrite(p, "--save", "select")
    report_options(p, "--save")
    verbose(p)
    no_progress(p)


# ---------------------------------------------------------------- peg monitor
NO_LABELS = "-"  # `--labels`: this file has none
MONITOR = (
    "Fit peg.PerformanceEstimator on labelled reference data (saved logits: --val-logits, "
    "--val-labels; or --model and --val, as peg compare takes them), run peg.Monitor over "
    "the target data (--logits files, memory-mapped, or --data sources; one chunk each, or "
    "--chunk-size points) and write results.{json,md,csv} in --out as each chunk ends; exit 4 "
    "with --fail-on-alert when a chunk alerts. See docs/monitor.md."
)


def positive(text: str) -> int:
    """`--chunk-size`, `--batch-size`: a positive integer (argparse names the option)."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


positive.__name__ = "positive integer"  # argparse's message: "invalid positive integer value"


def monitor(p: Parser) -> None:
    aliased(
        p,
        "--val-logits",
        ["--reference-logits"],
        "reference (source validation) logits [N, C] (.npy)",
    )
    aliased(p, "--val-labels", ["--reference-labels"], "their labels [N] (.npy)")
    p.add_argument("--logits", nargs="+", help="target logits [N_i, C] (.npy), in order")
    p.add_argument(
        "--labels",
        nargs="+",
        help="the targets' labels [N_i] (.npy), one per "
        f"--logits file ('{NO_LABELS}' for one without): the realized accuracy",
    )
    p.add_argument("--model", help="module:function returning the trained nn.Module")
    p.add_argument("--val", help="labelled reference data (as peg compare's --val)")
    p.add_argument(
        "--data",
        nargs="+",
        help="target data, [NAME=]DATA each, in order (a "
        "registry set, a .npz or .pt file, module:function)",
    )
    p.add_argument("--out", required=True, help="results folder")
    p.add_argument(
        "--chunk-size",
        type=positive,
        default=None,
        help="points per chunk (default: one chunk per file or --data source)",
    )
    p.add_argument(
        "--batch-size",
        type=positive,
        default=512,
        help="rows read (or inputs predicted) at a time (default: 512)",
    )
    p.add_argument("--method", default="auto", help="the estimator (default: auto)")
    p.add_argument("--fail-on-alert", action="store_true", help="exit 4 when any chunk alerts")
    p.add_argument(
        "--overwrite", action="store_true", help="write into a folder peg monitor did not make"
    )
    p.add_argument("--html", action="store_true", help="also write report.html in --out")


# ---------------------------------------------------------------- peg apply
APPLY = (
    "Load a calibration map fitted on saved logits (DIR/chosen.peg of `peg select --val-logits "
    "... --save DIR`, or a calibrator's archive), apply it to a .npy of logits [N, C] and write "
    "the calibrated probabilities [N, C] (float32 .npy) to --out, with --out.peg.json beside "
    "it; a conformal predictor's archive writes its prediction sets [N, C] (bool .npy) instead. "
    "NaN and +-inf logits are refused (naming the row), as every calibrator refuses them. An "
    "existing --out is replaced only where its record shows peg apply wrote it. "
    "See docs/calibration.md#saved-logits-no-model."
)


def apply(p: Parser) -> None:
    p.add_argument("map", help="the saved map: a .peg archive, or the folder of peg select --save")
    p.add_argument("--logits", required=True, help="logits [N, C], a .npy (memory-mapped)")
    p.add_argument(
        "--out",
        required=True,
        help="the probabilities [N, C] (a conformal "
        "archive: its prediction sets [N, C], bool), a .npy to write",
    )
    p.add_argument("--batch-size", type=int, default=4096, help="rows per block (default: 4096)")
