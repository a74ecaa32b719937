"""peg.analysis: trajectories, t-SNE, diversity–accuracy plane, radial cut (the study that uses
them, `peg diversity`, is tested in tests/apps/test_diversity_study.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import peg.analysis.trajectories as trajectories_module
from peg import plots
from peg.analysis import (
    default_perplexity,
    diversity_accuracy,
    flip_curve,
    plane_basis,
    radial_cut,
    reference_curves,
    train_trajectories,
    tsne_predictions,
    uncorrelated_curve,
)
from peg.train import Recipe

from conftest import mlp, moons


def _net() -> nn.Module:
    """A factory that draws from the global RNG (conftest's `mlp` seeds itself)."""
    return nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))


def _no_training(*args, **kwargs):
    raise AssertionError("train() was called: the cached trajectory should have been reused")


# ---------------------------------------------------------------- trajectories
def test_trajectories_keep_every_epoch_and_are_reused_from_the_cache(tmp_path, monkeypatch):
    data = moons(120, 0)
    recipe = Recipe(epochs=3, lr=0.05, batch_size=32, schedule="constant")
    first = train_trajectories(_net, data, recipe, [0, 1], cache=tmp_path)
    assert [t.epochs for t in first] == [[0, 1, 2, 3]] * 2
    assert not any(t.from_cache for t in first)
    # different seeds: different initialisations (the factory is called under each seed)
    assert not torch.equal(first[0].states[0]["0.weight"], first[1].states[0]["0.weight"])
    assert len(list(tmp_path.glob("*.partial.safetensors"))) == 0

    monkeypatch.setattr(trajectories_module, "train", _no_training)
    again = train_trajectories(_net, data, recipe, [0, 1], cache=tmp_path)
    assert all(t.from_cache for t in again)
    for a, b in zip(first, again, strict=True):
        assert a.epochs == b.epochs and a.history == b.history
        for sa, sb in zip(a.states, b.states, strict=True):
            assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # another recipe is another trajectory: not taken from the cache
    with pytest.raises(AssertionError, match="train\\(\\) was called"):
        train_trajectories(_net, data, recipe.replace(lr=0.1), [0], cache=tmp_path)


def test_trajectories_reject_bad_seeds():
    data = moons(40, 0)
    with pytest.raises(ValueError, match="seeds"):
        train_trajectories(lambda: mlp(0), data, Recipe(epochs=1), [])
    with pytest.raises(ValueError, match="seeds"):
        train_trajectories(lambda: mlp(0), data, Recipe(epochs=1), [3, 3])


# ---------------------------------------------------------------- t-SNE
@pytest.mark.parametrize("K", [2, 5, 9])
def test_tsne_gives_one_2d_point_per_checkpoint(K):
    logits = torch.randn(K, 12, 3)
    points = tsne_predictions(logits, max_iter=250)
    assert points.shape == (K, 2)
    assert np.isfinite(points).all()
    assert default_perplexity(K) < K  # small perplexity for few points


def test_tsne_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="member_logits.*at least 2"):
        tsne_predictions(torch.randn(1, 5, 3))
    with pytest.raises(ValueError, match="member_logits.*\\[K, N, C\\]"):
        tsne_predictions(torch.randn(4, 5))
    with pytest.raises(ValueError, match="perplexity"):
        tsne_predictions(torch.randn(4, 5, 3), perplexity=4)


# ---------------------------------------------------------------- diversity–accuracy plane
def test_diversity_accuracy_on_a_fixture():
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    ref = nn.functional.one_hot(y, 3).double() * 5  # reference: always right
    ref[0] = torch.tensor([0.0, 5.0, 0.0])  # ... except point 0: a* = 0.9
    sample = ref.clone()
    sample[1] = torch.tensor([0.0, 0.0, 5.0])  # one new mistake: a = 0.8, differs on 1 point
    out = diversity_accuracy(ref, torch.stack([ref, sample]), y)
    assert out["reference_accuracy"] == pytest.approx(0.9)
    assert out["accuracy"] == pytest.approx([0.9, 0.8])
    assert out["disagreement"] == pytest.approx([0.0, 0.1])
    assert out["diversity"] == pytest.approx([0.0, 0.1 / 0.2])  # normalised by the sample's error


