"""What `import peg` and `peg --help` cost, against `import torch` on the same machine.

Target (issue 41): `import peg` ≤ 1.6 × `import torch`. Each round starts a fresh Python per
case, in turn (torch, peg, `peg --help`: a slow spell of the machine touches every case of a
round alike), and the best of the rounds is kept. Each time is the whole process's wall time,
`python -c "import torch"` as `peg --help`: start-up and exit included (torch's exit alone can
take a second on a loaded machine), which is what a user waits for.

Bytecode: torch's is compiled at install (`__pycache__` in site-packages); peg's, run from a
checkout with PYTHONDONTWRITEBYTECODE=1 (this project's environment), would be compiled from
source in every process, about a second of the difference on a loaded 2-core machine. So the
cases run with all bytecode (torch's too) cached in a temporary PYTHONPYCACHEPREFIX, filled by
one untimed run of each, as an installed peg has it; one more row runs `import peg` as this
environment does (`python -B`, the given environment: torch's bytecode read from site-packages,
peg's compiled from source unless its `__pycache__` exists).

    OMP_NUM_THREADS=1 python benchmarks/import_time.py [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from peg.utils.env import git_commit, machine

CASES = {
    "import torch": [sys.executable, "-c", "import torch"],
    "import peg": [sys.executable, "-c", "import peg"],
    "peg --help": [sys.executable, "-m", "peg.apps", "--help"],
    "import peg, no .pyc": [sys.executable, "-B", "-c", "import peg"],
}
AS_GIVEN = "import peg, no .pyc"  # in the environment as given, writing no bytecode (-B)


def _seconds(name: str, command: list[str], env: dict[str, str]) -> float:
    env = dict(os.environ) if name == AS_GIVEN else env
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, check=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round (a smoke run)")
    args = parser.parse_args()
    args.rounds = 1 if args.quick else args.rounds
    print(f"commit: {git_commit()}")
    print(f"machine: {machine()}; best of {args.rounds} rounds, a fresh process per case")
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        for name, command in CASES.items():  # untimed: fills the bytecode cache
            _seconds(name, command, env)
        for _ in range(args.rounds):
            for name, command in CASES.items():
                samples[name].append(_seconds(name, command, env))
    torch_s = min(samples["import torch"])
    for name, seconds in samples.items():
        rounds = " ".join(f"{s:.2f}" for s in seconds)
        best = min(seconds)
        print(f"{name:<19} best {best:6.2f} s  ({best / torch_s:.2f} × import torch)  [{rounds}]")


if __name__ == "__main__":
    main()
