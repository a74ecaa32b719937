"""Which inputs a `peg select`, `peg compare` or `peg monitor` command line names, checked at
once: missing or mixed inputs are argument errors that `peg.apps.cli` raises before any import of
torch, and the commands again (a Namespace built in Python skips the command line). Imports no
torch, as `peg.apps.arguments` (whose options these read)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from peg.apps.arguments import typed


def given(args: argparse.Namespace, options: Sequence[str]) -> list[str]:
    """Those of `options` given, as typed (`--reference-logits` for `--val-logits`)."""
    dests = [o[2:].replace("-", "_") for o in options]
    return [typed(args, d) for d in dests if getattr(args, d, None) is not None]


def spelled(args: argparse.Namespace, options: Sequence[str]) -> tuple[str, ...]:
    """`options` as typed (their own names where not given)."""
    return tuple(typed(args, o[2:].replace("-", "_")) for o in options)


def check_select(args: argparse.Namespace) -> None:
    """`--model` and `--val`, or `--val-logits` and `--val-labels`."""
    logits, labels = spelled(args, ("--val-logits", "--val-labels"))
    if args.val_logits is not None or args.val_labels is not None:
        if args.val_logits is None or args.val_labels is None or args.model or args.val:
            raise ValueError(
                f"{logits}: give {logits} and {labels} together, without --model and --val"
            )
    elif args.model is None or args.val is None:
        raise ValueError(f"--model: give --model and --val (or {logits} and {labels})")


COMPARE_LOGITS = ("--val-logits", "--val-labels", "--test-logits", "--test-labels")


def check_compare(args: argparse.Namespace) -> None:
    """`--model`, `--val` and `--test`, or the four saved-logits options."""
    names, got = spelled(args, COMPARE_LOGITS), given(args, COMPARE_LOGITS)
    if got:
        if len(got) < len(COMPARE_LOGITS) or args.model or args.val or args.test:
            raise ValueError(
                f"{names[0]}: give {', '.join(names[:3])} and {names[3]} together, without "
                f"--model, --val and --test (got {', '.join(got)})"
            )
        return
    missing = [o for o in ("--model", "--val", "--test") if getattr(args, o[2:]) is None]
    if missing:
        raise ValueError(
            f"{missing[0]}: give --model, --val and --test (or --val-logits, --val-labels, "
            f"--test-logits and --test-labels for saved logits); missing: {', '.join(missing)}"
        )


MONITOR_LOGITS = ("--val-logits", "--val-labels", "--logits")
MONITOR_MODEL = ("--model", "--val", "--data")


def check_monitor(args: argparse.Namespace) -> bool:
    """Saved logits (True) or a model and its data (False), not both, none missing."""
    logits, model = given(args, MONITOR_LOGITS), given(args, MONITOR_MODEL)
    options = spelled(args, MONITOR_LOGITS)
    if logits and model:
        raise ValueError(
            f"{logits[0]}: give saved logits ({', '.join(options)}) or a model "
            f"({', '.join(MONITOR_MODEL)}), not both (got {', '.join(logits + model)})"
        )
    if model or not logits:
        missing = [o for o in MONITOR_MODEL if o not in model]
        if missing:
            raise ValueError(
                f"{missing[0]}: give --model, --val and --data (or "
                f"{', '.join(options)} for saved logits); missing: {', '.join(missing)}"
            )
        if args.labels is not None:
            raise ValueError(
                "--labels: goes with --logits (saved logits); a --data source's labels are its "
                "own (a .npz file's y, the second of a pair (X, y))"
            )
        return False
    missing = [o for o in options if o not in logits]
    if missing:
        raise ValueError(
            f"{missing[0]}: give {', '.join(options)} together (or "
            f"{', '.join(MONITOR_MODEL)} for a model); missing: {', '.join(missing)}"
        )
    return True


CHECKS = {"select": check_select, "compare": check_compare, "monitor": check_monitor}
