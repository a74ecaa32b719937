#!/usr/bin/env bash
# The test command: set up (idempotent), lint, run the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
