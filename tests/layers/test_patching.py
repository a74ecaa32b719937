"""Ensemble Model Patching: EMP/ECMP layers, conversion, Eq. (6), overhead, MC inference."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from peg import models
from peg.layers.patching import (
    PatchedBatchNorm,
    PatchedConv,
    PatchedLinear,
    emp_loss,
    overhead,
    patch,
    patch_regularizer,
    patched_modules,
    set_sampling,
    unpatch,
)
from peg.methods.base import NotFittedError
from peg.methods.patching import MCPatched
from peg.train import Recipe, train


def bn_mlp(seed: int = 0, hidden: int = 64) -> nn.Module:
    """Linear - BN - ReLU - Linear - BN - ReLU - Linear on 2-D inputs, with running stats."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(2, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(),
        nn.Linear(hidden, 3),
    )
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(32, 2))
    return net.eval()


def which_component(value: torch.Tensor, comps: torch.Tensor) -> torch.Tensor:
    """Per element of `value` `[*shape]`, the index of the component `[K, *shape]` it equals."""
    match = comps == value.unsqueeze(0)
    assert match.any(0).all(), "an element equals no component"
    return match.float().argmax(0)


# ---------------------------------------------------------------- sampling


def test_emp_uses_one_component_per_layer_per_pass():
    model = patch(bn_mlp(), k=5, mode="emp", layers="bn+output", seed=0)
    seen = set()
    for layer in patched_modules(model).values():
        layer.train()
        comps = layer.components()
        for _ in range(20):
            drawn = layer.effective()
            ids = {n: which_component(drawn[n], comps[n]).unique() for n in comps}
            # every element of γ and of β (W and b) comes from one and the same component
            assert all(len(i) == 1 for i in ids.values())
            assert len({int(i) for i in ids.values()}) == 1
            seen.add(int(ids["weight"]))
    assert len(seen) > 1  # different passes pick different components


def test_ecmp_mixes_components_within_a_layer():
    model = patch(bn_mlp(), k=4, mode="ecmp", layers="bn+output", seed=0)
    for layer in patched_modules(model).values():
        layer.train()
        drawn = layer.effective()
        for name, comps in layer.components().items():
            assert len(which_component(drawn[name], comps).unique()) > 1


def test_eval_uses_mixture_mean_and_sampling_flag_forces_draws():
    model = patch(bn_mlp(), k=3, layers="bn", seed=0)
    x = torch.randn(16, 2)
    model.eval()
    layer = next(iter(patched_modules(model).values()))
    mean = layer.components()["weight"].mean(0)
    torch.testing.assert_close(layer.effective()["weight"], mean)
    assert torch.equal(model(x), model(x))  # deterministic eval
    set_sampling(model, True)
    outs = [model(x) for _ in range(6)]
    assert any(not torch.equal(outs[0], o) for o in outs[1:])
    set_sampling(model, None)
    assert torch.equal(model(x), model(x))


def test_sigma_adds_gaussian_noise_to_draws():
    layer = patch(bn_mlp(), k=1, layers="bn", sigma=0.1, seed=0)[1]
    layer.train()
    drawn = layer.effective()["weight"]
    diff = drawn - layer.components()["weight"][0]
    assert 0.05 < float(diff.detach().std()) < 0.2


# ---------------------------------------------------------------- conversion


def test_k1_is_the_plain_model():
    plain = bn_mlp()
    x = torch.randn(32, 2)
    patched = patch(copy.deepcopy(plain), k=1, mode="ecmp", layers="bn+input+output", seed=0)
    for mode in (True, False):  # train mode (batch statistics) and eval mode
        plain.train(mode), patched.train(mode)
        assert torch.equal(patched(x), plain(x))
    torch.testing.assert_close(patched[1].running_mean, plain[1].running_mean)


