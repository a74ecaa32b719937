"""Packed-Ensembles: layers, packed architectures, loss and predictor (issue 5).

The central check: a packed network is M independent subnetworks. Each subnetwork is rebuilt as
an ordinary (unpacked) network whose weights are the corresponding blocks of the grouped
weights, written out densely with the paper's mask (Eq. 4: zeros outside the γ subgroups), and
its outputs must match the packed network's member outputs.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from peg import models
from peg.layers import PackedConv2d, PackedLinear, packed_channels, rearrange
from peg.methods.base import NotFittedError
from peg.methods.packed import PackedEnsemble, packed_loss
from peg.models import _layers
from peg.models._packed import Packing
from peg.train import train

PACKED = (PackedConv2d, PackedLinear)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- slicing a packed network
def dense_member_weight(layer: PackedConv2d | PackedLinear, m: int) -> torch.Tensor:
    """Member m's weight as an ordinary dense layer's: its rows, with zeros between subgroups."""
    rows = layer.weight.shape[0] // layer.num_estimators
    block = layer.weight[m * rows : (m + 1) * rows]  # [out_m, in / groups, *k]
    if layer.first:
        return block.clone()  # the full first layer: member m owns rows, reads every input
    gamma, in_g = layer.gamma, block.shape[1]
    out_g = rows // gamma
    dense = block.new_zeros(rows, in_g * gamma, *block.shape[2:])
    for j in range(gamma):
        dense[j * out_g : (j + 1) * out_g, j * in_g : (j + 1) * in_g] = block[
            j * out_g : (j + 1) * out_g
        ]
    return dense


@torch.no_grad()
def load_member(packed: nn.Module, member: nn.Module, m: int) -> None:
    """Copy subnetwork m of `packed` into the plain network `member` (same module tree)."""
    pairs = list(zip(packed.modules(), member.modules(), strict=True))
    for p_mod, s_mod in pairs:
        if isinstance(p_mod, PACKED):
            s_mod.weight.copy_(dense_member_weight(p_mod, m))
            if p_mod.bias is not None:
                rows = p_mod.bias.shape[0] // p_mod.num_estimators
                s_mod.bias.copy_(p_mod.bias[m * rows : (m + 1) * rows])
        elif isinstance(p_mod, nn.BatchNorm2d):
            c = p_mod.num_features // packed.packing.num_estimators
            for name in ("weight", "bias", "running_mean", "running_var"):
                getattr(s_mod, name).copy_(getattr(p_mod, name)[m * c : (m + 1) * c])
        else:
            assert type(p_mod) is type(s_mod), (type(p_mod), type(s_mod))


def randomise(model: nn.Module, seed: int) -> nn.Module:
    """Non-trivial BatchNorm parameters and statistics (they are 1/0 after init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.BatchNorm2d):
                for t in (mod.weight, mod.bias, mod.running_mean):
                    t.copy_(torch.randn(t.shape, generator=gen) * 0.5)
                mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=gen) + 0.5)
    return model


# (name, kwargs of the packed model, kwargs of one member, input shape); α = 2 throughout, the
# member widths are chosen so the packed widths 2·C/M are exact.
CASES = {
    "mlp": (dict(in_features=6, hidden=(8, 8)), {2: dict(hidden=(8, 8)), 4: dict(hidden=(4, 4))}),
    "resnet8-A": (dict(depth=8, width=1.0), {2: dict(width=1.0), 4: dict(width=0.5)}),
    "resnet8-B": (
        dict(depth=8, width=1.0, shortcut="B"),
        {2: dict(width=1.0), 4: dict(width=0.5)},
    ),
    "vgg11-bn": (
        dict(depth=11, batch_norm=True, width=1 / 8, dropout=0.0),
        {2: dict(width=1 / 8), 4: dict(width=1 / 16)},
    ),
    "resnet18": (dict(depth=18, width=1 / 16), {2: dict(width=1 / 16), 4: dict(width=1 / 32)}),
}
CLASSES = {"mlp": models.MLP, "vgg11-bn": models.VGG, "resnet18": models.ResNet}


