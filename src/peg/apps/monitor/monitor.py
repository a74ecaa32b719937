"""`peg.Monitor`: a fitted `PerformanceEstimator` run over a stream of unlabelled batches, chunk
by chunk, with alerts; built from small objects: a chunker (`chunking.py`: `by_size(n)`,
`per_update()`) cuts the stream, a band (`thresholds.py`: `Sigmas(k)`, `Fixed(lo, hi)`) judges
each chunk's estimate, and each chunk is a `ChunkResult` whose `alerts` are `Alert` records
(`records.py`) that the reports format (`report.py`).

Per chunk: the estimated accuracy and its interval, EM's target priors and their test against
the source's, the domain classifier's AUROC and p-value, the OOD share (energy below the
source's 5% quantile) and its test, the realized accuracy where every point of the chunk came
with its label, and `alerts`: the estimate outside the band (computed on `n_reference`
reference chunks of the chunk's own size drawn from the source), a test with p < `alpha` / 3
(Bonferroni: three tests), or the estimate saying it is not reliable. With `out`,
results.json / .md / .csv are rewritten (atomically) as each chunk ends, in a folder claimed
as `peg compare` claims its own: a crash loses no finished chunk (`files.py`: results.json the
source of truth, an earlier run replaced only with `overwrite` or taken back with `resume`).

The monitor reads the estimator through its public API only: `summary`, `add`, `read`,
`batches`, `source_`, `temperature_`, `predictor_`, `n_classes_`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from peg.apps.html import Reported
from peg.apps.monitor import files, judge, report
from peg.apps.monitor.chunking import Chunker, OpenChunk, as_chunker
from peg.apps.monitor.records import ChunkResult
from peg.apps.monitor.thresholds import Sigmas, Threshold, as_threshold
from peg.errors import NotFittedError
from peg.methods.estimation import PerformanceEstimator
from peg.source import is_pair
from peg.source._values import check_labels
from peg.source.batches import from_numpy

# reference chunks at most: each costs an estimate on a chunk drawn from the source, and the
# band's σ from n of them has a relative error of about 1 / sqrt(2 (n - 1)) (1% at 5,000)
MAX_REFERENCE = 10_000


class Monitor(Reported):
    """Watch a deployed model without labels (see the module doc).

    Args:
        estimator: a fitted `peg.PerformanceEstimator`.
        chunker: how the stream is cut: `by_size(n, incomplete="keep")` (or the integer n),
            or `per_update()` (or None: each `update` is one chunk); from
            `peg.apps.monitor`. Each chunk is judged by a band of its own size.
        band: the band the estimate must stay in: `Sigmas(k)` (the reference chunks' mean ±
            k σ) or `Fixed(lo, hi)`, from `peg.apps.monitor` (a number k is `Sigmas(k)`).
        alpha: the tests' level for a chunk, split between the three (Bonferroni): each fires
            below alpha / 3.
        n_reference: reference chunks drawn (with replacement) from the source per chunk size,
            at most `MAX_REFERENCE` (10,000: each costs an estimate; σ gains nothing beyond).
        out: a folder to write results.json / .md / .csv in as each chunk ends, or None.
        overwrite: write into a non-empty folder peg monitor did not make, or replace the
            chunks of an earlier run in `out`.
        resume: continue the earlier run in `out` (killed, or done): its chunks kept, .md /
            .csv rewritten from them; feed the rest of the stream (its first
            `sum(c.n for c in chunks)` points were read); `adapted()` sees new chunks only.
        seed: the reference chunks and the domain classifier's samples.
        chunk_size: the earlier name of an integer `chunker` (`by_size(chunk_size)`).
        sigmas: the earlier name of `band=Sigmas(sigmas)`.

    `update(batch, labels, name=)`: `name` a string (a path is one), checked before the batch
    is read, so a bad one loses no chunk. `chunks`: a `ChunkResult` per chunk, its `alerts`
    `Alert` records (`kind`, `value`, `limit`, `p`).

    Examples:
        >>> import torch, peg
        >>> from peg.apps.monitor import Sigmas, by_size
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 3, (300,), generator=g)
        >>> logits = torch.randn(300, 3, generator=g)
        >>> logits[torch.arange(300), labels] += 1.0
        >>> logits = 4 * logits  # an over-confident model's saved logits [N, C]
        >>> estimator = peg.PerformanceEstimator("atc-mc").fit(logits[:200], labels[:200])
        >>> monitor = peg.Monitor(estimator, by_size(50), band=Sigmas(3))
        >>> stream = [logits[200:250], logits[250:300]]  # batches of the deployed model
        >>> [chunk.n for chunk in monitor.run(stream).chunks]  # each: estimate, tests, alerts
        [50, 50]

    See Also:
        peg.PerformanceEstimator: the accuracy estimate each chunk gets.
        peg.LabelShift: the map `adapted()` returns once the label-shift test fires.
        docs/monitor.md: the chunkers, the band, the three tests and the command `peg monitor`.
    """

    def __init__(
        self,
        estimator: PerformanceEstimator,
        chunker: Chunker | int | None = None,
        *,
        band: Threshold | float = Sigmas(3),  # noqa: B008 (immutable)
        alpha: float = 0.01,
        n_reference: int = 200,
        out: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        resume: bool = False,
        seed: int = 0,
        chunk_size: int | None = None,
        sigmas: float | None = None,
    ) -> None:
        if not isinstance(estimator, PerformanceEstimator):
            raise TypeError(
                f"estimator: expected a fitted peg.PerformanceEstimator, got "
                f"{type(estimator).__name__}"
            )
        if not estimator.__sklearn_is_fitted__():
            raise NotFittedError(
                "estimator: the PerformanceEstimator is not fitted: call fit(predictor, val) "
                "or fit(logits, labels) first"
            )
        if chunk_size is not None and chunker is not None:
            raise ValueError("chunk_size: give chunker or chunk_size (its earlier name), not both")
        if chunk_size is not None:
            self.chunker = as_chunker(chunk_size, "chunk_size")
        else:
            self.chunker = as_chunker(chunker, "chunker")
        self.band = as_threshold(band, "band") if sigmas is None else as_threshold(sigmas, "sigmas")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1:
            raise ValueError(f"alpha: expected a probability in (0, 1), got {alpha!r}")
        if (
            isinstance(n_reference, bool)
            or not isinstance(n_reference, int)
            or not 2 <= n_reference <= MAX_REFERENCE
        ):
            raise ValueError(
                f"n_reference: expected an integer in [2, {MAX_REFERENCE}] (the band's σ is "
                f"within 1% of its limit from 5,000 chunks on), got {n_reference!r}"
            )
        self.estimator, self.alpha, self.n_reference, self.seed = (
            estimator, alpha, n_reference, seed)  # fmt: skip
        self.out = None if out is None else files.claim(out, overwrite)
        self.chunks: list[ChunkResult] = []
        # per reference size: the reference chunks' (mean, sd, label-shift dispersion)
        self.references: dict[int, tuple[float, float, float]] = {}
        self._open: OpenChunk | None = None
        self._pending: OpenChunk | None = None  # a full chunk an incomplete last one may join
        self._flagged: np.ndarray | None = None
        if not isinstance(resume, bool) or (resume and out is None):
            raise ValueError(f"resume: expected True (with out) or False, got {resume!r}")
        earlier = None if self.out is None else files.earlier_run(self.out, overwrite, resume)
        if earlier is not None:
            files.resume(self, earlier)

    def _settings(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues."""
        est = self.estimator
        return {"method": est.method, "classes": int(est.n_classes_), "seed": self.seed,
                "chunker": self.chunker.settings(), "band": repr(self.band),
                "alpha": self.alpha, "n_reference": self.n_reference}  # fmt: skip

    # ---------------------------------------------------------------- the band
    def limits(self, size: int) -> tuple[float, float]:
        """(lo, hi): the band for a chunk of `size` points (`band` on the reference chunks of
        that size, computed once per size)."""
        mean, sd, _ = self._reference(size)
        return self.band.limits(mean, sd, size, len(self.estimator.source_.y))

    def _reference(self, size: int) -> tuple[float, float, float]:
        """(mean, sd, dispersion) of the estimates on reference chunks for a chunk of `size`
        points (`judge.reference`, on `chunker.reference_size(size)` points, computed once per
        such size; sd scaled to `size` points)."""
        m = self.chunker.reference_size(size)
        if m not in self.references:
            self.references[m] = judge.reference(self, m)
        mean, sd, dispersion = self.references[m]
        return mean, sd * float(np.sqrt(m / size)), dispersion

    # ---------------------------------------------------------------- the stream
    def update(self, batch: Any, labels: Any = None, *, name: str | None = None) -> Monitor:
        """One batch: logits `[B, C]` (or member logits `[M, B, C]`; a memory-mapped `.npy` is
        read `estimator.batch_size` rows at a time, never whole), or inputs for the estimator's
        model (any loader, streamed); `labels` `[B]` when known (the realized accuracy); `name`
        (a file's) in the chunk's `source`. With `per_update()` the batch is one chunk. A bad
        batch is a ValueError naming `batch`, its chunk and row; the chunks before it are kept
        (and written), and so are, with `by_size`, the rows read before the bad one."""
        if isinstance(name, os.PathLike):
            name = os.fspath(name)
        if name is not None and not isinstance(name, str):
            raise TypeError(
                f"name: expected a string (the batch's source, e.g. its file name) or None, "
                f"got {type(name).__name__} {name!r}"[:300]
            )
        rows = self._rows(batch)
        y = None if labels is None else self._labels(labels, rows)
        at = 0
        try:
            for logits in self._logits(batch):
                n = logits.shape[1]
                if y is not None and at + n > len(y):
                    raise ValueError(f"labels: {len(y)} labels for a batch of more points "
                                     f"(chunk {len(self.chunks)})")  # fmt: skip
                self._take(logits, None if y is None else y[at : at + n], name, at)
                at += n
            if y is not None and at != len(y):
                raise ValueError(
                    f"labels: {len(y)} labels for a batch of {at} points (chunk {len(self.chunks)})"
                )
        except Exception:
            if self.chunker.per_update:  # this batch's own chunk: dropped, not joined to the next
                self._open = None
            raise  # by size, the rows read before the bad one stay in the open chunk
        if self.chunker.per_update and self._open is not None:
            self._finish(self._open)
            self._open = None
        return self

    def _rows(self, batch: Any) -> int | None:
        """The points in `batch` where it says so without being read (saved logits), checked
        as floating-point logits; None for inputs or a loader."""
        if not (isinstance(batch, (np.ndarray, torch.Tensor)) and self._is_saved()):
            return None
        floating = batch.dtype.kind == "f" if isinstance(batch, np.ndarray) else (
            batch.is_floating_point())  # fmt: skip
        if not floating or batch.ndim not in (2, 3):
            raise ValueError(
                f"batch: expected floating-point logits [N, {self.estimator.n_classes_}] (or "
                f"member logits [M, N, C]), got shape {tuple(batch.shape)} and dtype "
                f"{batch.dtype} (chunk {len(self.chunks)})"
            )
        return int(batch.shape[-2])

    def _labels(self, labels: Any, rows: int | None) -> torch.Tensor:
        """`labels` as int64 class indices `[B]`, their count checked against `rows` when known
        (before any work)."""
        try:
            n = len(labels)
        except TypeError:
            raise ValueError(f"labels: expected class labels [B], got {labels!r}") from None
        if rows is not None and n != rows:
            raise ValueError(
                f"labels: {n} labels for a batch of {rows} points (chunk {len(self.chunks)})"
            )
        if n == 0:  # an empty batch's labels (check_labels wants at least one)
            return torch.zeros(0, dtype=torch.long)
        return check_labels(labels, n, self.estimator.n_classes_, "labels").cpu()

    def _logits(self, batch: Any) -> Iterator[torch.Tensor]:
        """Member logits `[M, b, C]`, `estimator.batch_size` points at a time."""
        if not (isinstance(batch, (np.ndarray, torch.Tensor)) and self._is_saved()):
            yield from self.estimator.batches(batch)
            return
        size, rows = int(self.estimator.batch_size), int(batch.shape[-2])
        for at in range(0, rows, size):
            part = batch[..., at : at + size, :]  # a view: a memory map reads these rows only
            part = from_numpy(part) if isinstance(part, np.ndarray) else part
            yield part[None] if part.ndim == 2 else part

    def _is_saved(self) -> bool:
        from peg.methods._predictors import SavedLogits

        return isinstance(self.estimator.predictor_, SavedLogits)

    def _take(
        self, logits: torch.Tensor, y: torch.Tensor | None, name: str | None, offset: int
    ) -> None:
        """`logits` `[M, n, C]` into the chunk(s); `offset`: their first row in the batch."""
        n, at = logits.shape[1], 0
        appends = self.chunker.incomplete == "append"
        while at < n:
            if self._open is None:
                self._open = OpenChunk(self.estimator.summary(), keep=appends)
            room = self.chunker.room(self._open.n)
            part = logits[:, at:] if room is None else logits[:, at : at + room]
            try:
                self._open.take(self.estimator, part, None if y is None else
                                y[at : at + part.shape[1]], offset + at)  # fmt: skip
            except ValueError as e:
                raise ValueError(f"{e} (chunk {len(self.chunks)})") from None
            if name is not None and name not in self._open.names:
                self._open.names.append(name)
            at += part.shape[1]
            if room is not None and part.shape[1] == room:
                self._full(appends)

    def _full(self, appends: bool) -> None:
        """The open chunk is full: ended, or (where an incomplete last chunk may be appended to
        it) held until the next one fills, the one held before it ended."""
        full, self._open = self._open, None
        if not appends:
            self._finish(full)
            return
        if self._pending is not None:
            self._finish(self._pending)
        full.kept = None  # the pending chunk takes a tail, it never becomes one
        self._pending = full

    def run(self, stream: Iterable[Any]) -> Monitor:
        """`update` on every batch of `stream` (an iterable of batches, or of (batch, labels)
        pairs), then `close()`. An empty stream warns and leaves `chunks` as it was."""
        before = len(self.chunks)
        for item in stream:
            if isinstance(item, tuple) and is_pair(item, arrays=False):  # a list is a batch
                self.update(*item)
            else:
                self.update(item)
        self.close()
        if len(self.chunks) == before:
            warnings.warn("stream: no batch in it; no chunk to report", stacklevel=2)
        return self

    def close(self) -> Monitor:
        """The end of the stream: the incomplete last chunk kept, dropped or appended to the
        one before it, as the chunker says; estimated, tested, written."""
        tail, self._open = self._open, None
        pending, self._pending = self._pending, None
        if tail is not None and tail.n > 0:
            if self.chunker.incomplete == "append" and pending is not None:
                pending.absorb(self.estimator, tail)
            elif self.chunker.incomplete != "drop" or self.chunker.per_update:
                self._finish(tail)
        if pending is not None:
            self._finish(pending)
        return self

    def _finish(self, chunk: OpenChunk) -> None:
        if chunk.n > 0:
            self.chunks.append(judge.judge(self, chunk))
            self._write()

    # ---------------------------------------------------------------- results
    @property
    def alerts(self) -> list[ChunkResult]:
        """The chunks that raised an alert (outside the band, a test fired, an unreliable
        estimate), in order."""
        return [c for c in self.chunks if c.alert]

    def verdict(self) -> str:
        """The answer in one line, as the reports open: "3 chunks, 2 alerts; latest estimate
        0.79 [0.73, 0.86]" (and ", unreliable: <reason>" where the latest estimate says so)."""
        return report.verdict(self)

    def _write(self) -> None:
        if self.out is not None:
            files.write(self, self.out)

    def _report(self) -> Any:
        return report.build(self)

    def to_pandas(self) -> Any:
        """The chunks as a `pandas.DataFrame`, a row per chunk (indexed by `chunk`): `source`,
        `n`, `accuracy`, its interval as `lo`, `hi`, the band as `band_lo`, `band_hi`, the
        tests' values, `alert`, `reasons`; a value not computed (a test on a small chunk, the
        accuracy of an unlabelled chunk) is NaN. pandas is not a dependency of peg: an
        ImportError saying how to install it."""
        frame = super().to_pandas()
        return frame.astype({k: "float64" for k in report.FLOATS if k in frame.columns})

    def plot(self, ax: Any = None, path: str | os.PathLike[str] | None = None) -> Any:
        """The timeline: each chunk's estimate and interval, its band, realized accuracies and
        alerts, the chunks named on the x axis; a Figure (as `peg.plots` return: `ax` to draw
        into, `path` to write a PNG)."""
        return report.timeline(self, ax, path)

    def adapted(self) -> Any:
        """`peg.LabelShift` fitted on the source and the last chunk whose label-shift test fired:
        a map over the model's logits `[N, C]` (`.predict_proba(logits)`). A ValueError where
        no chunk flagged label shift."""
        if self._flagged is None:
            raise ValueError("adapted: no chunk flagged label shift (label_shift_p < alpha / 3)")
        from peg.methods.calibration.label_shift import LabelShift

        est, source = self.estimator, self.estimator.source_
        t = est.temperature_  # rows are log softmax(s / T): × T is s up to a constant per row
        return LabelShift().fit(source.lp * t, source.y, target=torch.from_numpy(self._flagged * t))

    def __repr__(self) -> str:
        where = f", out={str(self.out)!r}" if self.out is not None else ""
        return (
            f"Monitor({self.chunker!r}, band={self.band!r}, chunks={len(self.chunks)}, "
            f"alerts={len(self.alerts)}{where})"
        )