def test_patch_converts_in_place_and_seed_reproduces():
    model = bn_mlp()
    out = patch(model, k=3, layers="bn+output", seed=1)
    assert out is model
    assert isinstance(model[1], PatchedBatchNorm) and isinstance(model[4], PatchedBatchNorm)
    assert isinstance(model[6], PatchedLinear) and isinstance(model[0], nn.Linear)
    again = patch(bn_mlp(), k=3, layers="bn+output", seed=1)
    other = patch(bn_mlp(), k=3, layers="bn+output", seed=2)
    sd, sd2, sd3 = model.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(sd[key], sd2[key]) for key in sd)
    assert not torch.equal(sd["1.weight_components"], sd3["1.weight_components"])
    # component 0 is the original layer, the others are perturbed copies of it
    comps = model[1].weight_components
    assert torch.equal(comps[0], bn_mlp()[1].weight) and not torch.equal(comps[0], comps[1])
    with pytest.raises(ValueError, match="model: already patched"):
        patch(model)


def test_resnet20_patches_in_place_and_trains():
    net = models.build("resnet20", num_classes=4)
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    ref = copy.deepcopy(net)
    patch(net, k=3, mode="ecmp", layers="bn+output", seed=0)
    layers = patched_modules(net)
    assert sum(isinstance(m, PatchedBatchNorm) for m in layers.values()) == n_bn
    assert isinstance(net.head, PatchedLinear) and not any(
        isinstance(m, nn.BatchNorm2d) for m in net.modules()
    )
    x = torch.randn(4, 3, 32, 32)
    # unpatching with component 0 gives back the original network exactly
    restored = unpatch(copy.deepcopy(net), component=0)
    assert not patched_modules(restored)
    assert type(restored.stem[0][1]) is nn.BatchNorm2d and type(restored.head) is nn.Linear
    assert restored.state_dict().keys() == ref.state_dict().keys()
    assert torch.equal(restored.eval()(x), ref.eval()(x))
    net.train()
    out = net(x)
    assert out.shape == (4, 4)
    (F.cross_entropy(out, torch.arange(4)) + 1e-4 * patch_regularizer(net)).backward()
    assert net.head.weight_components.grad is not None
    assert net.stem[0][1].weight_components.grad.abs().sum() > 0


def test_conv_output_layer_and_unpatch_to_mean():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 3, 3, padding=1, padding_mode="reflect"),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    ref = copy.deepcopy(net).eval()
    patch(net, k=1, layers="input+output")
    assert isinstance(net[0], PatchedConv) and isinstance(net[3], PatchedConv)
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(net.eval()(x), ref(x))
    patch(unpatch(net), k=4, layers="bn+output", seed=0)
    expected = net(x)  # eval mode: the mixture mean
    unpatch(net)  # to the mixture mean
    assert type(net[1]) is nn.BatchNorm2d and type(net[3]) is nn.Conv2d
    assert net[3].padding_mode == "reflect"
    torch.testing.assert_close(net(x), expected)


# ---------------------------------------------------------------- overhead and Eq. (6)


def test_overhead_matches_the_paper_formulas():
    k = 5
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    before = sum(p.numel() for p in mlp.parameters())
    patch(mlp, k=k, layers="bn+input+output")
    report = overhead(mlp)
    assert report["per_layer"] == {
        "0": (k - 1) * (4 + 1) * 8,  # (K-1)(I_1+1)O_1
        "1": 2 * (k - 1) * 8,  # 2(K-1)N_2
        "3": (k - 1) * (8 + 1) * 3,  # (K-1)(I_L+1)O_L
    }
    assert report["total"] == sum(p.numel() for p in mlp.parameters()) - before
    assert report["base"] == before and report["ratio"] == report["total"] / before

    cnn = nn.Sequential(
        nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6), nn.Conv2d(6, 2, 5, bias=False)
    )
    patch(cnn, k=k, layers="bn+input+output")
    # (K-1)(k_1² I_1 O_1 + k_L² I_L O_L) + 2(K-1)N_2
    assert overhead(cnn)["total"] == (k - 1) * (9 * 3 * 6 + 25 * 6 * 2) + 2 * (k - 1) * 6


