"""What the archive's integrity digest (`tensors_sha256`, issue 40) costs at save and load.

An archive's tensors are hashed once when it is written and once when it is read. Timed here:
`archive.write` and `peg.load` of one ensemble (`--params` float32 entries over `--members`
members), and `archive.tensors_digest` of the same tensors alone, the share of each the digest
takes. Median of `--repeats` runs; every number measured in this run, on this machine
(printed).

    python benchmarks/archive_digest.py [--params 25000000] [--members 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _timing import median_time
from torch import nn

import peg
from peg import archive
from peg.utils.env import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=25_000_000)
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    width = max(1, args.params // 1000)
    model = nn.Sequential(nn.Linear(1000, width), nn.ReLU(), nn.Linear(width, 1)).eval()
    ensemble = peg.Ensemble.from_models([model] * args.members)
    tensors = {**ensemble.stacked, **ensemble.shared}
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(machine())
    print(
        f"archive: {size / 1e6:.0f} MB ({args.members} member(s), "
        f"{sum(t.numel() for t in tensors.values()):,} entries)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "a.peg")
        save, _ = median_time(lambda: ensemble.save(path), args.repeats)
        load, _ = median_time(lambda: peg.load(path, model), args.repeats)
        digest, _ = median_time(lambda: archive.tensors_digest(tensors), args.repeats)
    print(
        f"save {save * 1e3:.0f} ms, load {load * 1e3:.0f} ms, digest {digest * 1e3:.0f} ms "
        f"({size / 1e9 / digest:.2f} GB/s): {digest / save:.0%} of a save, "
        f"{digest / load:.0%} of a load (both include it)"
    )


if __name__ == "__main__":
    main()