def _build_case(case: str, m: int, gamma: int) -> tuple[nn.Module, list[nn.Module], tuple]:
    base, per_m = CASES[case]
    cls = CLASSES.get(case, models.CifarResNet)
    torch.manual_seed(0)
    packed = randomise(cls(num_classes=3, packed=(2, m, gamma), **base), 1)
    members = [cls(num_classes=3, **{**base, **per_m[m]}) for _ in range(m)]
    for i, member in enumerate(members):
        load_member(packed, member, i)
    shape = (5, 6) if case == "mlp" else (5, 3, 16, 16)
    return packed, members, shape


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("gamma", [1, 2])
def test_packed_network_equals_independent_subnetworks(case: str, m: int, gamma: int) -> None:
    packed, members, shape = _build_case(case, m, gamma)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    for train_mode in (False, True):  # running statistics, then per-batch BatchNorm statistics
        packed.train(train_mode)
        with torch.no_grad():
            got = packed.member_forward(x)
            want = torch.stack([member.train(train_mode)(x) for member in members])
        assert got.shape == (m, shape[0], 3)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_layers_equal_their_member_blocks() -> None:
    """Layer level, the mask of Eq. 4 made explicit: first, hidden (γ = 2) and last layers."""
    torch.manual_seed(0)
    first = PackedConv2d(3, 4, 3, alpha=2, num_estimators=2, first=True, padding=1)
    hidden = PackedConv2d(4, 8, 3, alpha=2, num_estimators=2, gamma=2, padding=1)
    last = PackedLinear(8, 5, alpha=2, num_estimators=2, gamma=1, last=True)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        h = hidden(first(x))  # [B, 16, 6, 6]
        out = rearrange(last(h.mean((2, 3))), 2)  # [M, B, 5]
        for m in range(2):
            h_m = nn.functional.conv2d(
                x, dense_member_weight(first, m), first.bias[m * 4 :][:4], 1, 1
            )
            h_m = nn.functional.conv2d(
                h_m, dense_member_weight(hidden, m), hidden.bias[m * 8 :][:8], 1, 1
            )
            torch.testing.assert_close(h[:, m * 8 : (m + 1) * 8], h_m, rtol=1e-5, atol=1e-5)
            o_m = h_m.mean((2, 3)) @ dense_member_weight(last, m).T + last.bias[m * 5 :][:5]
            torch.testing.assert_close(out[m], o_m, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- parameter counts (§3.2)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("s", [1, 3])
def test_layer_parameters_follow_section_3_2(m: int, gamma: int, s: int) -> None:
    """weights M·(αCⱼ/M)(αCⱼ₊₁/M)s²/γ; biases one per packed output, M·(αCⱼ₊₁/M) = αCⱼ₊₁."""
    alpha, c_in, c_out = 2, 64, 128
    conv = PackedConv2d(c_in, c_out, s, alpha, m, gamma=gamma)
    assert conv.weight.numel() == m * (alpha * c_in / m) * (alpha * c_out / m) * s**2 / gamma
    assert conv.bias.numel() == alpha * c_out
    lin = PackedLinear(c_in, c_out, alpha, m, gamma=gamma, bias=False)
    assert n_params(lin) == m * (alpha * c_in / m) * (alpha * c_out / m) / gamma
    # First layer (full conv on the plain input): Cⱼ·αCⱼ₊₁·s². Last: M members × C outputs.
    assert PackedConv2d(3, c_out, s, alpha, m, first=True, bias=False).weight.numel() == (
        3 * alpha * c_out * s**2
    )
    head = PackedLinear(c_in, 10, alpha, m, gamma=gamma if 10 % gamma == 0 else 1, last=True)
    assert head.weight.numel() == m * (alpha * c_in / m) * 10 / head.gamma
    assert head.out_features == m * 10


def test_rounding_of_packed_widths() -> None:
    """α·C rounded up to a multiple of M (⌈α·C/M⌉ channels per member), exact when possible."""
    assert packed_channels(64, 2, 4) == 128
    assert packed_channels(64, math.sqrt(4), 4) == 128  # float √4 does not round up
    assert packed_channels(20, math.sqrt(2), 2) == 30  # 28.28 -> 2 × 15
    assert packed_channels(10, 1.5, 4) == 16  # 15 -> 4 × 4
    assert PackedLinear(20, 20, math.sqrt(2), 2).weight.shape == (30, 15)


@pytest.mark.parametrize("name", ["resnet18", "mlp"])
@pytest.mark.parametrize("m", [2, 4])
def test_alpha_sqrt_m_keeps_the_single_model_size(name: str, m: int) -> None:
    """§3.2: α = √M, γ = 1 gives about the parameters of the single model (exactly so for the
    hidden-to-hidden layers; the first layer grows by α, the head by √M: a small MLP input)."""
    kwargs = dict(in_features=8, hidden=(256, 256, 256)) if name == "mlp" else {}
    with torch.device("meta"):
        single = n_params(models.build(name, num_classes=10, **kwargs))
        packed = n_params(models.build(name, num_classes=10, packed=(math.sqrt(m), m), **kwargs))
    assert abs(packed / single - 1) < 0.10, (packed, single)


def test_alpha_m_is_deep_ensemble_size() -> None:
    """§3.2: α = M makes every member a full single model (first layer and head included)."""
    with torch.device("meta"):
        single = n_params(models.build("resnet20"))
        packed = n_params(models.build("resnet20", packed=(4, 4, 1)))
    assert packed == 4 * single


# ---------------------------------------------------------------- independence
@pytest.mark.parametrize("name", ["resnet20", "mlp", "vgg11"])
def test_gradients_do_not_leak_between_subnetworks(name: str) -> None:
    torch.manual_seed(0)
    if name == "mlp":
        model, x = models.MLP(6, 3, hidden=(16, 16), packed=(2, 4, 2)), torch.randn(32, 6)
    else:
        kwargs = dict(depth=11, width=1 / 8, batch_norm=True) if name == "vgg11" else {}
        model = models.build("vgg" if name == "vgg11" else name, packed=(2, 4, 2), **kwargs)
        x = torch.randn(32, 3, 16, 16)
    model.train()
    y = torch.randint(0, 3, (32,))
    nn.functional.cross_entropy(model.member_forward(x)[1], y).backward()  # member 1 only
    layers = [mod for mod in model.modules() if isinstance(mod, (*PACKED, nn.BatchNorm2d))]
    for mod in layers:
        for p in (mod.weight, mod.bias):
            if p is None:
                continue
            blocks = p.grad.unflatten(0, (4, -1))  # member-major rows
            assert blocks[1].abs().sum() > 0
            for other in (0, 2, 3):
                assert torch.equal(blocks[other], torch.zeros_like(blocks[other]))


# ---------------------------------------------------------------- architectures
@pytest.mark.parametrize(
    "name, kwargs, shape",
    [
        ("resnet18", {}, (2, 3, 32, 32)),
        ("resnet20", {}, (2, 3, 32, 32)),
        ("resnet50", {}, (2, 3, 32, 32)),
        ("vgg16", {}, (2, 3, 32, 32)),
        ("vgg16-bn", {"num_classes": 100}, (2, 3, 32, 32)),
        ("mlp", {"in_features": 784, "num_classes": 10, "hidden": (64, 32)}, (2, 1, 28, 28)),
    ],
)
def test_packed_forward_shapes(name: str, kwargs: dict, shape: tuple) -> None:
    torch.manual_seed(0)
    net = models.build(name, packed={"alpha": 2, "num_estimators": 4, "gamma": 2}, **kwargs).eval()
    classes = kwargs.get("num_classes", 10)
    with torch.no_grad():
        out = net(torch.randn(*shape))
    assert out.shape == (2, classes) and out.member_logits.shape == (4, 2, classes)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(2))  # log p̄: normalised
    assert net.num_estimators == 4 and str(net.packing) == "Packed-Ensembles-(2, 4, 2)"


