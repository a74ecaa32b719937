"""Draw docs/corruptions.png: one CIFAR-10 test image under all 20 corruptions of
`peg.data.corruptions` at severities 1, 3 and 5 (seed 0).

    python scripts/corruptions_figure.py [--index 2003] [--out docs/corruptions.png]

Needs the CIFAR-10 test set where `peg.data.load("cifar10", "test")` finds it (the shared JPEG
archive here) and torch-uncertainty-assets (frost). The result depends only on the image, the
seed and peg's code: rerunning it rewrites the same picture.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from peg import data
from peg.plots import corruption_grid

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, default=2003, help="CIFAR-10 test image (a bird)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "corruptions.png")
    args = parser.parse_args(argv)
    X, _ = data.load("cifar10", "test")
    return corruption_grid(X[args.index], args.out, severities=(1, 3, 5), seed=0)


if __name__ == "__main__":
    print(f"wrote {main()}")
