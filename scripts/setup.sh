#!/usr/bin/env bash
# Idempotent set-up shared by scripts/demo.sh and scripts/test.sh:
#   1. a virtual environment in .venv,
#   2. the pinned CPU build of torch, installed FIRST: peg itself asks only for a range (see
#      pyproject.toml), and with no torch installed a range would pull several GB of CUDA packages,
#   3. this package with its dev, hf, laplace, export and lightning extras (editable; hf:
#      transformers and accelerate, laplace: what peg.Laplace's laplace-torch runs on, export:
#      ONNX and ONNX Runtime for to_module(), lightning: the Lightning callback's, all exercised
#      by the tests); pip keeps the
#      torch of step 2, which is in range. Then laplace-torch and two of its requirements,
#      pinned, with --no-deps: their metadata asks for torchvision, whose wheel would replace or
#      break this torch, and they run without it (pyproject.toml's laplace extra has the rest).
#   4. Fashion-MNIST from Debian (`dataset-fashion-mnist`) when apt is usable; the demo falls
#      back to scikit-learn's digits when it is not.
#   5. Debian's chromium when apt is usable: the headless browser the HTML report is tested in.
# A stamp keyed on pyproject.toml and this script makes a second run a no-op.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

venv="$root/.venv"
stamp="$venv/.peg-setup-stamp"
torch_pin="torch==2.13.0"  # the CPU wheel the tests run on; the only exact torch pin
extras="dev,hf,laplace,export,lightning"
no_deps="laplace-torch==0.3 backpack-for-pytorch==1.7.1 curvlinops-for-pytorch==3.0.1"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtual environment in .venv"
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing $torch_pin (CPU), peg[$extras] and $no_deps (--no-deps)"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "$torch_pin"
  "$venv/bin/python" -m pip install --quiet -e ".[$extras]" "$torch_pin"
  # shellcheck disable=SC2086  # $no_deps is a list of requirements
  "$venv/bin/python" -m pip install --quiet --no-deps $no_deps
  echo "$want" > "$stamp"
fi

# apt_install PACKAGE WITHOUT: a Debian package, best effort, where apt is usable (root, or sudo
# without a password); WITHOUT says what happens when it cannot be installed.
apt_install() {
  command -v apt-get >/dev/null 2>&1 || return 0
  local sudo=""
  [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo="sudo -n"; }
  if [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; then
    echo "[setup] installing Debian package $1"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$1"; } \
      >/dev/null 2>&1 || echo "[setup] could not install $1; $2"
  fi
}

fmnist=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
[ -f "$fmnist" ] || apt_install dataset-fashion-mnist "the demo will use digits"
# 5. chromium: tests/apps/test_html_report.py renders the one-file HTML report in a real headless
#    browser and checks its screenshot (skipped, saying so, without a chromium binary).
command -v chromium >/dev/null 2>&1 || apt_install chromium "the browser test of the HTML report is skipped"