def test_forward_is_log_of_averaged_member_probabilities() -> None:
    torch.manual_seed(0)
    net = models.MLP(4, 3, hidden=(8,), packed=(2, 3)).eval()
    x = torch.randn(5, 4)
    with torch.no_grad():
        members = net.member_forward(x)
        torch.testing.assert_close(net(x).exp(), members.softmax(-1).mean(0))


def test_plain_models_are_unchanged() -> None:
    """No `packed`: plain layers, logits [B, C], `member_forward` -> [1, B, C]."""
    net = models.MLP(4, 3, hidden=(8,))
    assert not any(isinstance(mod, PACKED) for mod in net.modules())
    x = torch.randn(2, 4)
    out = net(x)
    assert not hasattr(out, "member_logits")
    torch.testing.assert_close(net.member_forward(x), out.unsqueeze(0))
    assert net.num_estimators == 1 and _layers.num_estimators() == 1


# ---------------------------------------------------------------- training and prediction
def test_training_with_packed_loss_lowers_the_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(256, 2, generator=gen)
    y = (X[:, 0] * X[:, 1] > 0).long()  # XOR: needs the hidden layer
    torch.manual_seed(0)
    net = models.MLP(2, 2, hidden=(16,), packed=(2, 4, 1))
    with torch.no_grad():
        before = packed_loss(net(X), y).item()
    _, history = train(
        net,
        (X, y),
        epochs=10,
        optimizer="adam",
        lr=0.02,
        batch_size=32,
        loss=packed_loss,
        progress=False,
    )
    with torch.no_grad():
        after = packed_loss(net(X), y).item()
    assert after < 0.8 * before and history[-1]["loss"] < history[0]["loss"]


