"""Whether an ensemble gives anything over its base: a searched scale can make the members
indistinguishable from the model they perturb (PEP on two moons chose σ = 5·10⁻⁷: fifteen
forwards for the model's own predictions). `peg.compare` says so on the row (`"vs_base"`,
`"note"`), `AutoSelect` does not pay for such a candidate (`peg.apps.select.report`).

The measure is taken from outputs the caller already holds: the method's member logits and
its base's log-probabilities on the same points, no forward pass of its own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from peg.metrics._inputs import ensemble_log_probs

# The largest |log p̄ − log p̄_base| (over points and classes) under which an ensemble is
# indistinguishable from its base. At δ = 1e-4 every per-point NLL moves by at most δ, every
# probability by at most p·(e^δ − 1) ≈ δ, so the Brier score by at most 2δ and each ECE by about
# δ: nothing the tables print (NLL and Brier to 4 decimals, the ECEs as % to 2) can differ, and a
# prediction flips only where its two top classes are within 2δ. It is 20 times above the
# float32 arithmetic between two forwards of the same weights (PEP at σ = 5·10⁻⁷ on moons: 4·10⁻⁶)
# and far below a working ensemble (PEG on moons: 1.7; last-layer PEG: 0.7).
INDISTINGUISHABLE = 1e-4


def vs_base(logits: Tensor, base_members: int, base_log_probs: Tensor) -> float | None:
    """max over points and classes of |log p̄ − log p̄_base|, for member logits `[M, N, C]`
    against the base's log-probabilities `[N, C]` (`ensemble_log_probs`, of `base_members`
    members) on the same points; None where the method has no more members than its base (a
    calibrator: one member; PEG + TS over PEG): nothing to collapse."""
    if logits.shape[0] <= base_members:
        return None
    mine = ensemble_log_probs(logits)
    base = base_log_probs.to(mine.device, mine.dtype)
    gap = torch.where(mine == base, 0.0, (mine - base).abs())  # equal −inf: no gap (not NaN)
    return float(gap.max())


def indistinguishable(gap: float | None) -> bool:
    """Whether a `vs_base` gap says the members collapsed onto the base."""
    return gap is not None and gap < INDISTINGUISHABLE


def note(gap: float, base: str, forwards: float | None, where: str) -> str:
    """The row's note for a collapsed method (`base`: its base's name, `where`: the points)."""
    cost = "" if forwards is None else f", at {forwards:.3g} forwards per input"
    return (
        f"indistinguishable from its base ({base}): max |Δ log p| {gap:.2g} < "
        f"{INDISTINGUISHABLE:g} on {where}{cost}"
    )
