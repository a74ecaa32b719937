"""`peg.Monitor` from small objects: the chunkers (`by_size(n, incomplete=...)`, `per_update()`)
cut the stream and size the reference chunks, the bands (`Sigmas(k)`, `Fixed(lo, hi)`) are
passed as `band=`, each chunk is a `ChunkResult` whose alerts are `Alert` records, an estimate
that says it is unreliable is an alert of its own kind, and the report opens with the verdict
line, alerts in red, the chunks named on the x axis, words as column headers, the version and
the date."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import functools
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import peg
from bad_inputs import raises_test
from peg.apps.monitor import Alert, ChunkResult, Fixed, Sigmas, by_size, per_update
from peg.apps.monitor.chunking import MAX_REFERENCE_POINTS

C = 4


def _sample(n: int, seed: int, signal: float = 2.5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    logits = rng.standard_normal((n, C))
    logits[np.arange(n), y] += signal
    return logits.astype(np.float32), y


@functools.cache
def _fitted() -> peg.PerformanceEstimator:
    return peg.PerformanceEstimator("ac").fit(*_sample(600, 0))


def _stream(chunker, sizes=(70, 70, 70, 40)) -> peg.Monitor:
    m = peg.Monitor(_fitted(), chunker, n_reference=20)
    for i, n in enumerate(sizes):
        m.update(*_sample(n, 10 + i), name=f"b{i}")
    return m.close()


def test_by_size_keeps_drops_or_appends_the_incomplete_last_chunk():
    keep, drop, append = (_stream(by_size(100, incomplete=k)) for k in ("keep", "drop", "append"))
    assert [c.n for c in keep.chunks] == [100, 100, 50]
    assert [c.n for c in drop.chunks] == [100, 100]
    assert [c.n for c in append.chunks] == [100, 150]
    last = append.chunks[-1]
    assert last.source == "b1 + b2 + b3" and keep.chunks[-1].source == "b2 + b3"
    y = np.concatenate([_sample(n, 10 + i)[1] for i, n in enumerate((70, 70, 70, 40))])
    z = np.concatenate([_sample(n, 10 + i)[0] for i, n in enumerate((70, 70, 70, 40))])
    assert last.realized_accuracy == pytest.approx((z.argmax(1) == y)[100:].mean())
    # the appended chunk is estimated on all its points: as the same 150 points in one go
    whole = peg.Monitor(_fitted(), per_update(), n_reference=20).update(z[100:]).chunks[0]
    assert last.accuracy == pytest.approx(whole.accuracy)
    assert [c.n for c in _stream(per_update()).chunks] == [70, 70, 70, 40]
    assert [c.n for c in _stream(by_size(100, "append"), (100, 100)).chunks] == [100, 100]


def test_each_chunk_is_judged_by_a_band_of_its_own_size():
    """The band came from 500-point reference chunks whatever the update's size: 17 of 40
    clean 50-point updates alerted."""
    m = peg.Monitor(_fitted(), per_update(), n_reference=50)
    m.update(_sample(50, 1)[0]).update(_sample(800, 2)[0]).update(_sample(50, 3)[0])
    assert sorted(m.references) == [50, 800]  # 800 on the grid
    width = {c.n: c.band[1] - c.band[0] for c in m.chunks}
    assert width[50] > 2.5 * width[800]  # the estimate's spread falls as 1 / sqrt(n)
    assert m.chunks[0].band == m.chunks[2].band == list(m.limits(50))
    lo, hi = m.limits(10**12)  # drawn at MAX_REFERENCE_POINTS, the spread scaled: no 7 TiB
    assert max(m.references) == MAX_REFERENCE_POINTS and 0 <= lo < hi <= 1
    assert m.chunker.reference_size(1100) == 1000 and m.chunker.reference_size(77) == 77


def test_the_band_is_an_object_passed_as_band():
    est = _fitted()
    clean = _sample(200, 1)[0]
    fixed = peg.Monitor(est, band=Fixed(0.99, 1.0)).update(clean).chunks[0]
    (alert,) = fixed.alerts
    assert (alert.kind, alert.value, alert.limit, alert.p) == ("band", fixed.accuracy, 0.99, None)
    assert fixed.band == [0.99, 1.0] and fixed.reasons == [alert.text()]
    assert alert.text() == f"estimate {fixed.accuracy:.3f} below the band's 0.990"
    narrow = peg.Monitor(est, band=Sigmas(1), n_reference=30).update(clean).chunks[0]
    wide = peg.Monitor(est, band=Sigmas(4), n_reference=30).update(clean).chunks[0]
    half = (narrow.band[1] - narrow.band[0], wide.band[1] - wide.band[0])
    assert half[1] == pytest.approx(4 * half[0]) or wide.band[1] == 1.0
    earlier = peg.Monitor(est, sigmas=4, n_reference=30).update(clean).chunks[0]
    assert earlier.band == wide.band and repr(peg.Monitor(est, 50).chunker) == "by_size(50)"


def test_a_test_that_fires_is_an_alert_record_and_a_chunk_reads_as_its_dict(tmp_path):
    one = _sample(100, 3)[0]
    one[:, 0] += 100  # every point predicted as class 0: label shift
    m = peg.Monitor(_fitted(), out=tmp_path / "m", n_reference=20).update(one, name="one")
    chunk = m.chunks[0]
    shift = next(a for a in chunk.alerts if a.kind == "label shift")
    assert shift.p == shift.value == chunk.label_shift_p and shift.limit == pytest.approx(0.01 / 3)
    assert shift.p < shift.limit and chunk.alert and chunk["alert"]
    assert chunk["accuracy"] == chunk.accuracy and chunk.get("nothing") is None
    with pytest.raises(KeyError):
        chunk["nothing"]
    saved = json.loads((tmp_path / "m" / "results.json").read_text())["chunks"][0]
    assert saved["reasons"] == chunk.reasons and saved["alerts"][0]["kind"] == chunk.alerts[0].kind
    assert ChunkResult.from_dict(saved) == chunk


def test_an_unreliable_estimate_is_an_alert_of_its_own(monkeypatch):
    """`Estimate.reliable` False (its reasons given) is an alert "estimate unreliable: ..."
    even where the band and the tests are quiet; the verdict line says it."""
    est = _fitted()
    read = type(est).read
    reason = "the target is far from the source"

    def unreliable(self, summary):
        got = read(self, summary)
        return dataclasses.replace(got, reliable=summary.n != 120, reasons=(reason,))

    monkeypatch.setattr(type(est), "read", unreliable)
    m = peg.Monitor(est, n_reference=20).update(_sample(200, 1)[0]).update(_sample(120, 2)[0])
    first, last = m.chunks
    assert first.reliable and not any(a.kind == "unreliable" for a in first.alerts)
    (alert,) = [a for a in last.alerts if a.kind == "unreliable"]
    assert not last.reliable and alert.detail == reason and alert.value == last.accuracy
    assert f"estimate unreliable: {reason}" in last.reasons
    lo, hi = last.interval
    assert m.to_text("md").splitlines()[2] == (
        f"**2 chunks, {len(m.alerts)} alert{'s' * (len(m.alerts) != 1)}; latest estimate "
        f"{last.accuracy:.2f} \\[{lo:.2f}, {hi:.2f}], unreliable: {reason}**"
    )


def test_the_report_opens_with_the_verdict_and_shows_alerts_in_red():
    m = peg.Monitor(_fitted(), n_reference=20)
    m.update(_sample(300, 1)[0], name="monday.npy").update(_sample(300, 4)[0], name="tuesday.npy")
    m.update(_sample(300, 3, signal=0.5)[0], name="wednesday.npy")  # harder: alerts
    assert [c.alert for c in m.chunks] == [False, False, True]
    page = m.to_html()
    body = page.split("<h1>", 1)[1]
    first = re.search(r'<p class="([^"]*)">(.*?)</p>', body)
    last = m.chunks[-1]
    caveat = "" if last.reliable else f", unreliable: {last.reasons[-1].split(': ', 1)[1]}"
    assert first.group(1) == "peg-verdict peg-worse" and first.group(2) == (
        f"3 chunks, {len(m.alerts)} alert{'s' * (len(m.alerts) != 1)}; latest estimate "
        f"{last.accuracy:.2f} [{last.interval[0]:.2f}, {last.interval[1]:.2f}]{caveat}"
    )
    assert page.count('<tr class="peg-alert">') == 1 and "peg-chosen" not in body
    assert "<th>estimated accuracy</th>" in page and "<th>label_shift_p</th>" not in page
    assert f"peg {peg.__version__}, {datetime.date.today().isoformat()}" in page
    assert re.search(r"<title>peg monitor: accuracy without labels", page)
    ax = m.plot().axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "monday.npy",
        "tuesday.npy",
        "wednesday.npy",
    ]


def test_the_command_imports_what_it_uses_and_bounds_the_chunk_size(tmp_path):
    """`import peg` in apps/monitor/command.py was the one arrow up from the applications;
    `--chunk-size 10**12` asked the reference chunks for 7.3 TiB."""
    import peg.apps.monitor.command as command

    tree = ast.parse(Path(command.__file__).read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "peg" not in imported
    targets = [("--logits", name, np.zeros((n, C)), None) for name, n in (("a", 30), ("b", 5))]
    command.check_chunk_size(35, targets)
    with pytest.raises(ValueError, match=r"--chunk-size: 36 points per chunk, more than the 35"):
        command.check_chunk_size(36, targets)


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "Monitor",
        "by_size(0)",
        lambda: by_size(0),
        ValueError,
        r"size: expected a positive integer \(points per chunk\), got 0",
    ),
    (
        "Monitor",
        "by_size with an unknown incomplete",
        lambda: by_size(10, incomplete="pad"),
        ValueError,
        r"incomplete: expected one of \['keep', 'drop', 'append'\], got 'pad'",
    ),
    (
        "Monitor",
        "a chunker that is not one",
        lambda: peg.Monitor(_fitted(), "daily"),
        ValueError,
        r"chunker: expected a positive integer or None .*by_size\(n\), per_update\(\)",
    ),
    (
        "Monitor",
        "chunker and chunk_size both",
        lambda: peg.Monitor(_fitted(), by_size(10), chunk_size=10),
        ValueError,
        r"chunk_size: give chunker or chunk_size \(its earlier name\), not both",
    ),
    (
        "Monitor",
        "Sigmas(0)",
        lambda: Sigmas(0),
        ValueError,
        r"k: expected a positive number of standard deviations, got 0",
    ),
    (
        "Monitor",
        "Fixed(lo, hi) with lo above hi",
        lambda: Fixed(0.9, 0.5),
        ValueError,
        r"lo: expected at most hi \(0.5\), got 0.9",
    ),
    (
        "Monitor",
        "Fixed(lo) out of [0, 1]",
        lambda: Fixed(80),
        ValueError,
        r"lo: expected an accuracy in \[0, 1\], got 80",
    ),
    (
        "Monitor",
        "a band that is not one",
        lambda: peg.Monitor(_fitted(), band=(0.8, 1.0)),
        ValueError,
        r"band: expected Sigmas\(k\), Fixed\(lo, hi\) or a number of σ, got \(0.8, 1.0\)",
    ),
]

test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


def test_alert_text_for_each_kind():
    assert Alert("band", 0.95, 0.9).text() == "estimate 0.950 above the band's 0.900"
    assert (
        Alert("covariate shift", 0.8, 0.0033, 1e-5).text() == "covariate shift: p = 1e-05 < 0.0033"
    )
    assert Alert("unreliable", 0.5).text() == "estimate unreliable: no reason given"
