#!/usr/bin/env bash
# The main job: set up (idempotent), then `peg demo` with any arguments passed through.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
exec "$root/.venv/bin/peg" demo "$@"
