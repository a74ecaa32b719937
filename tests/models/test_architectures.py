"""Architectures: shapes, parameter counts against the literature, errors, BN/dropout modes."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from peg import models
from peg.models import (
    VGG,
    CifarResNet,
    LandscapeCNN,
    LeNet,
    MediumCNN,
    PreResNet,
    ResNet,
    WideResNet,
    _layers,
)

# Every named image model (all but "mlp", which takes in_features).
IMAGE_MODELS = sorted(name for name in models.REGISTRY if name != "mlp")
SMALL_MODELS = ["small-cnn", "landscape-small-cnn", "medium-cnn", "lenet"]
# Generic names need a depth; the rest are presets.
GENERIC = {"vgg": 16, "preresnet": 20, "wide-resnet": 10, "cifar-resnet": 20, "resnet": 18}


def _build(name: str, **kwargs) -> nn.Module:
    if name in GENERIC:
        kwargs.setdefault("depth", GENERIC[name])
    if name == "wide-resnet":
        kwargs.setdefault("widen_factor", 1)
    return models.build(name, **kwargs)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_forward_shape_cifar(name: str) -> None:
    net = _build(name, in_channels=3, num_classes=7).eval()
    with torch.no_grad():
        out = net(torch.rand(2, 3, 32, 32))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="x"):
        net(torch.rand(2, 1, 32, 32))


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_forward_shape_mnist(name: str) -> None:
    net = models.build(name, in_channels=1, num_classes=10).eval()
    with torch.no_grad():
        assert net(torch.rand(2, 1, 28, 28)).shape == (2, 10)


def test_mlp_forward_shapes() -> None:
    with torch.no_grad():
        for x in (torch.rand(2, 1, 28, 28), torch.rand(2, 3, 32, 32)):
            net = models.build("mlp", in_features=x[0].numel(), num_classes=10)
            assert net(x).shape == (2, 10)


@pytest.mark.parametrize(
    "net",
    [
        VGG(16, batch_norm=True, in_channels=1, width=0.125),
        CifarResNet(20, in_channels=1, width=0.5),
        PreResNet(164, in_channels=1, width=0.25),
        WideResNet(10, widen_factor=1, in_channels=1),
        ResNet(50, in_channels=1, width=0.125),
    ],
    ids=["vgg16-bn", "resnet20", "preresnet164", "wrn10-1", "resnet50"],
)
def test_cifar_models_take_28x28(net: nn.Module) -> None:
    """Adaptive pooling (and ceil-mode max-pools in VGG) let 28×28 images through."""
    with torch.no_grad():
        assert net.eval()(torch.rand(2, 1, 28, 28)).shape == (2, 10)


# Literature parameter counts for C = 10 (counted on the meta device: no memory, no init cost).
LITERATURE = [
    # He et al. 2016, "Deep residual learning", Table 6: ResNet-20 0.27M.
    ("resnet20", 0.27e6),
    # Pre-activation ResNet-20: the same convs as ResNet-20 (0.27M, He et al. Table 6).
    ("preresnet20", 0.27e6),
    # He et al. 2016b, "Identity mappings in deep residual networks": ResNet-164 1.7M.
    ("preresnet164", 1.7e6),
    # Zagoruyko & Komodakis 2016: WRN-28-10 36.5M (Packed-Ensembles Table 1: 36.49M).
    ("wrn28-10", 36.5e6),
    # Packed-Ensembles (Laurent et al. 2023) Table 1, CIFAR-10 single models: ResNet-18
    # 11.17M, ResNet-50 23.52M (CIFAR stems).
    ("resnet18", 11.17e6),
    ("resnet50", 23.52e6),
    # SWA/SWAG reference VGG16 (swag/models/vgg.py), counted from its definition:
    # 14.71M in the 13 convs + 0.53M in the 512-512-512-C classifier = 15.25M; BN adds 8.4k.
    ("vgg16", 15.25e6),
    ("vgg16-bn", 15.25e6),
]


@pytest.mark.parametrize(("name", "expected"), LITERATURE)
def test_parameter_counts_match_literature(name: str, expected: float) -> None:
    with torch.device("meta"):
        n = _count(models.build(name, num_classes=10))
    assert abs(n - expected) / expected < 0.02, f"{name}: {n:,} parameters vs {expected:,.0f}"


def test_parameter_counts_of_the_small_models() -> None:
    """Exact counts (no literature figure to match; these pin the documented layouts)."""
    with torch.device("meta"):
        assert _count(LandscapeCNN()) == 15_722
        assert _count(MediumCNN()) == 1_029_258
        # LeCun et al. 1998 quote "about 60,000" for their (sparser) LeNet-5.
        assert _count(LeNet()) == 61_706
        assert _count(PreResNet(56)) == 590_426  # bottleneck, as the SWA reference builds it


def test_width_multipliers_scale_the_models() -> None:
    with torch.device("meta"):
        for cls, kwargs in [
            (VGG, {}),
            (CifarResNet, {}),
            (ResNet, {}),
            (PreResNet, {}),
            (LandscapeCNN, {}),
            (LeNet, {}),
        ]:
            base, half = _count(cls(**kwargs)), _count(cls(**kwargs, width=0.5))
            assert 0.2 * base < half < 0.35 * base, cls.__name__  # ≈ width² for conv nets
        assert _count(WideResNet(16, widen_factor=4)) < _count(WideResNet(16, widen_factor=8))


def test_build_knows_all_names_and_rejects_unknown_ones() -> None:
    for name in [
        "vgg16",
        "vgg16-bn",
        "preresnet20",
        "preresnet56",
        "preresnet164",
        "wrn28-10",
        "resnet20",
        "resnet18",
        "resnet50",
        "small-cnn",
        "medium-cnn",
        "lenet",
        "mlp",
    ]:
        assert name in models.REGISTRY
    assert isinstance(models.build("VGG16_BN", width=0.125), VGG)
    with pytest.raises(ValueError, match="name") as err:
        models.build("resnet-1000")
    assert "wrn28-10" in str(err.value) and "vgg16-bn" in str(err.value)
    with pytest.raises(ValueError, match="depth"):  # a preset's fixed argument
        models.build("resnet20", depth=32)


@pytest.mark.parametrize(
    ("cls", "kwargs", "argument"),
    [
        (PreResNet, {"depth": 57}, "depth"),  # bottleneck range: needs 9n+2
        (PreResNet, {"depth": 22}, "depth"),  # basic range: needs 6n+2
        (PreResNet, {"depth": 26, "block": "bottleneck"}, "depth"),  # 6n+2, not 9n+2
        (PreResNet, {"depth": 164, "block": "wide"}, "block"),
        (PreResNet, {"depth": 0}, "depth"),
        (CifarResNet, {"depth": 21}, "depth"),
        (CifarResNet, {"shortcut": "C"}, "shortcut"),
        (ResNet, {"depth": 20}, "depth"),
        (WideResNet, {"depth": 27}, "depth"),
        (WideResNet, {"widen_factor": 0}, "widen_factor"),
        (WideResNet, {"dropout": 1.0}, "dropout"),
        (VGG, {"depth": 15}, "depth"),
        (VGG, {"width": 0}, "width"),
        (VGG, {"batch_norm": "yes"}, "batch_norm"),
        (ResNet, {"width": -1.0}, "width"),
        (CifarResNet, {"width": "2"}, "width"),
        (PreResNet, {"width": float("nan")}, "width"),
        (LeNet, {"in_channels": 0}, "in_channels"),
        (LandscapeCNN, {"channels": ()}, "channels"),
        (MediumCNN, {"num_classes": 1.5}, "num_classes"),
    ],
)
def test_bad_arguments_name_the_argument(cls: type, kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument), torch.device("meta"):
        cls(**kwargs)


def test_preresnet_blocks_follow_the_reference() -> None:
    """Bottleneck blocks from depth 44 on (SWA reference), basic below; `block` overrides."""
    with torch.device("meta"):
        assert PreResNet(164).head.in_features == 256  # 64 · expansion 4
        assert PreResNet(20).head.in_features == 64
        assert PreResNet(56, block="basic").head.in_features == 64
        assert _count(PreResNet(56, block="basic")) > _count(PreResNet(56))


# Small configurations of every normalised family (fast in train mode on 2 images).
SMALL_BN = {
    "vgg16-bn": lambda: VGG(16, batch_norm=True, width=0.125),
    "resnet20": lambda: CifarResNet(20, width=0.5),
    "resnet20-B": lambda: CifarResNet(20, width=0.5, shortcut="B"),
    "resnet18": lambda: ResNet(18, width=0.125),
    "resnet50": lambda: ResNet(50, width=0.125),
    "preresnet164": lambda: PreResNet(164, width=0.25),
    "wrn10-2-dropout": lambda: WideResNet(10, widen_factor=2, dropout=0.3),
    "medium-cnn-bn": lambda: MediumCNN(batch_norm=True, width=0.25),
}


@pytest.mark.parametrize("name", sorted(SMALL_BN))
def test_train_and_eval_differ_only_through_batchnorm_and_dropout(name: str) -> None:
    net = SMALL_BN[name]()
    assert any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = net.eval()(x)
        net.train()
        stochastic = [m for m in net.modules() if isinstance(m, (nn.BatchNorm2d, nn.Dropout))]
        for m in stochastic:
            m.eval()
        torch.testing.assert_close(net(x), ref)  # every other module ignores the mode
        for m in stochastic:
            m.train()
        assert not torch.allclose(net(x), ref)


def test_plain_vgg_has_no_batchnorm_and_dropout_drives_its_modes() -> None:
    net = VGG(16, width=0.125)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    assert sum(isinstance(m, nn.Dropout) for m in net.modules()) == 2
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(net.train()(x), net.eval()(x))
        plain = VGG(16, width=0.125, dropout=0.0)
        torch.testing.assert_close(plain.train()(x), plain.eval()(x))


def test_initialisation_follows_the_references() -> None:
    torch.manual_seed(0)
    vgg = VGG(16)
    conv = vgg.features[-3]  # last conv: 512 → 512, 3×3
    assert isinstance(conv, nn.Conv2d) and conv.out_channels == 512
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (9 * 512)), rel=0.02)
    assert all(m.bias.abs().max() == 0 for m in vgg.features if isinstance(m, nn.Conv2d))
    wrn = WideResNet(10, widen_factor=4)
    conv = wrn.stages[2][0].body[0]  # 128 → 256, fan-in 1152
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (9 * 128)), rel=0.02)
    pre = PreResNet(20)
    assert all(
        torch.all(m.weight == 1) and torch.all(m.bias == 0)
        for m in pre.modules()
        if isinstance(m, nn.BatchNorm2d)
    )
    landscape = LandscapeCNN()
    layers = [m for m in landscape.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert all(torch.all(m.bias == 0) for m in layers)  # Keras default


@pytest.mark.parametrize(
    "factory",
    [
        lambda: CifarResNet(8, width=0.5),
        lambda: LeNet(in_channels=3),
        lambda: PreResNet(11, block="bottleneck"),
    ],
    ids=["resnet8", "lenet", "preresnet11"],
)
def test_gradients_reach_every_parameter(factory) -> None:
    net = factory()
    net(torch.randn(2, 3, 32, 32)).logsumexp(1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.parametrize(
    "factory",
    [
        lambda: CifarResNet(8, width=0.5),  # option-A shortcuts (pad + strided slice)
        lambda: PreResNet(11, width=0.5, block="bottleneck"),
        lambda: WideResNet(10, widen_factor=1),
    ],
    ids=["resnet8", "preresnet11", "wrn10-1"],
)
def test_members_vectorize(factory) -> None:
    """Stacked members through torch.func, as ensembles run them, match a plain loop."""
    members = []
    for seed in range(2):
        torch.manual_seed(seed)
        members.append(factory().eval())
    params, buffers = stack_module_state(members)
    skeleton = copy.deepcopy(members[0]).to("meta")
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        out = vmap(lambda p, b: functional_call(skeleton, (p, b), (x,)))(params, buffers)
        ref = torch.stack([m(x) for m in members])
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", [*IMAGE_MODELS, "mlp"])
def test_layers_come_from_the_factories(name: str, monkeypatch) -> None:
    """Every conv and linear layer is made by `_layers.conv`/`_layers.linear`, the seam the
    packed variants will swap."""
    made = {"conv": 0, "linear": 0}
    conv, linear = _layers.conv, _layers.linear

    def counting_conv(*args, **kwargs):
        made["conv"] += 1
        return conv(*args, **kwargs)

    def counting_linear(*args, **kwargs):
        made["linear"] += 1
        return linear(*args, **kwargs)

    monkeypatch.setattr(_layers, "conv", counting_conv)
    monkeypatch.setattr(_layers, "linear", counting_linear)
    with torch.device("meta"):
        net = models.build("mlp", in_features=4, num_classes=2) if name == "mlp" else _build(name)
    assert made["conv"] == sum(isinstance(m, nn.Conv2d) for m in net.modules())
    assert made["linear"] == sum(isinstance(m, nn.Linear) for m in net.modules())


@pytest.mark.parametrize("name", ["resnet20", "preresnet20", "vgg16-bn", "medium-cnn", "lenet"])
def test_deterministic_init(name: str) -> None:
    torch.manual_seed(3)
    a = models.build(name).state_dict()
    torch.manual_seed(3)
    b = models.build(name).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
