"""peg's ECE, MCE, NLL and Brier against torchmetrics on 10⁶ × 100 probabilities.

Target (issue 15): every metric at least as fast as torchmetrics, one-shot and streaming, with
the values unchanged. Printed per metric: the median time of peg and of the reference over
round-robin rounds (each round times every case in turn, peg and the reference in alternating
order), the ratio reference / peg (>= 1: peg at least as fast) and the largest difference
between their values. The inputs are generated before the clock starts; both sides run with
the same thread setting (printed on the machine line) in this process.

References: ECE and MCE, `torchmetrics.functional.classification.multiclass_calibration_error`
(norm "l1" / "max", 15 bins) and its stateful `MulticlassCalibrationError` for the stream;
NLL, `torch.nn.functional.nll_loss` on log-probabilities (torchmetrics has no classification
NLL); Brier, the plain torch expression ((p - onehot)²).sum(1).mean() (torchmetrics has no
multiclass Brier score). The stream feeds both sides the same batches: peg's
`StreamingMetrics` computes all five metrics (NLL, error, Brier, ECE, MCE) from one update
per batch, the reference updates ECE and MCE objects and sums NLL and Brier per batch; a
last row times torchmetrics' ECE stream alone against peg's whole stream.

The values differ by float32 rounding, not by definition: torchmetrics and the plain torch
expressions compute in the input's float32 (peg: float64, each row divided by its float64
sum), and torchmetrics' bins are left-closed, [lo, hi), where peg's are right-closed, which
moves only a confidence exactly on an edge. (On these inputs torchmetrics' binning redone in
float64 agrees with peg's ECE to 7e-11, the renormalisation of the rows.)

    pip install 'peg[bench]'    # torchmetrics, for this benchmark only
    OMP_NUM_THREADS=1 python benchmarks/metrics_speed.py [--rows 1000000] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from peg import metrics
from peg.metrics.streaming import StreamingMetrics
from peg.utils.env import git_commit, machine

try:
    from torchmetrics.classification import MulticlassCalibrationError
    from torchmetrics.functional.classification import multiclass_calibration_error
except ImportError:  # a benchmark-only dependency
    raise SystemExit("metrics_speed needs torchmetrics: pip install 'peg[bench]'") from None

BINS = 15
Case = tuple[str, Callable[[], dict[str, float]], Callable[[], dict[str, float]]]


def _brier(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The plain torch Brier score, summed over the rows."""
    return ((p - F.one_hot(y, p.shape[1])) ** 2).sum(1).sum()


def _one_shot_cases(p: torch.Tensor, y: torch.Tensor) -> list[Case]:
    C, N = p.shape[1], len(y)

    def ce(norm: str) -> float:
        return float(multiclass_calibration_error(p, y, C, BINS, norm))

    return [
        ("ECE", lambda: {"ece": metrics.ece(p, y, BINS)}, lambda: {"ece": ce("l1")}),
        ("MCE", lambda: {"mce": metrics.mce(p, y, BINS)}, lambda: {"mce": ce("max")}),
        (
            "NLL",
            lambda: {"nll": metrics.nll(p, y)},
            lambda: {"nll": float(F.nll_loss(p.log(), y))},
        ),
        (
            "Brier",
            lambda: {"brier": metrics.brier(p, y)},
            lambda: {"brier": float(_brier(p, y)) / N},
        ),
    ]


def _peg_stream(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    stream = StreamingMetrics(bins=BINS)
    for p, y in batches:
        stream.update(p, y)
    return stream.compute()


def _reference_stream(
    batches: list[tuple[torch.Tensor, torch.Tensor]], C: int, ece_only: bool = False
) -> dict[str, float]:
    ece = MulticlassCalibrationError(C, BINS, "l1")
    mce = None if ece_only else MulticlassCalibrationError(C, BINS, "max")
    nll = brier = 0.0
    for p, y in batches:
        ece.update(p, y)
        if mce is not None:
            mce.update(p, y)
            nll += float(F.nll_loss(p.log(), y, reduction="sum"))
            brier += float(_brier(p, y))
    if mce is None:
        return {"ece": float(ece.compute())}
    n = sum(len(y) for _, y in batches)
    return {
        "ece": float(ece.compute()),
        "mce": float(mce.compute()),
        "nll": nll / n,
        "brier": brier / n,
    }


def _stream_cases(p: torch.Tensor, y: torch.Tensor, batch: int) -> list[Case]:
    batches = list(zip(p.split(batch), y.split(batch), strict=True))
    C = p.shape[1]
    return [
        (
            "stream: ECE, MCE, NLL, Brier",
            lambda: _peg_stream(batches),
            lambda: _reference_stream(batches, C),
        ),
        (
            "stream: peg all five vs torchmetrics ECE only",
            lambda: _peg_stream(batches),
            lambda: _reference_stream(batches, C, ece_only=True),
        ),
    ]


def _time(f: Callable[[], dict[str, float]]) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    out = f()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=10_000, help="rows per streamed batch")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="10⁴ rows, 2 rounds (a smoke run)")
    args = parser.parse_args()
    N, C = (10_000 if args.quick else args.rows), args.classes
    rounds = 2 if args.quick else args.rounds
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, C, (N,), generator=g)
    logits = 3 * torch.randn(N, C, generator=g)
    logits[torch.arange(N), y] += 2.0  # a classifier that is right about half the time
    p = logits.softmax(-1)  # float32 probabilities [N, C]
    del logits
    cases = _one_shot_cases(p, y) + _stream_cases(p, y, args.batch)
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name, *_ in cases}
    diffs = dict.fromkeys(times, 0.0)
    for r in range(rounds):
        for name, peg_f, ref_f in cases:
            order = [(0, peg_f), (1, ref_f)]
            got: list[dict[str, float]] = [{}, {}]
            for side, f in order if r % 2 == 0 else order[::-1]:
                seconds, got[side] = _time(f)
                times[name][side].append(seconds)
            diffs[name] = max(abs(got[0][k] - v) for k, v in got[1].items())
    print(f"commit: {git_commit() or 'unknown'}")
    print(f"machine: {machine()}")
    print(f"probabilities [{N}, {C}] float32, {BINS} bins, streamed in batches of {args.batch}")
    print(f"median of {rounds} round-robin rounds; ratio = torchmetrics / peg (>= 1: peg faster)")
    print(f"{'metric':46} {'peg s':>7} {'ref s':>7} {'ratio':>6} {'max |diff|':>10}")
    for name, (peg_t, ref_t) in times.items():
        a, b = statistics.median(peg_t), statistics.median(ref_t)
        print(f"{name:46} {a:7.3f} {b:7.3f} {b / a:6.2f} {diffs[name]:10.2e}")


if __name__ == "__main__":
    main()
