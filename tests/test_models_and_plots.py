"""Models' shapes and determinism; figures are written and non-empty."""

from __future__ import annotations

import pytest
import torch

from peg import metrics, models, plots


@pytest.mark.parametrize(("shape", "channels"), [((28, 28), 1), ((8, 8), 1), ((32, 32), 3)])
def test_small_cnn_shapes(shape, channels):
    net = models.SmallCNN(in_channels=channels, num_classes=7, width=8).eval()
    assert net(torch.rand(5, channels, *shape)).shape == (5, 7)
    plain = models.SmallCNN(in_channels=channels, num_classes=7, width=8, batch_norm=False)
    assert plain(torch.rand(2, channels, *shape)).shape == (2, 7)


def test_small_cnn_is_deterministic_under_a_seed():
    torch.manual_seed(4)
    a = models.SmallCNN(width=8)
    torch.manual_seed(4)
    b = models.SmallCNN(width=8)
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(v, w), k


def test_mlp_flattens_and_counts():
    net = models.MLP(784, 10, hidden=(20,))
    assert net(torch.rand(3, 1, 28, 28)).shape == (3, 10)
    assert sum(p.numel() for p in models.MLP(2, 2).parameters()) == 2 * 20 + 20 + 20 * 2 + 2
    assert isinstance(models.build("mlp", in_features=2, num_classes=3), models.MLP)
    with pytest.raises(ValueError, match="unknown model"):
        models.build("resnet-9000")
    with pytest.raises(ValueError, match="activation"):
        models.MLP(2, 2, activation="sigmoidish")


def test_reliability_diagram_is_written(tmp_path):
    logits = torch.randn(2, 300, 4) * 3
    y = torch.randint(0, 4, (300,))
    curves = {"A": metrics.reliability(logits, y, bins=10), "B": metrics.reliability(logits[:1], y)}
    path = plots.reliability_diagram(curves, tmp_path / "sub" / "rel.png", title="t")
    assert path.stat().st_size > 5000 and path.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in path.parent.iterdir()] == ["rel.png"]  # no temporary left


def test_decision_boundaries_are_written(tmp_path):
    X = torch.randn(100, 2)
    y = (X[:, 0] > 0).long()

    def predict(points):
        return torch.stack([torch.sigmoid(-3 * points[:, 0]), torch.sigmoid(3 * points[:, 0])], 1)

    path = plots.decision_boundaries(
        {"a": predict, "b": predict}, X, y, tmp_path / "db.png", resolution=40
    )
    assert path.stat().st_size > 5000
    with pytest.raises(ValueError, match="X: expected 2-D points"):
        plots.decision_boundaries({"a": predict}, torch.randn(5, 3), y[:5], tmp_path / "x.png")
