"""How the monitor judges a chunk: the reference chunks of its size drawn from the source (the
band's mean and σ, the label-shift test's dispersion), its estimate, the three tests
(`drift.py`), and what fired, as `Alert` records (`records.py`). `monitor` below: a `Monitor`
(its module imports this one)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from peg.apps.monitor import drift
from peg.apps.monitor.records import (
    BAND,
    COVARIATE_SHIFT,
    LABEL_SHIFT,
    OOD,
    UNRELIABLE,
    Alert,
    ChunkResult,
)


def reference(monitor: Any, size: int) -> tuple[float, float, float]:
    """(mean, sd, dispersion) of the estimates on `monitor.n_reference` chunks of `size`
    points drawn from the source (`chunker.reference_indices`), seeded by the monitor's seed
    and the size (the same band whatever came before); the dispersion: the label-shift
    statistic's mean over them / (C − 1), at least 1 (`drift.label_shift_test`)."""
    est = monitor.estimator
    source = est.source_
    rng = np.random.default_rng([monitor.seed, size])
    rows = monitor.chunker.reference_indices(len(source.y), size, monitor.n_reference, rng)
    values, chi2 = [], []
    for idx in rows:
        summary = est.summary()
        summary.add(source.lp[torch.from_numpy(idx)])  # calibrated log-probabilities already
        result = est.read(summary)
        values.append(result.accuracy)
        q = np.asarray(result.priors)
        chi2.append(drift.label_shift_statistic(q, source.priors, len(idx)))
    dispersion = max(1.0, float(np.mean(chi2)) / max(source.classes - 1, 1))
    return float(np.mean(values)), float(np.std(values, ddof=1)), dispersion


def judge(monitor: Any, chunk: Any) -> ChunkResult:
    """The `ChunkResult` of an ended chunk (`chunking.OpenChunk`): its estimate, band and
    tests, and what fired."""
    est, summary = monitor.estimator, chunk.summary
    result = est.read(summary)
    source, rows, n = est.source_, summary.rows(), summary.n
    _, _, dispersion = monitor._reference(n)
    lo, hi = monitor.limits(n)
    q = np.asarray(result.priors)
    p_label = drift.label_shift_test(q, source.priors, n, dispersion, len(source.y))
    auroc, p_cov = drift.covariate_test(rows, source.lp.numpy(), monitor.seed + len(monitor.chunks))
    share = summary.low_energy / n
    p_ood = drift.ood_test(summary.low_energy, n, 0.05, len(source.y))
    alerts, level = [], monitor.alpha / drift.TESTS
    if not lo <= result.accuracy <= hi:
        alerts.append(Alert(BAND, result.accuracy, lo if result.accuracy < lo else hi))
    tests = ((LABEL_SHIFT, p_label, p_label), (COVARIATE_SHIFT, auroc, p_cov), (OOD, share, p_ood))
    for kind, value, p in tests:
        if p is not None and p < level:
            alerts.append(Alert(kind, value, level, p))
    reliable = bool(getattr(result, "reliable", True))
    if not reliable:  # the estimator's own word: its interval does not mean anything here
        detail = "; ".join(getattr(result, "reasons", ()))
        alerts.append(Alert(UNRELIABLE, result.accuracy, detail=detail))
    if p_label is not None and p_label < level:
        monitor._flagged = rows
    return ChunkResult(
        chunk=len(monitor.chunks),
        source=" + ".join(chunk.names) if chunk.names else None,
        n=n,
        accuracy=result.accuracy,
        interval=list(result.interval),
        method=result.method,
        band=[lo, hi],
        priors=result.priors,
        label_shift_p=p_label,
        domain_auroc=auroc,
        covariate_p=p_cov,
        ood_share=share,
        ood_p=p_ood,
        realized_accuracy=chunk.correct / chunk.labelled if chunk.labelled == n else None,
        labelled=chunk.labelled,
        alerts=alerts,
        reliable=reliable,
    )