def test_packed_loss_is_each_members_cross_entropy() -> None:
    members = torch.randn(3, 5, 4)
    y = torch.randint(0, 4, (5,))
    each = torch.stack([nn.functional.cross_entropy(z, y) for z in members])
    torch.testing.assert_close(packed_loss(members, y), each.mean())
    torch.testing.assert_close(packed_loss(members, y, reduction="sum"), each.sum())
    with pytest.raises(ValueError, match="output"):
        packed_loss(torch.randn(5, 4), y)
    with pytest.raises(ValueError, match="reduction"):
        packed_loss(members, y, reduction="none")


def test_packed_ensemble_predictor() -> None:
    torch.manual_seed(0)
    net = models.build("resnet20", width=0.25, packed=(2, 4, 1))
    X = torch.randn(7, 3, 16, 16)
    ens = PackedEnsemble(batch_size=3).fit(net, val=X)
    logits = ens.member_logits(X)
    assert logits.shape == (4, 7, 10) and len(ens) == 4
    assert ens.n_members_ == 4 and ens.meta_["n_members"] == 4
    with torch.no_grad():
        torch.testing.assert_close(logits, net.eval().member_forward(X))
    proba = ens.predict_proba((X, torch.zeros(7)))
    torch.testing.assert_close(proba.sum(-1), torch.ones(7))
    assert torch.equal(ens.predict(X), proba.argmax(-1))
    assert len(PackedEnsemble().fit(net)) == 4
    with pytest.raises(ValueError, match="model"):
        PackedEnsemble().fit(models.build("resnet20"))
    with pytest.raises(NotFittedError):
        PackedEnsemble().member_logits(X)


def test_rearrange() -> None:
    x = torch.arange(12.0).reshape(2, 6)  # B = 2, M = 3, C = 2
    out = rearrange(x, 3)
    assert out.shape == (3, 2, 2)
    assert torch.equal(out[1], torch.tensor([[2.0, 3.0], [8.0, 9.0]]))
    with pytest.raises(ValueError, match="x"):
        rearrange(x, 4)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(alpha=0), "alpha"),
        (dict(alpha=-1.5), "alpha"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(num_estimators=0), "num_estimators"),
        (dict(num_estimators=2.5), "num_estimators"),
        (dict(gamma=0), "gamma"),
        (dict(gamma=3), "gamma"),  # 2·8/4 = 4 channels per member: 3 subgroups do not divide
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict, name: str) -> None:
    args = dict(alpha=2, num_estimators=4, gamma=1) | kwargs
    with pytest.raises(ValueError, match=f"^{name}:"):
        PackedLinear(8, 8, **args)
    with pytest.raises(ValueError, match=f"^{name}:"):
        PackedConv2d(8, 8, 3, **args)
    with pytest.raises(ValueError, match=f"^{name}:"):
        models.MLP(
            4, 2, hidden=(8, 8), packed=(args["alpha"], args["num_estimators"], args["gamma"])
        )


@pytest.mark.parametrize("packed", ["2,4", (2,), {"alpha": 2}, {"alpha": 2, "M": 4}, 3])
def test_bad_packed_flag(packed: object) -> None:
    with pytest.raises(ValueError, match="^packed:"):
        models.build("resnet20", packed=packed)


def test_packing_spec_accepts_all_forms() -> None:
    spec = Packing(2, 4, 2)
    for form in [(2, 4, 2), [2, 4, 2], {"alpha": 2, "num_estimators": 4, "gamma": 2}, spec]:
        assert models.build("mlp", in_features=3, num_classes=2, packed=form).packing == spec
