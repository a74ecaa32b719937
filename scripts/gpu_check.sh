#!/usr/bin/env bash
# The device checks, run on the GPU machine (never in CI): the tests whose second device is CUDA
# there (tests/conftest.py's `gpu`), then benchmarks/gpu.py on ResNet-50 and ViT-B/16.
#   bash scripts/gpu_check.sh DIR [MODEL...]     transcripts into DIR (default results/gpu)
# Packages the GPU image lacks travel as wheels in .whl/ (laplace-torch and what it needs,
# MAPIE, torch-uncertainty); they install to /tmp/site, never over the image's torch.
set -uo pipefail
dir=${1:-results/gpu}; shift || true
models=${*:-resnet50 vit-b16}
mkdir -p "$dir"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers",
  transformers.__version__, torch.cuda.get_device_name())' | tee "$dir/device.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_devices.py tests/test_detectors.py \
    tests/methods/test_conformal_shift.py tests/methods/test_label_shift.py \
    tests/methods/test_saved_logits.py 2>&1 | tee "$dir/cuda-tests.txt"
fi
for model in $models; do
  python3 benchmarks/gpu.py --models "$model" --data gpu --out "$dir/gpu-$model.txt" \
    --profile "$dir/profile-$model.txt"
done
