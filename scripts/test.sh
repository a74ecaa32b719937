#!/usr/bin/env bash
# The test command: set up (idempotent), lint, run the whole test suite.
# The suite runs on every core, up to 4, one pytest-xdist worker each (tests/conftest.py keeps a
# worker at one torch thread; past 4 the longest tests bound the gain). Work stealing: the
# slow fresh-process tests (docs pages, torchrun) come last in collection, and a worker that
# has finished takes them from the busy one instead of idling on a one-core tail. Arguments go
# to pytest, after ours: `bash scripts/test.sh -n 0 tests/test_x.py` runs one file in this
# one process.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
.venv/bin/ruff check .
cores=$(nproc 2>/dev/null || echo 1)
workers=$((cores < 4 ? cores : 4))
[ "$workers" != 1 ] || workers=0  # one worker process: slower than none
.venv/bin/python -m pytest -q -n "$workers" --dist worksteal "$@"
