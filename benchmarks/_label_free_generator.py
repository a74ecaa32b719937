"""The generator half of `benchmarks/label_free.py`: docs/monitor.md's 4-class logits generator
(a stand-in model whose logits are Gaussian noise plus `signal` on the true class), the source
at signal 2.5 (`SOURCE_POINTS` labelled points), targets of `TARGET_POINTS` points in the
families the issue names beyond the images:
  - "weaker signal": target signal 1.0, 1.25, …, 2.5 (`DRAWS` draws each): the inputs carry
    less of the class, the model reads them as before (docs/monitor.md's example);
  - "label shift": Dirichlet(0.3) class priors;
  - "weaker signal + label shift": signal 1.5 and 2.0 with Dirichlet(0.3) priors;
  - "p(y | x) change": a share ρ ∈ {0.1, …, 0.4} of each point's signal moved to the next
    class (labels y, inputs that look part like y + 1: the same input now means another
    class more often).
Nothing is cached: every set is drawn from `np.random.default_rng` seeded per family and draw.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

CLASSES, SOURCE_SIGNAL = 4, 2.5
SOURCE_POINTS, TARGET_POINTS, DRAWS = 2000, 2000, 3
SIGNALS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5)
CONFUSION = (0.1, 0.2, 0.3, 0.4)


def draw(
    rng: np.random.Generator,
    n: int,
    signal: float = SOURCE_SIGNAL,
    priors: np.ndarray | None = None,
    confusion: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Logits `[n, 4]` float32 and labels `[n]` (see the module)."""
    y = rng.choice(CLASSES, n, p=priors)
    z = rng.standard_normal((n, CLASSES))
    z[np.arange(n), y] += signal * (1 - confusion)
    z[np.arange(n), (y + 1) % CLASSES] += signal * confusion
    return z.astype(np.float32), y


def source() -> tuple[np.ndarray, np.ndarray]:
    return draw(np.random.default_rng(0), SOURCE_POINTS)


def sets() -> Iterator[tuple[str, str, np.ndarray, np.ndarray]]:
    """(family, name, logits, labels) of every target set."""
    rng = np.random.default_rng(1)
    yield "clean", "clean", *draw(rng, TARGET_POINTS)
    for signal in SIGNALS:
        for d in range(DRAWS):
            yield "weaker signal", f"signal {signal} ({d})", *draw(rng, TARGET_POINTS, signal)
    for d in range(10):
        q = rng.dirichlet(np.full(CLASSES, 0.3))
        yield "label shift", f"dirichlet {d}", *draw(rng, TARGET_POINTS, priors=q)
    for signal in (1.5, 2.0):
        for d in range(DRAWS):
            q = rng.dirichlet(np.full(CLASSES, 0.3))
            yield (
                "weaker signal + label shift",
                f"signal {signal} + dirichlet {d}",
                *draw(rng, TARGET_POINTS, signal, q),
            )
    for rho in CONFUSION:
        for d in range(DRAWS):
            yield (
                "p(y | x) change",
                f"confusion {rho} ({d})",
                *draw(rng, TARGET_POINTS, confusion=rho),
            )
