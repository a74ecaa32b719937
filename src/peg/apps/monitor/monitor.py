"""`peg.Monitor`: a fitted `PerformanceEstimator` run over a stream of unlabelled batches, chunk
by chunk, with alerts.

Per chunk (`chunk_size` points, or one per `update` when None): the estimated accuracy and its
interval, EM's target priors and their test against the source's, the domain classifier's
AUROC and p-value, the OOD share (energy below the source's 5% quantile) and its test, the
realized accuracy where every point of the chunk came with its label, and `alert` with its
`reasons`: the estimate outside the band (mean ± `sigmas` σ of the estimates on `n_reference`
chunks drawn from the source validation data, NannyML's rule, clipped to [0, 1]) or a test
with p < `alpha` / 3 (Bonferroni: three tests). With `out`, results.json / .md / .csv are
rewritten (atomically) as each chunk ends, in a folder claimed as `peg compare` claims its
own: a crash loses no finished chunk (`files.py`: results.json the source of truth, an earlier
run replaced only with `overwrite` or taken back with `resume`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from peg.apps.html import Reported
from peg.apps.monitor import drift, files, report
from peg.methods.estimation import PerformanceEstimator
from peg.methods.estimation._stats import Summary
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
        chunk_size: points per chunk (batches are split or joined to it; the last, incomplete
            chunk ends with `run` or `close()`), or None: each `update` is one chunk.
        sigmas: the band's half-width in standard deviations of the reference chunks.
        alpha: the tests' level for a chunk, split between the three (Bonferroni): each fires
            below alpha / 3. Unsplit, 3-9% of clean chunks alerted at 0.01; split, 0-2.5%
            (benchmarks/monitor_false_alarms.py), plus what one fixed source sample adds.
        n_reference: reference chunks drawn (with replacement) from the source (20 gave a
            band from a noisy σ: 10% of clean 50-point chunks of a digits model left it), at
            most `MAX_REFERENCE` (10,000: each costs an estimate; σ gains nothing beyond).
        out: a folder to write results.json / .md / .csv in as each chunk ends, or None.
        overwrite: write into a non-empty folder peg monitor did not make, or replace the
            chunks of an earlier run in `out`.
        resume: continue the earlier run in `out` (killed, or done): its chunks kept, .md /
            .csv rewritten from them; feed the rest of the stream (its first
            `sum(c["n"] for c in chunks)` points were read); `adapted()` sees new chunks only.
        seed: the reference chunks and the domain classifier's samples.

    `update(batch, labels, name=)`: `name` a string (a path is one), checked before the batch
    is read, so a bad one loses no chunk.

    Examples:
        >>> import torch, peg
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.randint(0, 3, (300,), generator=g)
        >>> logits = torch.randn(300, 3, generator=g)
        >>> logits[torch.arange(300), labels] += 1.0
        >>> logits = 4 * logits  # an over-confident model's saved logits [N, C]
        >>> estimator = peg.PerformanceEstimator("atc-mc").fit(logits[:200], labels[:200])
        >>> monitor = peg.Monitor(estimator, chunk_size=50)
        >>> stream = [logits[200:250], logits[250:300]]  # batches of the deployed model
        >>> len(monitor.run(stream).chunks)  # each: its estimate, interval, tests and alert
        2

    See Also:
        peg.PerformanceEstimator: the accuracy estimate each chunk gets.
        peg.LabelShift: the map `adapted()` returns once the label-shift test fires.
        docs/monitor.md: the band, the three tests and the command `peg monitor`.
    """

    def __init__(
        self,
        estimator: PerformanceEstimator,
        chunk_size: int | None = None,
        *,
        sigmas: float = 3.0,
        alpha: float = 0.01,
        n_reference: int = 200,
        out: str | os.PathLike[str] | None = None,
        overwrite: bool = False,
        resume: bool = False,
        seed: int = 0,
    ) -> None:
        if not isinstance(estimator, PerformanceEstimator):
            raise TypeError(
                f"estimator: expected a fitted peg.PerformanceEstimator, got "
                f"{type(estimator).__name__}"
            )
        estimator._check_fitted()
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
        ):
            raise ValueError(f"chunk_size: expected a positive integer or None, got {chunk_size!r}")
        for name, value in (("sigmas", sigmas), ("alpha", alpha)):
            if not isinstance(value, (int, float)) or not 0 < value < (
                1 if name == "alpha" else 100
            ):
                raise ValueError(
                    f"{name}: expected a positive number (alpha below 1), got {value!r}"
                )
        if (
            isinstance(n_reference, bool)
            or not isinstance(n_reference, int)
            or not 2 <= n_reference <= MAX_REFERENCE
        ):
            raise ValueError(
                f"n_reference: expected an integer in [2, {MAX_REFERENCE}] (the band's σ is "
                f"within 1% of its limit from 5,000 chunks on), got {n_reference!r}"
            )
        self.estimator, self.chunk_size = estimator, chunk_size
        self.sigmas, self.alpha, self.n_reference, self.seed = sigmas, alpha, n_reference, seed
        self.out = None if out is None else files.claim(out, overwrite)
        self.chunks: list[dict[str, Any]] = []
        self._reset()
        self._band: tuple[float, float, float] | None = None
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
                "chunk_size": self.chunk_size, "sigmas": self.sigmas, "alpha": self.alpha,
                "n_reference": self.n_reference}  # fmt: skip

    # ---------------------------------------------------------------- the band
    @property
    def band(self) -> tuple[float, float]:
        """(lo, hi): the reference chunks' mean ± `sigmas` σ, clipped to [0, 1]."""
        if self._band is None:
            self._band = self._reference(self.chunk_size or 500)
        return self._band[1], self._band[2]

    def _reference(self, size: int) -> tuple[float, float, float]:
        est, source = self.estimator, self.estimator.source_
        rng = np.random.default_rng(self.seed)
        values, chi2 = [], []
        for _ in range(self.n_reference):
            idx = torch.from_numpy(rng.choice(len(source.y), size, True))
            summary = est.summary()
            summary.add(source.lp[idx])
            result = est.read(summary)
            values.append(result.accuracy)
            chi2.append(drift.label_shift_statistic(np.asarray(result.priors), source.priors, size))
        self._dispersion = max(1.0, float(np.mean(chi2)) / max(source.classes - 1, 1))
        mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
        return mean, max(0.0, mean - self.sigmas * sd), min(1.0, mean + self.sigmas * sd)

    # ---------------------------------------------------------------- the stream
    def _reset(self) -> None:
        self._summary: Summary | None = None
        self._correct, self._labelled = 0, 0
        self._names: list[str] = []

    def update(self, batch: Any, labels: Any = None, *, name: str | None = None) -> Monitor:
        """One batch: logits `[B, C]` (or member logits `[M, B, C]`; a memory-mapped `.npy` is
        read `estimator.batch_size` rows at a time, never whole), or inputs for the estimator's
        model (any loader, streamed); `labels` `[B]` when known (the realized accuracy); `name`
        (a file's) in the chunk's `source`. With `chunk_size` None the batch is one chunk. A
        bad batch is a ValueError naming `batch`, its chunk and row; the chunks before it are
        kept (and written), and so are, with `chunk_size`, the rows read before the bad one."""
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
            if self.chunk_size is None:  # this batch's own chunk: dropped, not joined to the next
                self._reset()
            raise  # with chunk_size, the rows read before the bad one stay in the open chunk
        if self.chunk_size is None:
            self.close()
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
        n = logits.shape[1]
        at = 0
        while at < n:
            room = n if self.chunk_size is None else self.chunk_size - self._size()
            part = logits[:, at : at + room]
            if self._summary is None:
                self._summary = self.estimator.summary()
            try:
                self.estimator.add(self._summary, part, "batch", offset + at)
            except ValueError as e:
                raise ValueError(f"{e} (chunk {len(self.chunks)})") from None
            if name is not None and name not in self._names:
                self._names.append(name)
            if y is not None:
                pred = part.double().log_softmax(-1).mean(0).argmax(-1)
                self._correct += int((pred == y[at : at + room]).sum())
                self._labelled += part.shape[1]
            at += part.shape[1]
            if self.chunk_size is not None and self._size() >= self.chunk_size:
                self.close()

    def _size(self) -> int:
        return 0 if self._summary is None else self._summary.n

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
        """End the current chunk (if it holds any point): estimate, test, write."""
        if self._summary is None or self._summary.n == 0:
            return self
        summary, correct, labelled = self._summary, self._correct, self._labelled
        names = self._names
        self._reset()
        self.chunks.append(self._chunk(summary, correct, labelled, names))
        self._write()
        return self

    def _chunk(
        self, summary: Summary, correct: int, labelled: int, names: list[str]
    ) -> dict[str, Any]:
        est = self.estimator
        result = est.read(summary)
        source, rows = est.source_, summary.rows()
        q = np.asarray(result.priors)
        lo, hi = self.band  # the reference chunks: the band and the dispersion
        p_label = drift.label_shift_test(
            q, source.priors, summary.n, self._dispersion, len(source.y)
        )
        auroc, p_cov = drift.covariate_test(rows, source.lp.numpy(), self.seed + len(self.chunks))
        p_ood = drift.ood_test(summary.low_energy, summary.n, 0.05, len(source.y))
        reasons, level = [], self.alpha / drift.TESTS
        if not lo <= result.accuracy <= hi:
            reasons.append(f"estimate {result.accuracy:.3f} outside the band [{lo:.3f}, {hi:.3f}]")
        for name, p in (("label shift", p_label), ("covariate shift", p_cov), ("OOD share", p_ood)):
            if p is not None and p < level:
                reasons.append(f"{name}: p = {p:.2g} < {level:.2g}")
        if p_label is not None and p_label < level:
            self._flagged = rows
        return {
            "chunk": len(self.chunks),
            "source": " + ".join(names) if names else None,
            "n": summary.n,
            "accuracy": result.accuracy,
            "interval": list(result.interval),
            "method": result.method,
            "band": [lo, hi],
            "priors": result.priors,
            "label_shift_p": p_label,
            "domain_auroc": auroc,
            "covariate_p": p_cov,
            "ood_share": summary.low_energy / summary.n,
            "ood_p": p_ood,
            "realized_accuracy": correct / labelled if labelled == summary.n else None,
            "labelled": labelled,
            "alert": bool(reasons),
            "reasons": reasons,
        }

    # ---------------------------------------------------------------- results
    @property
    def alerts(self) -> list[dict[str, Any]]:
        """The chunks that raised an alert (outside the band, or a test fired), in order."""
        return [c for c in self.chunks if c["alert"]]

    def _write(self) -> None:
        if self.out is not None:
            files.write(self, self.out)

    def _report(self) -> Any:
        return report.build(self)

    def to_pandas(self) -> Any:
        """The chunks as a `pandas.DataFrame`, a row per chunk (indexed by `chunk`): `source`,
        `n`, `accuracy`, its interval as `lo`, `hi`, the tests' values, `alert`, `reasons`;
        a value not computed (a test on a small chunk, the accuracy of an unlabelled chunk) is
        NaN. pandas is not a dependency of peg: an ImportError saying how to install it."""
        frame = super().to_pandas()
        return frame.astype({k: "float64" for k in report.FLOATS if k in frame.columns})

    def plot(self, ax: Any = None, path: str | os.PathLike[str] | None = None) -> Any:
        """The timeline: each chunk's estimate and interval, the band, realized accuracies and
        alerts; a Figure (as `peg.plots` return: `ax` to draw into, `path` to write a PNG)."""
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
        return f"Monitor(chunks={len(self.chunks)}, alerts={len(self.alerts)}{where})"
