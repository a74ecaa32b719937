"""A deadline inside one candidate's fold of `AutoSelect`: the fit is stopped at the next forward
pass of any module once the deadline has passed (`stop_at`), so that a candidate priced too low
(a fold several times its price) costs the budget at most its share, not a whole fold.

Why at a module's forward: every network candidate (PEG's member builds and scale search,
PEP, Laplace's curvature and predictive, MC dropout's passes) spends its time in forward passes
of the model or of copies of it, and a global forward pre-hook (`torch.nn.modules.module.
register_module_forward_pre_hook`) sees them all without touching the model or any copy: it is
registered for the step only and removed after it. The candidates fit on copies of the model
(PEG's gradient pass shares its parameters read-only), so a stopped fit leaves the model as it
was. A map fitted on the cached logits without a module call (an L-BFGS on a tensor) is not
stopped mid-fold: those are priced before they start (`race.Plan`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.nn.modules.module import register_module_forward_pre_hook


class Overrun(BaseException):
    """Raised at a forward pass after the deadline. A BaseException, as KeyboardInterrupt is, so
    that a method's own `except Exception` (a fallback, a failure caught and reported) does not
    swallow it: it reaches `CrossFit`, which reports the candidate as stopped."""

    def __init__(self, allowed: float) -> None:
        super().__init__(f"{allowed:.3g} s")
        self.allowed = allowed


@contextmanager
def stop_at(allowed: float | None) -> Iterator[None]:
    """Within the block, the next module forward after `allowed` seconds raises `Overrun`
    (None: no deadline, nothing registered)."""
    if allowed is None:
        yield
        return
    deadline = time.perf_counter() + max(allowed, 0.0)
    owner = threading.get_ident()  # the hook is global: other threads' forwards are not ours

    def check(module: Any, args: Any) -> None:
        if threading.get_ident() == owner and time.perf_counter() > deadline:
            raise Overrun(allowed)

    handle = register_module_forward_pre_hook(check)
    try:
        yield
    finally:
        handle.remove()
