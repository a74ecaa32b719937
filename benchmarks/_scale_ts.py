"""Test NLL of each `_scale_bases` base and of temperature scaling fitted on its first n
validation points (beside PEG's in `benchmarks/scale_search.py --table`):

    python benchmarks/_scale_ts.py hf-bert-2000 hf-vit-2000 hf-resnet-2000 cifar-cnn-2000
"""

from __future__ import annotations

import sys

import torch
from _scale_bases import BASES
from _scale_table import TEST_POINTS, point_losses

from peg.methods.calibration.temperature import TemperatureScaling

for case in sys.argv[1:]:
    name, n = case.rsplit("-", 1)
    base, val, test, _ = BASES[name]()
    val, test = (val[0][: int(n)], val[1][: int(n)]), (test[0][:TEST_POINTS], test[1][:TEST_POINTS])
    ts = TemperatureScaling().fit(base, val)
    with torch.no_grad():
        plain = float(point_losses(base(test[0])[None], test[1], False).mean())
        scaled = float(
            point_losses(ts.member_logits(test[0], 256, progress=False), test[1], False).mean()
        )
        acc = float((base(test[0]).argmax(1) == test[1]).float().mean())
    print(
        f"{case}: test accuracy {acc:.3f}, base test NLL {plain:.4f}, TS {scaled:.4f}", flush=True
    )
