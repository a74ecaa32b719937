"""False alarms on clean data at every chunking: one chunk per update, one chunk per file (`peg
monitor` over small files), and chunks of 20 to 2,000 points. The band came from 500-point
reference chunks whatever the update's size: 17 of 40 clean 50-point updates alerted, 20-50%
of clean 20-100-row files, and `peg monitor --fail-on-alert` exited 4 on six clean 50-row
files. Each chunk is now judged by reference chunks of its own size (and the OOD test is
exact at small chunks). Seeded; the bounds hold with a wide margin (the nominal rate is about
1.3%: alpha = 1% split between three tests, plus 0.27% outside ± 3 σ; measured rates by
chunking in benchmarks/monitor_false_alarms.py)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

import peg
from peg.apps.cli import main
from peg.apps.monitor import by_size, per_update

C = 4
SIZES = (20, 60, 200, 700, 2000)  # per update: each in turn


def _sample(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A well-specified 4-class model's logits: the source and every chunk are draws of it."""
    y = rng.integers(0, C, n)
    z = rng.standard_normal((n, C))
    z[np.arange(n), y] += 2.5
    return z.astype(np.float32), y


@pytest.fixture(scope="module")
def estimator() -> peg.PerformanceEstimator:
    return peg.PerformanceEstimator().fit(*_sample(1000, np.random.default_rng(0)))  # "auto"


CHUNKINGS = [  # (name, chunker, the updates' sizes)
    ("per update, 40 of 50 points", per_update(), [50] * 40),
    ("per update, 20 to 2000 points", per_update(), list(SIZES) * 6),
    ("by_size(20)", by_size(20), [70] * 17),  # 59 chunks and one of 10 (kept)
    ("by_size(200)", by_size(200), [300] * 20),
    ("by_size(2000)", by_size(2000), [2500] * 12),
]


@pytest.mark.parametrize(("name", "chunker", "sizes"), CHUNKINGS, ids=[c[0] for c in CHUNKINGS])
def test_clean_chunks_rarely_alert_at_every_chunking(estimator, name, chunker, sizes):
    rng = np.random.default_rng(len(name))
    m = peg.Monitor(estimator, chunker, seed=1)
    m.run(_sample(n, rng)[0] for n in sizes)
    assert len(m.chunks) >= 15
    rate = np.mean([c.alert for c in m.chunks])
    assert rate <= 0.1, f"{name}: {rate:.1%} of clean chunks alerted: {m.alerts[:3]}"
    band = np.mean([any(a.kind == "band" for a in c.alerts) for c in m.chunks])
    assert band <= 0.05, f"{name}: {band:.1%} of clean chunks left the band"


def test_no_alert_on_six_clean_50_row_files(tmp_path):
    """`peg monitor --fail-on-alert`, one chunk per file: exit 0 on clean files."""
    rng = np.random.default_rng(3)
    V, VL = _sample(1000, rng)
    np.save(tmp_path / "V.npy", V)
    np.save(tmp_path / "VL.npy", VL)
    names = []
    for i in range(6):
        names.append(str(tmp_path / f"day{i}.npy"))
        np.save(names[-1], _sample(50, rng)[0])
    argv = ["monitor", "--val-logits", str(tmp_path / "V.npy"), "--val-labels",
            str(tmp_path / "VL.npy"), "--logits", *names, "--out", str(tmp_path / "out"),
            "--fail-on-alert"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as out:
        status = main(argv)
    assert "6 chunks, 0 alerts" in out.getvalue() and status == 0
