"""Streaming metrics equal the one-shot ones, with state that does not grow with N."""

from __future__ import annotations

import pytest
import torch

from peg import metrics
from peg.metrics.ood import ood_metrics
from peg.metrics.streaming import StreamingMetrics, StreamingOOD


@pytest.mark.parametrize("members", [True, False])
@pytest.mark.parametrize(("bins", "min_count"), [(15, 1), (10, 10)])
def test_streaming_equals_one_shot(members, bins, min_count):
    torch.manual_seed(0)
    logits = torch.randn(4, 1000, 7) * 3
    y = torch.randint(0, 7, (1000,))
    pred = logits if members else logits[0].softmax(-1)
    stream = StreamingMetrics(bins, min_count)
    for idx in torch.arange(1000).split(137):
        stream.update(pred[:, idx] if members else pred[idx], y[idx])
    got = stream.compute()
    expected = metrics.classification_metrics(pred, y, bins=bins, min_count=min_count)
    assert got.keys() == expected.keys()
    for k in expected:
        assert got[k] == pytest.approx(expected[k], rel=1e-10, abs=1e-12), k


def test_state_does_not_grow_with_the_number_of_points():
    stream = StreamingMetrics()
    for _ in range(20):
        stream.update(torch.randn(2, 500, 5), torch.randint(0, 5, (500,)))
    sizes = [t.numel() for t in (stream.bin_count, stream.bin_conf, stream.bin_correct)]
    assert sizes == [15, 15, 15] and stream.n == 10_000


def test_streaming_ood_equals_one_shot():
    torch.manual_seed(1)
    p_in, p_out = torch.randn(3, 300, 5) * 4, torch.randn(3, 200, 5)
    stream = StreamingOOD("mutual_information")
    for part in p_in.split(64, dim=1):
        stream.update(part, ood=False)
    for part in p_out.split(50, dim=1):
        stream.update(part, ood=True)
    got, expected = stream.compute(), ood_metrics(p_in, p_out, "mutual_information")
    for k in ("auroc", "aupr_out", "aupr_in", "fpr95"):
        assert got[k] == pytest.approx(expected[k])
    assert got["positive"] == "ood"


def test_mixing_kinds_or_empty_streams_are_errors():
    stream = StreamingMetrics()
    with pytest.raises(ValueError, match="no batches"):
        stream.compute()
    stream.update(torch.randn(2, 4, 3), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="same kind"):
        stream.update(torch.randn(4, 5).softmax(-1), torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="score"):
        StreamingOOD("odin")
    with pytest.raises(ValueError, match="both"):
        StreamingOOD().compute()


@pytest.mark.parametrize("members", [True, False])
def test_every_selectable_metric_streams_to_its_one_shot_value(members):
    """The classwise ECE from per-class bin sums (~1e-12); the adaptive ECE, AURC and AUGRC
    from the kept confidences and correctness, ranked by the one-shot code: bit-equal."""
    torch.manual_seed(2)
    logits = torch.randn(3, 900, 6) * 3
    y = torch.randint(0, 6, (900,))
    pred = logits if members else (logits[0].softmax(-1) * 8).round() / 8  # ties, then renormed
    pred = pred if members else pred / pred.sum(-1, keepdim=True)
    keys = metrics.CLASSIFICATION_METRICS
    stream = StreamingMetrics(bins=10, metrics=keys)
    for idx in torch.arange(900).split(128):
        stream.update(pred[:, idx] if members else pred[idx], y[idx])
    got = stream.compute()
    expected = metrics.classification_metrics(pred, y, bins=10, metrics=keys)
    assert list(got) == list(expected) == [k for k in keys if members or k != "gibbs_nll"]
    for k in ("adaptive_ece", "aurc", "augrc"):
        assert got[k] == expected[k], k
    for k in expected:
        assert got[k] == pytest.approx(expected[k], rel=1e-12, abs=1e-15), k


def test_the_state_each_selection_keeps():
    stream = StreamingMetrics(bins=15, metrics=["nll", "classwise_ece"])
    for _ in range(3):
        stream.update(torch.randn(2, 500, 5), torch.randint(0, 5, (500,)))
    assert [tuple(t.shape) for t in stream.classwise] == [(5, 15)] * 3
    assert stream.confidence == stream.correct == []  # no per-point state
    assert list(stream.compute()) == ["nll", "classwise_ece"]
    ranked = StreamingMetrics(metrics=["aurc"])
    for _ in range(3):
        ranked.update(torch.randn(2, 500, 5), torch.randint(0, 5, (500,)))
    kept = ranked.confidence + ranked.correct  # [B] scalars per batch, never [B, C]
    assert all(t.ndim == 1 for t in kept) and sum(t.numel() for t in kept) == 2 * 1500
    assert {t.dtype for t in kept} == {torch.float64, torch.bool} and ranked.classwise == []
    with pytest.raises(ValueError, match=r"metrics: unknown \['auc'\]"):
        StreamingMetrics(metrics=["nll", "auc"])