def test_regularizer_is_eq6():
    model = patch(bn_mlp(hidden=8), k=4, layers="bn+output", seed=0)
    reg = patch_regularizer(model, shared=False)
    expected = sum(
        0.5 * (1 / 4) * c[i].pow(2).sum()
        for m in patched_modules(model).values()
        for c in m.components().values()
        for i in range(4)
    )
    torch.testing.assert_close(reg, expected)
    shared = sum(0.5 * p.pow(2).sum() for p in (model[0].weight, model[0].bias))
    shared = shared + 0.5 * (model[3].weight.pow(2).sum() + model[3].bias.pow(2).sum())
    torch.testing.assert_close(patch_regularizer(model), expected + shared)
    assert reg > 0
    logits, y = model(torch.randn(8, 2)), torch.zeros(8, dtype=torch.long)
    loss = emp_loss(model, 0.01, shared=False)(logits, y)
    torch.testing.assert_close(loss, F.cross_entropy(logits, y) + 0.01 * reg)


def test_training_with_emp_loss_lowers_the_loss(moons_data):
    X, y = moons_data["train"]
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
    patch(net, k=5, mode="emp", layers="bn+output", seed=0)
    recipe = Recipe(epochs=15, lr=0.05, batch_size=50, weight_decay=0.0, schedule="constant")
    _, history = train(net, (X, y), recipe, loss=emp_loss(net, 1e-4), progress=False)
    assert history[-1]["loss"] < 0.7 * history[0]["loss"]
    assert history[-1]["accuracy"] > 0.8


# ---------------------------------------------------------------- MC inference


def test_mc_shapes_probabilities_and_len(moons_data):
    X = moons_data["test"][0][:100]
    model = patch(bn_mlp(), k=5, mode="ecmp", layers="bn+output", seed=0)
    mc = MCPatched(n_members=6, seed=0).fit(model)
    logits = mc.member_logits(X, batch_size=32)
    assert logits.shape == (6, 100, 3) and len(mc) == 6
    proba = mc.predict_proba(X)
    assert proba.shape == (100, 3)
    torch.testing.assert_close(proba.sum(-1), torch.ones(100))
    assert torch.equal(mc.predict(X), proba.argmax(-1))
    assert mc.meta_["mode"] == "ecmp" and mc.meta_["k"] == 5
    assert mc.meta_["overhead"] == overhead(model)["total"]


def test_mc_seeds_and_batchnorm_statistics(moons_data):
    X = moons_data["test"][0][:64]
    model = patch(bn_mlp(), k=5, mode="emp", layers="bn+output", seed=0)
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    a = MCPatched(n_members=5, seed=3).fit(model)
    before = {k: v.clone() for k, v in a.model_.state_dict().items() if "running" in k}
    logits = a.member_logits(X, batch_size=16)
    torch.manual_seed(123)  # the global RNG state must not matter
    assert torch.equal(MCPatched(n_members=5, seed=3).fit(model).member_logits(X, 16), logits)
    assert not torch.equal(MCPatched(n_members=5, seed=4).fit(model).member_logits(X, 16), logits)
    assert all(not torch.equal(logits[0], logits[s]) for s in range(1, 5))
    after = a.model_.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(stats[k], model.state_dict()[k]) for k in stats)
    state = torch.random.get_rng_state()
    a.predict_proba(X)
    assert torch.equal(state, torch.random.get_rng_state())


def test_mc_errors():
    with pytest.raises(ValueError, match="model: .* no patched layers"):
        MCPatched().fit(bn_mlp())
    with pytest.raises(NotFittedError):
        MCPatched().member_logits(torch.randn(2, 2))
    with pytest.raises(ValueError, match="n_members"):
        MCPatched(n_members=0)


# ---------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"k": 0}, "k"),
        ({"k": 2.5}, "k"),
        ({"mode": "mc"}, "mode"),
        ({"layers": "conv"}, "layers"),
        ({"layers": "bn+bn"}, "layers"),
        ({"layers": ""}, "layers"),
        ({"noise": -1.0}, "noise"),
        ({"sigma": float("nan")}, "sigma"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        patch(bn_mlp(), **kwargs)


def test_missing_layers_and_unpatch_errors():
    with pytest.raises(ValueError, match="^layers: 'bn'"):
        patch(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2)), layers="bn")
    with pytest.raises(ValueError, match="^model: has no patched layers"):
        unpatch(bn_mlp())
    with pytest.raises(ValueError, match="^component:"):
        unpatch(patch(bn_mlp(), k=2), component=2)
    with pytest.raises(ValueError, match="^weight:"):
        emp_loss(bn_mlp(), -1.0)
