"""Diversity measures: hand-computed fixtures, limits, and clear errors."""

from __future__ import annotations

import math

import pytest
import torch

from peg.metrics import diversity as dv


def _logits_for(classes: list[list[int]], C: int = 3, confidence: float = 5.0) -> torch.Tensor:
    """Member logits `[M, N, C]` predicting the given classes with one large logit."""
    t = torch.tensor(classes)
    return torch.nn.functional.one_hot(t, C).double() * confidence


def test_cosine_similarity_matches_a_hand_computed_matrix():
    W = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    s = 1 / math.sqrt(2)
    expected = torch.tensor([[1, 0, s], [0, 1, s], [s, s, 1]], dtype=torch.float64)
    torch.testing.assert_close(dv.cosine_similarity(W), expected)


def test_cosine_similarity_of_state_dicts_skips_integer_buffers():
    a = {"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([2.0, 0.0]), "n": torch.tensor(7)}
    torch.testing.assert_close(dv.cosine_similarity([a, b]), torch.ones(2, 2, dtype=torch.float64))


def test_disagreement_of_identical_and_always_disagreeing_members():
    same = _logits_for([[0, 1, 2], [0, 1, 2]])
    assert dv.disagreement(same).abs().max() == 0
    differ = _logits_for([[0, 1, 2], [1, 2, 0]])
    torch.testing.assert_close(dv.disagreement(differ), 1 - torch.eye(2, dtype=torch.float64))


def test_normalized_disagreement_divides_by_the_reference_error():
    y = torch.tensor([0, 1, 2, 0])
    logits = _logits_for([[0, 1, 2, 1], [0, 2, 2, 0]])  # member 0: error 1/4, member 1: 1/4
    # disagree on points 1 and 3: 2/4
    nd = dv.normalized_disagreement(logits, y)
    assert nd[0, 1].item() == pytest.approx(0.5 / 0.25)
    assert nd[1, 0].item() == pytest.approx(0.5 / 0.25)
    assert nd[0, 0].item() == 0


def test_kl_and_jensen_shannon():
    same = torch.randn(1, 20, 4).repeat(3, 1, 1)
    assert dv.pairwise_kl(same).abs().max() < 1e-12
    assert dv.jensen_shannon(same) == pytest.approx(0, abs=1e-12)
    differ = _logits_for([[0] * 5, [1] * 5], C=2, confidence=50.0)  # near one-hot, opposite
    assert dv.jensen_shannon(differ) == pytest.approx(math.log(2), rel=1e-6)
    kl = dv.pairwise_kl(torch.randn(3, 10, 4))
    assert (kl >= 0).all() and kl.diagonal().abs().max() < 1e-12
    assert dv.mutual_information(differ) == pytest.approx(math.log(2), rel=1e-6)


def test_size_curve_ends_at_the_whole_ensemble():
    torch.manual_seed(0)
    logits = torch.randn(5, 50, 3)
    y = torch.randint(0, 3, (50,))
    curve = dv.size_curve(logits, y, orders=4)
    assert curve["size"] == [1, 2, 3, 4, 5]
    assert curve["nll"][-1] == pytest.approx(curve["nll_random"][-1])
    assert curve["accuracy"][-1] == pytest.approx(curve["accuracy_random"][-1])
    s = dv.summary(logits, y, weights=torch.randn(5, 7))
    assert set(s) >= {"disagreement", "normalized_disagreement", "cosine_similarity", "nll"}


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: dv.disagreement(torch.randn(1, 5, 3)), "at least 2 members"),
        (lambda: dv.disagreement(torch.randn(5, 3)), r"\[M, N, C\]"),
        (lambda: dv.cosine_similarity(torch.randn(1, 4)), "at least 2"),
        (lambda: dv.cosine_similarity([{"w": torch.ones(2)}, {"w": torch.ones(3)}]), "differs"),
        (lambda: dv.normalized_disagreement(torch.randn(2, 5, 3), torch.zeros(4)), "labels"),
        (lambda: dv.jensen_shannon(torch.full((2, 3, 2), float("nan"))), "finite"),
    ],
)
def test_bad_inputs_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()
