"""Models: the toy MLP and SmallCNN (shapes, initialisation, options, torch.func use)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from peg import models
from peg.models import MLP, SmallCNN


def test_mlp_shapes() -> None:
    net = MLP(2, 3)
    assert net(torch.randn(7, 2)).shape == (7, 3)
    assert [m.out_features for m in net.modules() if isinstance(m, nn.Linear)] == [20, 3]
    img = MLP(784, 10, hidden=(64, 32), activation="tanh", dropout=0.1)
    assert img(torch.rand(5, 1, 28, 28)).shape == (5, 10)
    assert sum(isinstance(m, nn.Dropout) for m in img.modules()) == 2
    assert MLP(4, 2, hidden=()).head.in_features == 4  # a linear model
    assert MLP(4, 2, hidden=8).head.in_features == 8
    with pytest.raises(ValueError, match="x"):
        net(torch.randn(7, 3))


@pytest.mark.parametrize(
    ("bad", "kwargs"),
    [
        ("in_features", {"in_features": 0}),
        ("num_classes", {"num_classes": 2.5}),
        ("hidden", {"hidden": (20, 0)}),
        ("hidden", {"hidden": "20"}),
        ("activation", {"activation": "swish"}),
        ("dropout", {"dropout": 1.0}),
    ],
)
def test_mlp_bad_arguments(bad: str, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=bad):
        MLP(**{"in_features": 2, "num_classes": 2, **kwargs})


@pytest.mark.parametrize(("channels", "size"), [(1, 28), (1, 8), (3, 32), (1, 13), (2, 1)])
def test_small_cnn_shapes(channels: int, size: int) -> None:
    net = SmallCNN(in_channels=channels, num_classes=7, width=8)
    x = torch.rand(4, channels, size, size)
    assert net(x).shape == (4, 7)
    net.eval()
    assert net(x).shape == (4, 7)
    with pytest.raises(ValueError, match="x"):
        net(torch.rand(4, channels + 1, size, size))


def test_small_cnn_default_and_options() -> None:
    net = SmallCNN()
    assert net(torch.rand(3, 1, 28, 28)).shape == (3, 10)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in net.modules()) == 2
    plain = SmallCNN(batch_norm=False, dropout=0.3, stem_stride=1)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    assert all(m.bias is not None for m in plain.modules() if isinstance(m, nn.Conv2d))
    assert any(isinstance(m, nn.Dropout) for m in plain.modules())
    out = plain(torch.rand(3, 1, 28, 28))
    out.sum().backward()
    assert all(p.grad is not None for p in plain.parameters())
    for bad in ({"width": 0}, {"dropout": -0.1}, {"stem_stride": 3}, {"batch_norm": "yes"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SmallCNN(**bad)


@pytest.mark.parametrize("name", ["mlp", "small-cnn"])
def test_deterministic_init(name: str) -> None:
    kwargs = {"in_features": 2, "num_classes": 3} if name == "mlp" else {}
    torch.manual_seed(5)
    a = models.build(name, **kwargs).state_dict()
    torch.manual_seed(5)
    b = models.build(name, **kwargs).state_dict()
    torch.manual_seed(6)
    c = models.build(name, **kwargs).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_build() -> None:
    assert isinstance(models.build("small_cnn", width=4), SmallCNN)
    assert isinstance(models.build("MLP", in_features=2, num_classes=2), MLP)
    with pytest.raises(ValueError, match="small-cnn"):
        models.build("resnet-1000")


def test_small_cnn_members_vectorize() -> None:
    """Stacked members through torch.func, as ensembles run them, match a plain loop."""
    members = []
    for seed in range(3):
        torch.manual_seed(seed)
        net = SmallCNN(width=4)
        net.train()
        with torch.no_grad():
            net(torch.rand(16, 1, 28, 28))  # non-trivial BatchNorm statistics
        members.append(net.eval())
    params, buffers = stack_module_state(members)
    skeleton = copy.deepcopy(members[0]).to("meta")
    x = torch.rand(5, 1, 28, 28)

    def one(p, b):
        return functional_call(skeleton, (p, b), (x,))

    with torch.no_grad():
        out = vmap(one)(params, buffers)
        ref = torch.stack([m(x) for m in members])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
