"""The band a chunk's estimated accuracy is judged by, passed to the monitor as `band=`.

- `Sigmas(k)`: the mean ± k σ of the estimates on the reference chunks of the chunk's own size
  (NannyML's rule), σ widened by sqrt(1 + n / N) for the source's own sampling error (the
  reference chunks are drawn from one fixed source sample of N points: their mean is off the
  population's by about σ · sqrt(n / N)), clipped to [0, 1].
- `Fixed(lo, hi)`: a band the user sets (a service level: "alert below 0.80"), whatever the
  reference says.
"""

from __future__ import annotations

import math


class Threshold:
    """The base of the bands (see the module doc): `limits(mean, sd, n, n_source)` → (lo, hi)
    from the mean and standard deviation of the estimates on reference chunks of `n` points
    drawn from a source of `n_source` points."""

    def limits(self, mean: float, sd: float, n: int, n_source: int) -> tuple[float, float]:
        raise NotImplementedError

    def describe(self) -> str:
        """The band's rule in words (the reports' header)."""
        raise NotImplementedError


class Sigmas(Threshold):
    """The reference chunks' mean ± `k` σ (see the module doc).

    Examples:
        >>> from peg.apps.monitor import Sigmas
        >>> lo, hi = Sigmas(3).limits(0.85, 0.05, n=50, n_source=1000)
        >>> round(lo, 4), hi  # 0.85 - 3 · 0.05 · sqrt(1 + 50 / 1000), hi clipped to 1
        (0.6963, 1.0)
    """

    def __init__(self, k: float = 3.0) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0 < k < 100:
            raise ValueError(f"k: expected a positive number of standard deviations, got {k!r}")
        self.k = float(k)

    def limits(self, mean: float, sd: float, n: int, n_source: int) -> tuple[float, float]:
        half = self.k * sd * math.sqrt(1.0 + n / max(n_source, 1))
        return max(0.0, mean - half), min(1.0, mean + half)

    def describe(self) -> str:
        return f"reference chunks of the same size ± {self.k:g} σ"

    def __repr__(self) -> str:
        return f"Sigmas({self.k:g})"


class Fixed(Threshold):
    """A band set by hand: an alert when the estimate leaves [`lo`, `hi`].

    Examples:
        >>> from peg.apps.monitor import Fixed
        >>> Fixed(0.8).limits(0.9, 0.02, n=50, n_source=1000)  # the reference ignored
        (0.8, 1.0)
    """

    def __init__(self, lo: float, hi: float = 1.0) -> None:
        for name, v in (("lo", lo), ("hi", hi)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{name}: expected an accuracy in [0, 1], got {v!r}")
        if lo > hi:
            raise ValueError(f"lo: expected at most hi ({hi!r}), got {lo!r}")
        self.lo, self.hi = float(lo), float(hi)

    def limits(self, mean: float, sd: float, n: int, n_source: int) -> tuple[float, float]:
        return self.lo, self.hi

    def describe(self) -> str:
        return f"fixed [{self.lo:g}, {self.hi:g}]"

    def __repr__(self) -> str:
        return f"Fixed({self.lo:g}, {self.hi:g})"


def as_threshold(value: object, argument: str = "band") -> Threshold:
    """`value` as a band: a `Threshold` already, or a number of σ (`Sigmas`)."""
    if isinstance(value, Threshold):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Sigmas(value)
    raise ValueError(
        f"{argument}: expected Sigmas(k), Fixed(lo, hi) or a number of σ, got {value!r}"[:300]
    )
