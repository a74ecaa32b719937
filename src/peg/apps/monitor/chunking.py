"""How the monitor cuts a stream into chunks, and the matching reference chunks of the source.

A chunker says how many points the open chunk may still take (`room`), whether an `update`
ends it (`per_update`), and what becomes of an incomplete last chunk when the stream ends
(`incomplete`). The band a chunk is judged by comes from reference chunks of the chunk's own
size (`reference_size`, `reference_indices`: drawn from the source with replacement; above
100 points, of the nearest size of a grid, the spread scaled to the chunk's): the spread
shrinks as 1 / sqrt(n), so a band from 500-point reference chunks flagged 17 of 40 clean
50-point updates.

- `by_size(n, incomplete="keep")`: chunks of `n` points, batches split or joined to it; the
  last, incomplete chunk is kept as a chunk of its own ("keep", judged by a band of its own
  size), dropped ("drop"), or joined to the chunk before it ("append"; the chunk before is
  then reported only once the next `n` points, or the end of the stream, have come).
- `per_update()`: each `update` (a file, a day's batch) is one chunk, whatever its size.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

INCOMPLETE = ("keep", "drop", "append")
# reference chunks larger than this are drawn at this size and their spread scaled by
# sqrt(MAX_REFERENCE_POINTS / n) (the estimate's spread falls as 1 / sqrt(n) there): a chunk
# size of 10**12 asked the reference draws for 7.3 TiB of indices
MAX_REFERENCE_POINTS = 20_000
# chunks up to this size get reference chunks of their exact size (the estimate's spread is
# not yet 1 / sqrt(n) there: a share of few points is coarse); above, a grid (`reference_size`)
EXACT_BELOW = 100
R10 = (100, 125, 160, 200, 250, 315, 400, 500, 630, 800)


class Chunker:
    """The base of the chunkers (see the module doc)."""

    per_update: ClassVar[bool] = False
    size: int | None = None
    incomplete: str = "keep"

    def room(self, open_points: int) -> int | None:
        """Points the open chunk (holding `open_points`) takes before it is cut; None: no
        limit (the update ends it)."""
        return None if self.size is None else self.size - open_points

    def reference_size(self, size: int) -> int:
        """The size of the reference chunks drawn for a chunk of `size` points: `size` itself
        up to `EXACT_BELOW`, then the nearest (in ratio) of Renard's R10 series (100, 125, 160,
        200, 250, 315, 400, 500, 630, 800, 1000, ...: within 12% of the size, its σ then
        scaled by sqrt(m / size); a band per distinct file size cost 0.4 s each), at most
        `MAX_REFERENCE_POINTS`."""
        if size <= EXACT_BELOW:
            return int(size)
        decade = 10 ** math.floor(math.log10(size / 100))
        grid = [r * decade for r in (*R10, 1000)]
        return min(min(grid, key=lambda g: abs(math.log(g / size))), MAX_REFERENCE_POINTS)

    def reference_indices(
        self, n_source: int, size: int, count: int, rng: np.random.Generator
    ) -> np.ndarray:
        """`count` reference chunks of `size` points (`reference_size`'s), as source indices
        `[count, size]` drawn with replacement."""
        return rng.integers(0, n_source, (count, size))

    def settings(self) -> str:
        """What a resumed run must share with the run it continues (its repr)."""
        return repr(self)


class BySize(Chunker):
    """Chunks of `size` points (`by_size`)."""

    def __init__(self, size: int, incomplete: str = "keep") -> None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"size: expected a positive integer (points per chunk), got {size!r}")
        if incomplete not in INCOMPLETE:
            raise ValueError(f"incomplete: expected one of {list(INCOMPLETE)}, got {incomplete!r}")
        self.size, self.incomplete = int(size), incomplete

    def __repr__(self) -> str:
        tail = "" if self.incomplete == "keep" else f", incomplete={self.incomplete!r}"
        return f"by_size({self.size}{tail})"


class PerUpdate(Chunker):
    """One chunk per `update` (`per_update`)."""

    per_update = True

    def __repr__(self) -> str:
        return "per_update()"


def by_size(size: int, incomplete: str = "keep") -> BySize:
    """Chunks of `size` points; the last, incomplete one kept, dropped or appended to the one
    before it (`incomplete`: "keep", "drop" or "append"; see the module doc).

    Examples:
        >>> from peg.apps.monitor import by_size
        >>> by_size(500, incomplete="drop")
        by_size(500, incomplete='drop')
    """
    return BySize(size, incomplete)


def per_update() -> PerUpdate:
    """One chunk per `update` (a file, a day's batch), judged by a band of its own size.

    Examples:
        >>> from peg.apps.monitor import per_update
        >>> per_update()
        per_update()
    """
    return PerUpdate()


def as_chunker(value: object, argument: str = "chunks") -> Chunker:
    """`value` as a chunker: one already, a positive integer (`by_size`), or None
    (`per_update`); a ValueError naming `argument` otherwise."""
    if isinstance(value, Chunker):
        return value
    if value is None:
        return PerUpdate()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"{argument}: expected a positive integer or None (one chunk per update), or a "
            f"chunker (by_size(n), per_update()), got {value!r}"
        )
    return BySize(int(value))


class OpenChunk:
    """The chunk being filled: its `Summary`, its labelled points and hits, its batches'
    names, and (where the chunker may append it to the chunk before: at most a chunk's
    points) its logits, kept to be added there."""

    def __init__(self, summary: Any, keep: bool) -> None:
        self.summary, self.correct, self.labelled = summary, 0, 0
        self.names: list[str] = []
        self.kept: list[torch.Tensor] | None = [] if keep else None

    @property
    def n(self) -> int:
        return int(self.summary.n)

    def take(self, est: Any, part: torch.Tensor, y: torch.Tensor | None, at: int) -> None:
        """Member logits `part` `[M, b, C]` (their first row `at` in their batch), labels `y`."""
        est.add(self.summary, part, "batch", at)
        if y is not None:
            pred = part.double().log_softmax(-1).mean(0).argmax(-1)
            self.correct += int((pred == y).sum())
            self.labelled += part.shape[1]
        if self.kept is not None:
            self.kept.append(part)  # a view (of a memory map too)

    def absorb(self, est: Any, tail: OpenChunk) -> None:
        """`tail`'s points added to this chunk (an incomplete last chunk appended)."""
        for part in tail.kept or []:
            est.add(self.summary, part, "batch", 0)
        self.correct, self.labelled = self.correct + tail.correct, self.labelled + tail.labelled
        self.names += [n for n in tail.names if n not in self.names]
