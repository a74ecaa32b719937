"""The `peg` command."""

from __future__ import annotations

import argparse
import sys


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
    args = parser.parse_args(argv)

    if args.command == "demo":
        from peg.demo import run

        data = "two-moons" if args.data == "moons" else args.data
        run(
            data=data,
            quick=args.quick,
            out=args.out,
            seed=args.seed,
            progress=False if args.no_progress else None,
            command=" ".join(["peg", *(sys.argv[1:] if argv is None else argv)]),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
