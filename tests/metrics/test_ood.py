"""OOD scores and detection metrics: hand-worked values, sklearn agreement and input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from peg import metrics
from peg.metrics import (
    OOD_SCORES,
    aupr,
    auroc,
    energy,
    entropy,
    fpr_at_tpr,
    max_logit,
    max_softmax,
    mutual_information,
    ood_metrics,
    variation_ratio,
)


def votes_to_logits(votes: list[list[int]], c: int) -> torch.Tensor:
    """Member logits `[M, N, C]` where member m votes for class votes[m][n] (margin 5)."""
    v = torch.tensor(votes)
    return 5.0 * torch.nn.functional.one_hot(v, c).double()


# --- metrics: hand-worked values ------------------------------------------------------------


def test_perfect_separation() -> None:
    s_in, s_out = [0.0, 0.1, 0.2], [0.9, 1.0]
    assert auroc(s_in, s_out) == 1.0
    assert aupr(s_in, s_out) == 1.0
    assert aupr(s_in, s_out, positive="in") == 1.0
    assert fpr_at_tpr(s_in, s_out) == 0.0


def test_reversed_and_identical_scores() -> None:
    assert auroc([0.9, 1.0], [0.0, 0.1, 0.2]) == 0.0
    assert fpr_at_tpr([0.9, 1.0], [0.0, 0.1, 0.2]) == 1.0  # every in-sample scores above OOD
    assert auroc(np.full(5, 0.3), np.full(7, 0.3)) == 0.5
    # All tied: every sample is flagged at the only threshold, so FPR = 1; AP = share of OOD.
    assert fpr_at_tpr(np.full(5, 0.3), np.full(7, 0.3)) == 1.0
    assert aupr(np.full(5, 0.3), np.full(7, 0.3)) == pytest.approx(7 / 12)


def test_auroc_hand_computed_with_ties() -> None:
    # Pairs (out, in) won by out: 1.5 > {0, 1}, 3 > {0, 1, 2} -> 5 of 6.
    assert auroc([0, 1, 2], [1.5, 3]) == pytest.approx(5 / 6)
    # Pairs: 2 > 1 (1), 2 = 2 (1/2), 3 > {1, 2} (2) -> 3.5 / 4.
    assert auroc([1, 2], [2, 3]) == pytest.approx(0.875)


def test_fpr_at_tpr_hand_computed() -> None:
    s_in, s_out = [0.0, 1.0, 2.0, 3.0], [2.5, 4.0, 5.0, 6.0]
    # >= 95% of 4 OOD samples means all 4: threshold 2.5 flags in-sample 3.0 -> FPR 1/4.
    assert fpr_at_tpr(s_in, s_out) == 0.25
    assert fpr_at_tpr(s_in, s_out, tpr=1.0) == 0.25
    # 3 of 4 OOD samples: threshold 4.0 flags no in-sample.
    assert fpr_at_tpr(s_in, s_out, tpr=0.75) == 0.0
    # Ties at the threshold count as flagged: threshold 3 flags in-samples 3 and 4.
    assert fpr_at_tpr([1, 2, 3, 4], [3, 5, 6, 7]) == 0.5


def test_fpr_at_tpr_positive_in_differs() -> None:
    s_in, s_out = [0.0, 1.0, 2.0, 3.0], [0.5, 4.0, 5.0, 6.0]
    # OOD positive: flag all OOD -> threshold 0.5 flags in-samples 1, 2, 3.
    assert fpr_at_tpr(s_in, s_out) == 0.75
    # In positive: accept all in-samples (score <= 3) -> accepts OOD sample 0.5.
    assert fpr_at_tpr(s_in, s_out, positive="in") == 0.25


def test_aupr_both_conventions_hand_computed() -> None:
    s_in, s_out = [0.0, 1.0, 2.0], [1.5, 3.0]
    # OOD positive, ranked by score: 3 (out), 2 (in), 1.5 (out), 1, 0.
    # AP = 1/2 * P@1 + 1/2 * P@3 = 1/2 * 1 + 1/2 * 2/3 = 5/6.
    assert aupr(s_in, s_out) == pytest.approx(5 / 6)
    assert aupr(s_in, s_out, positive="ood") == pytest.approx(5 / 6)
    # In positive, ranked by -score: 0 (in), 1 (in), 1.5 (out), 2 (in), 3 (out).
    # AP = 1/3 * (1 + 1 + 3/4) = 11/12.
    assert aupr(s_in, s_out, positive="in") == pytest.approx(11 / 12)


def test_metrics_agree_with_sklearn_and_brute_force_on_random_data() -> None:
    rng = np.random.default_rng(0)
    for n_in, n_out in [(200, 50), (37, 113), (20, 20)]:
        s_in = rng.normal(0.0, 1.0, n_in)
        s_out = rng.normal(1.0, 1.5, n_out)
        s_in[:5] = s_out[:5]  # some exact ties across the classes
        y = np.r_[np.zeros(n_in), np.ones(n_out)]
        s = np.r_[s_in, s_out]
        assert auroc(s_in, s_out) == pytest.approx(roc_auc_score(y, s), abs=1e-15)
        assert aupr(s_in, s_out) == pytest.approx(average_precision_score(y, s), abs=1e-15)
        assert aupr(s_in, s_out, "in") == pytest.approx(
            average_precision_score(1 - y, -s), abs=1e-15
        )
        # FPR95 directly: the threshold is the k-th largest OOD score, k = ceil(0.95 N_out).
        for level in (0.95, 0.8, 0.5, 1.0):
            k = math.ceil(round(level * n_out, 9))
            t = np.sort(s_out)[::-1][k - 1]
            assert fpr_at_tpr(s_in, s_out, level) == pytest.approx(np.mean(s_in >= t), abs=1e-15)
        # Torch tensors (any float dtype) and numpy give the same numbers.
        assert auroc(torch.from_numpy(s_in), torch.from_numpy(s_out)) == auroc(s_in, s_out)


# --- scores ---------------------------------------------------------------------------------


def test_entropy_uniform_and_one_hot() -> None:
    for c in (2, 5, 10):
        assert torch.allclose(
            entropy(torch.full((3, c), 1.0 / c)), torch.tensor(math.log(c)).double()
        )
        assert torch.allclose(entropy(torch.zeros(4, 3, c)), torch.tensor(math.log(c)).double())
    one_hot = torch.eye(4, dtype=torch.float64)  # zeros in probabilities: no NaN
    assert torch.equal(entropy(one_hot), torch.zeros(4, dtype=torch.float64))
    # Saturated logits: one-hot members give ~0, disagreeing one-hot members give log 2.
    z = torch.tensor([[[1000.0, -1000.0]], [[1000.0, -1000.0]]])
    assert entropy(z).item() == pytest.approx(0.0, abs=1e-300)
    z = torch.tensor([[[1000.0, -1000.0]], [[-1000.0, 1000.0]]])
    assert entropy(z).item() == pytest.approx(math.log(2), rel=1e-12)
    assert entropy(z).shape == (1,) and entropy(z).dtype == torch.float64


def test_entropy_matches_naive_formula_on_moderate_logits() -> None:
    z = torch.randn(5, 30, 4, dtype=torch.float64) * 2
    p = z.softmax(-1).mean(0)
    assert torch.allclose(entropy(z), -(p * p.log()).sum(-1), rtol=1e-12)


def test_mutual_information() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 100, 5, generator=g, dtype=torch.float64) * 3
    mi = mutual_information(z)
    assert mi.shape == (100,)
    assert (mi >= 0).all() and (mi <= math.log(6) + 1e-12).all()
    assert (mi <= entropy(z) + 1e-12).all()  # MI = total - expected entropy, expected >= 0
    same = z[:1].expand(4, -1, -1)
    assert torch.allclose(mutual_information(same), torch.zeros(100, dtype=torch.float64))
    # Two sure members that disagree: total entropy log 2, member entropies 0 -> MI = log 2.
    z = torch.tensor([[[1000.0, -1000.0]], [[-1000.0, 1000.0]]])
    assert mutual_information(z).item() == pytest.approx(math.log(2), rel=1e-12)
    # Moderate disagreement is positive, and the same as the naive formula.
    z = torch.tensor([[[2.0, 0.0]], [[0.0, 2.0]]], dtype=torch.float64)
    p = z.softmax(-1)
    h = lambda q: -(q * q.log()).sum(-1)  # noqa: E731
    assert mutual_information(z).item() == pytest.approx((h(p.mean(0)) - h(p).mean(0)).item())
    assert mutual_information(z).item() > 0


def test_variation_ratio_from_known_votes() -> None:
    # 4 members, 3 points: votes (0, 0, 1, 2) -> mode has 2 -> 0.5; unanimous -> 0;
    # all different -> 1 - 1/4.
    votes = [[0, 1, 0], [0, 1, 1], [1, 1, 2], [2, 1, 3]]
    vr = variation_ratio(votes_to_logits(votes, 4))
    assert torch.allclose(vr, torch.tensor([0.5, 0.0, 0.75], dtype=torch.float64))
    assert vr.dtype == torch.float64
    assert torch.equal(variation_ratio(torch.randn(1, 7, 3)), torch.zeros(7, dtype=torch.float64))


def test_max_softmax_and_max_logit_values_and_ordering() -> None:
    p = torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]], dtype=torch.float64)
    assert torch.allclose(max_softmax(p), torch.tensor([-0.9, -0.5, -0.8], dtype=torch.float64))
    # Members [1, 3] and [3, 1]: mean logit [2, 2] -> -2; members agreeing on [5, 0] -> -5.
    z = torch.tensor([[[1.0, 3.0], [5.0, 0.0]], [[3.0, 1.0], [5.0, 0.0]]])
    assert torch.allclose(max_logit(z), torch.tensor([-2.0, -5.0], dtype=torch.float64))
    # Higher = more likely OOD: the confident point scores lower under every score.
    for name, fn in OOD_SCORES.items():
        s = fn(z)
        assert s.shape == (2,), name
        assert s[1] <= s[0], name
    # Ensemble MSP uses the averaged probabilities.
    assert max_softmax(z)[0].item() == pytest.approx(-0.5)


def test_energy_is_the_members_mean_negative_logsumexp() -> None:
    """Liu et al. 2020 with T = 1: E = -log Σ_c exp z_c; for members, their energies averaged."""
    z = torch.tensor([[[1.0, 3.0], [5.0, 0.0]], [[3.0, 1.0], [9.0, 0.0]]])
    expected = -torch.tensor(
        [
            [np.log(np.e + np.e**3), np.log(np.e**5 + 1)],
            [np.log(np.e**3 + np.e), np.log(np.e**9 + 1)],
        ]
    ).mean(0)
    assert torch.allclose(energy(z), expected.double())
    assert energy(z).dtype == torch.float64
    big = torch.tensor([[[1000.0, 999.0]]])  # no overflow
    assert torch.isfinite(energy(big)).all()


def test_scores_that_need_members_reject_probabilities() -> None:
    p = torch.full((3, 4), 0.25)
    for fn in (energy, max_logit, mutual_information, variation_ratio):
        with pytest.raises(ValueError, match=r"^pred: .*member logits \[M, N, C\]"):
            fn(p)
    with pytest.raises(ValueError, match="pred"):
        entropy(torch.randn(3, 4))  # raw logits as [N, C] are not probabilities


# --- ood_metrics ----------------------------------------------------------------------------


def test_ood_metrics_keys_positive_and_values() -> None:
    g = torch.Generator().manual_seed(1)
    z_in = torch.randn(5, 40, 3, generator=g) * 0.1 + torch.tensor([10.0, 0.0, 0.0])  # confident
    z_out = torch.randn(5, 30, 3, generator=g) * 3  # members disagree
    for name in OOD_SCORES:
        out = ood_metrics(z_in, z_out, score=name)
        assert set(out) == {"auroc", "aupr_out", "aupr_in", "fpr95", "positive", "score"}
        assert out["positive"] == "ood" and out["score"] == name
        s_in, s_out = OOD_SCORES[name](z_in), OOD_SCORES[name](z_out)
        assert out["auroc"] == auroc(s_in, s_out)
        assert out["aupr_out"] == aupr(s_in, s_out, "ood")
        assert out["aupr_in"] == aupr(s_in, s_out, "in")
        assert out["fpr95"] == fpr_at_tpr(s_in, s_out, 0.95)
    out = ood_metrics(z_in, z_out)  # default: entropy, well separated here
    assert out["score"] == "entropy"
    assert out["auroc"] > 0.95 and out["fpr95"] < 0.1
    # Probabilities work for the softmax-based scores; numpy works too.
    p_in, p_out = z_in.double().softmax(-1)[0].numpy(), z_out.double().softmax(-1)[0].numpy()
    assert ood_metrics(p_in, p_out, "max_softmax")["auroc"] > 0.95


def test_ood_metrics_perfect_separation() -> None:
    p_in = torch.tensor([[0.99, 0.01], [0.01, 0.99]], dtype=torch.float64)
    p_out = torch.full((3, 2), 0.5, dtype=torch.float64)
    out = ood_metrics(p_in, p_out, "max_softmax")
    assert (out["auroc"], out["aupr_out"], out["aupr_in"], out["fpr95"]) == (1.0, 1.0, 1.0, 0.0)


# --- bad inputs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.zeros((3, 2)), "1-D"),
        (np.zeros(0), "empty"),
        (np.array([0.1, np.nan]), "finite"),
        (np.array([0.1, np.inf]), "finite"),
        (np.array([1 + 1j]), "real"),
    ],
)
def test_metrics_reject_bad_scores(bad: np.ndarray, message: str) -> None:
    good = np.array([0.1, 0.2])
    for fn in (auroc, aupr, fpr_at_tpr):
        with pytest.raises(ValueError, match=f"^scores_in: .*{message}"):
            fn(bad, good)
        with pytest.raises(ValueError, match=f"^scores_out: .*{message}"):
            fn(good, bad)


def test_bad_options() -> None:
    s = [0.1, 0.2]
    with pytest.raises(ValueError, match="^positive: "):
        aupr(s, s, positive="out")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^positive: "):
        fpr_at_tpr(s, s, positive="OOD")  # type: ignore[arg-type]
    for tpr in (0.0, 1.5, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match="^tpr: "):
            fpr_at_tpr(s, s, tpr=tpr)
    p = torch.full((3, 2), 0.5)
    with pytest.raises(ValueError, match="^score: .*'odin'"):
        ood_metrics(p, p, score="odin")
    with pytest.raises(ValueError, match="^pred_out: expected C = 2"):
        ood_metrics(p, torch.full((3, 4), 0.25))
    with pytest.raises(ValueError, match="^pred_in: mutual_information needs member logits"):
        ood_metrics(p, torch.zeros(2, 3, 2), score="mutual_information")
    with pytest.raises(ValueError, match="^pred_out: variation_ratio needs member logits"):
        ood_metrics(torch.zeros(2, 3, 2), p, score="variation_ratio")
    with pytest.raises(ValueError, match="^pred_in: "):
        ood_metrics(torch.zeros(3), p)


def test_exported_from_peg_metrics() -> None:
    for name in ("auroc", "aupr", "fpr_at_tpr", "ood_metrics", "entropy", "OOD_SCORES"):
        assert name in metrics.__all__ and hasattr(metrics, name)