def test_diversity_accuracy_bad_input_names_the_argument():
    y = torch.zeros(6, dtype=torch.long)
    with pytest.raises(ValueError, match="sample_logits"):
        diversity_accuracy(torch.randn(6, 3), torch.randn(2, 5, 3), y)
    with pytest.raises(ValueError, match="sample_logits"):
        diversity_accuracy(torch.randn(6, 3), torch.randn(6, 3), y)
    with pytest.raises(ValueError, match="reference_logits"):
        diversity_accuracy(torch.randn(1, 6, 3), torch.randn(2, 6, 3), y)


def test_reference_curves_match_the_appendix():
    a_star, C = 0.8, 10
    lower = flip_curve(a_star, C, 1.0)
    assert lower["accuracy"][0] == pytest.approx(a_star) and lower["disagreement"][0] == 0
    # lower limit, Eq. (2): d = (C − 1)(a* − a) / (C a* − 1)
    a = np.array(lower["accuracy"])
    assert lower["disagreement"] == pytest.approx((C - 1) * (a_star - a) / (C * a_star - 1))
    upper = uncorrelated_curve(a_star, C, accuracy=[a_star])
    expected = 2 * a_star * (1 - a_star) + (1 - a_star) ** 2 * (C - 2) / (C - 1)
    assert upper["disagreement"] == pytest.approx([expected])
    curves = reference_curves(a_star, C)
    assert len(curves) == 3 and all("diversity" in c for c in curves.values())
    with pytest.raises(ValueError, match="a_star"):
        flip_curve(0.05, C)


# ---------------------------------------------------------------- radial cut
def _fit(seed: int, X: torch.Tensor, y: torch.Tensor) -> nn.Module:
    model = mlp(seed, classes=2)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    return model.eval()


def test_radial_cut_reproduces_the_optima_at_their_coordinates():
    X, y = moons(200, 0, noise=0.3)
    m1, m2 = _fit(0, X, y), _fit(1, X, y)
    with torch.no_grad():
        own = [float((m(X).argmax(-1) == y).double().mean()) for m in (m1, m2)]
    cut = radial_cut(m1, [m1.state_dict(), m2.state_dict()], X, y, resolution=5)
    acc = np.array(cut["accuracy"])
    assert acc.shape == (len(cut["y"]), len(cut["x"]))
    for k, (row, col) in enumerate(cut["optima_index"]):
        assert (cut["x"][col], cut["y"][row]) == tuple(cut["optima"][k])  # exact grid point
        assert acc[row, col] == own[k]
        assert np.array(cut[f"agreement_{k + 1}"])[row, col] == 1.0
    assert cut["optima_accuracy"] == own
    assert 0.0 in cut["x"] and 0.0 in cut["y"]  # the origin is on the grid too


def test_plane_basis_reproduces_both_optima():
    a, b = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    basis, coords = plane_basis(a, b)
    assert torch.allclose(coords @ basis, torch.stack([a, b]))
    assert torch.allclose(basis @ basis.T, torch.eye(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="theta2"):
        plane_basis(a, 2 * a)
    with pytest.raises(ValueError, match="theta2"):
        plane_basis(a, torch.randn(49))


def test_radial_cut_bad_input_names_the_argument():
    m = mlp(0)
    X, y = moons(20, 0)
    with pytest.raises(ValueError, match="optima"):
        radial_cut(m, [m.state_dict()], X, y)
    with pytest.raises(ValueError, match="optima"):
        radial_cut(m, [m.state_dict(), mlp(0, hidden=5).state_dict()], X, y)
    with pytest.raises(ValueError, match="y"):
        radial_cut(m, [m.state_dict(), mlp(1).state_dict()], X, y[:5])


# ---------------------------------------------------------------- plots: bad input
def test_new_plots_reject_bad_input(tmp_path):
    with pytest.raises(ValueError, match="panels"):
        plots.similarity_matrices({"a": np.zeros((2, 3))}, tmp_path / "a.png", "x")
    with pytest.raises(ValueError, match="ticks"):
        plots.similarity_matrices({"a": np.eye(2)}, tmp_path / "a.png", "x", ticks={"a": [1]})
    with pytest.raises(ValueError, match="kind"):
        plots.prediction_map(np.zeros((3, 2)), np.zeros(3, int), ["a"], tmp_path / "b.png")
    with pytest.raises(ValueError, match="samples"):
        plots.diversity_accuracy_plane(
            {"m": {"accuracy": [0.5], "diversity": [0.1, 0.2]}}, tmp_path / "c.png", 0.9
        )
    with pytest.raises(ValueError, match="cut"):
        plots.radial_landscape({"x": [0, 1]}, tmp_path / "d.png")
