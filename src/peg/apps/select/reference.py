"""The yardstick of `AutoSelect`'s budget: a temperature scaling fit on the model's validation
logits, timed after the fit's one-time costs are paid (`warm_up`), so that "25 × a TS fit" is
25 warm fits, not an import."""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from peg.apps.compare.costs import flops
from peg.methods.calibration.temperature import TemperatureScaling


def warm_up(model: nn.Module, rows: Any) -> int | None:
    """The one-time costs of a fit, paid before the reference is timed and the budget's clock
    starts (`cost_["setup_seconds"]`): the FLOP counter's first use (it imports torch._dynamo:
    2-10 s) on the model's probe `rows`, which is also the model's first forward (lazy
    initialisation, kernel selection), and a first temperature scaling fit on 8 points. Returns
    the model's FLOPs on `rows` (0 for saved logits, `nn.Identity`: nothing to count)."""
    y = torch.arange(8) % 2
    z = 2.0 * nn.functional.one_hot(y, 2).float()
    z[:2] = z[:2].flip(-1)  # two wrong: a finite T
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        TemperatureScaling().fit(nn.Identity(), (z, y))
    if isinstance(model, nn.Identity):
        return 0
    try:
        return flops(model, rows)
    except Exception:  # counted again in the first fold, where a failure is a candidate's
        return None


# the most `slowdown` says: past it, wall seconds the process did not spend on the CPU are
# more likely a wait (a loader's workers, disk) than other jobs sharing the cores
MAX_SLOWDOWN = 10.0


def slowdown(wall: float, cpu: float, device: torch.device | None = None) -> float:
    """How much slower than its CPU time the machine ran a stretch of the fit: its `wall`
    seconds over the process's `cpu` seconds (`time.process_time`), between 1 (threads: more
    CPU than wall seconds, no slowdown seen) and `MAX_SLOWDOWN`; 1 where the scores were made
    on an accelerator (`device`), whose waits are not the CPU's load. The floor of the budget is
    in seconds of an unloaded machine, times this: on a loaded one (CPU 0.4 s for a 4.5 s run at
    load average ~10) a 10 s wall floor held a tenth of the work, and the saturated maps' choice
    went from matrix scaling to TS (+0.21 nats)."""
    if cpu <= 0 or (device is not None and device.type != "cpu"):
        return 1.0
    return min(MAX_SLOWDOWN, max(1.0, wall / cpu))


def ts_seconds(logits: Tensor, y: Tensor, **kind: Any) -> float:
    """Seconds to fit temperature scaling on the model's validation logits `[1, N, C]` (or
    another kind's, read as `kind`'s options say: `kinds.kind_options`)."""
    started = time.perf_counter()
    TemperatureScaling(**kind).fit(nn.Identity(), (logits[0], y))
    return time.perf_counter() - started
