"""Ensemble: stacked members, prediction strategies, eval-mode handling."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import peg
from peg import ensemble as ensemble_module

from conftest import BNNet, mlp


def members(bn_net, n=3):
    out = []
    for s in range(n):
        torch.manual_seed(s + 10)
        m = BNNet()
        m.load_state_dict(bn_net.state_dict())
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.1 * torch.randn_like(p))
        out.append(m.eval())
    return out


def test_member_logits_match_each_model(bn_net):
    models = members(bn_net)
    ens = peg.Ensemble.from_models(models)
    X = torch.randn(37, 2)
    logits = ens.member_logits(X, batch_size=8)
    assert logits.shape == (3, 37, 3)
    with torch.no_grad():
        for i, m in enumerate(models):
            torch.testing.assert_close(logits[i], m(X))
    # unchanged BatchNorm statistics are stored once
    assert "body.1.running_mean" in ens.shared and "body.0.weight" in ens.stacked


def test_vmap_equals_loop_with_batchnorm(bn_net):
    ens = peg.Ensemble.from_models(members(bn_net, 4))
    X = torch.randn(50, 2)
    torch.testing.assert_close(
        ens.member_logits(X, strategy="vmap"),
        ens.member_logits(X, strategy="loop"),
        rtol=1e-5,
        atol=1e-5,
    )


def test_predict_proba_is_the_mean_of_member_softmaxes(bn_net):
    ens = peg.Ensemble.from_models(members(bn_net))
    X = torch.randn(20, 2)
    p = ens.predict_proba(X)
    torch.testing.assert_close(p, ens.member_logits(X).softmax(-1).mean(0))
    torch.testing.assert_close(p.sum(-1), torch.ones(20))
    assert torch.equal(ens.predict(X), p.argmax(-1))


def test_predictions_are_in_eval_mode_and_leave_the_skeleton_mode(bn_net):
    m = members(bn_net, 1)[0]
    ens = peg.Ensemble.from_models([m, m])
    ens.skeleton.train()
    X = torch.randn(10, 2)
    a, b = ens.member_logits(X), ens.member_logits(X)
    torch.testing.assert_close(a, b)  # dropout off, running statistics used
    assert ens.skeleton.training


def test_member_model_and_errors():
    models = [mlp(0), mlp(1)]
    ens = peg.Ensemble.from_models(models)
    assert len(ens) == 2 and not hasattr(ens, "size")  # one name: len
    m = ens.member_model(1)
    X = torch.randn(5, 2)
    with torch.no_grad():
        torch.testing.assert_close(m(X), models[1](X))
    with pytest.raises(IndexError):
        ens.member_state(2)
    with pytest.raises(ValueError, match="strategy"):
        ens.member_logits(X, strategy="magic")
    with pytest.raises(ValueError, match="at least one"):
        peg.Ensemble.from_models([])
    with pytest.raises(ValueError, match="do not match"):
        peg.Ensemble(mlp(0), {"0.weight": torch.zeros(2, 20, 2)})


def test_identical_members_still_count(bn_net):
    ens = peg.Ensemble.from_models([mlp(0), mlp(0), mlp(0)])
    assert len(ens) == 3
    assert ens.member_logits(torch.randn(4, 2)).shape == (3, 4, 2)


@pytest.mark.parametrize("batch_size", [7, 64, 200])
def test_every_strategy_gives_the_same_logits(bn_net, batch_size):
    X = torch.randn(200, 2)
    ens = peg.Ensemble.from_models(members(bn_net, 5))
    ref = ens.member_logits(X, batch_size, strategy="loop")
    for strategy, chunk in [("vmap", None), ("chunked", 2), ("auto", None), ("auto", 3)]:
        out = ens.member_logits(X, batch_size, strategy=strategy, chunk_size=chunk)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", ["loop", "vmap", "folded", "chunked", "auto"])
def test_logits_are_ordinary_tensors_autograd_can_use(bn_net, strategy):
    # the forwards run under inference_mode; the logits handed out must not be inference tensors
    ens = peg.Ensemble.from_models(members(bn_net, 3))
    X = torch.randn(9, 2)
    for logits in (
        ens.member_logits(X, 4, strategy=strategy, chunk_size=2),
        ens.member_logits(X, 9, strategy=strategy, chunk_size=2),
        *ens.iter_member_logits(X, 4, strategy=strategy, chunk_size=2),
    ):
        assert not logits.is_inference() and logits.is_contiguous()
        temperature = torch.ones((), requires_grad=True)
        (logits / temperature).logsumexp(-1).sum().backward()
        assert temperature.grad is not None


def test_auto_vectorises_small_batches_and_loops_large_ones(bn_net):
    ens = peg.Ensemble.from_models(members(bn_net, 3))  # 160 FLOPs per row: always small
    assert ens._choose(torch.zeros(8, 2), None) == "folded"  # vmap where folding fails
    assert ens._choose(torch.zeros(8, 2), 2) == "chunked"
    assert ens._choose(torch.zeros(10_000, 2), None) == "folded"
    wide = peg.Ensemble.from_models([nn.Linear(1000, 1000), nn.Linear(1000, 1000)])
    rows = int(ensemble_module.AUTO_VECTORISE_FLOPS // 2e6)  # 2 MFLOP per row: 32 rows
    assert ens._choose(torch.zeros(8, 2), None) == "folded"
    assert wide._choose(torch.zeros(rows, 1000), None) == "folded"
    assert wide._choose(torch.zeros(rows + 1, 1000), None) == "loop"
    conv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 3))
    ens = peg.Ensemble.from_models([conv, conv])
    image = torch.zeros(1, 1, 100, 100)
    with FlopCounterMode(display=False) as counted:
        conv(image)
    rows = int(ensemble_module.AUTO_VECTORISE_FLOPS_CONV // counted.get_total_flops())
    assert 20 < rows < 1000
    assert ens._choose(image.expand(rows, -1, -1, -1), None) == "folded"
    assert ens._choose(image.expand(rows + 1, -1, -1, -1), None) == "loop"
    huge = torch.zeros(4, 1, 2000, 2000)  # beyond the budget, but 4 rows are always vectorised
    assert ens._choose(huge, None) == "folded"
    assert ens._choose(torch.zeros(5, 1, 2000, 2000), None) == "loop"


class _NotVmappable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lin.weight.sum().item() > 1e9:  # .item() on a vmapped weight: vmap fails
            return x
        return self.lin(x)


def test_auto_falls_back_to_the_loop_where_vmap_fails():
    models = [_NotVmappable() for _ in range(3)]
    ens = peg.Ensemble.from_models(models)
    X = torch.randn(10, 2)
    with pytest.raises(RuntimeError):
        ens.member_logits(X, strategy="vmap")  # an explicit choice is not overridden
    out = ens.member_logits(X, strategy="auto")
    torch.testing.assert_close(out, ens.member_logits(X, strategy="loop"))


def test_strategy_arguments_are_checked(bn_net):
    ens = peg.Ensemble.from_models(members(bn_net, 2))
    with pytest.raises(ValueError, match="strategy"):
        ens.member_logits(torch.zeros(3, 2), strategy="threads")
    with pytest.raises(ValueError, match="chunk_size"):
        ens.member_logits(torch.zeros(3, 2), strategy="chunked")
    with pytest.raises(ValueError, match="chunk_size"):
        ens.member_logits(torch.zeros(3, 2), strategy="chunked", chunk_size=0)


def test_the_loop_runs_member_modules_that_share_the_stacked_storage(bn_net):
    ens = peg.Ensemble.from_models(members(bn_net, 3))
    X = torch.randn(9, 2)
    functional = torch.stack([ens._member_output(i, X) for i in range(len(ens))])
    # modules vs functional_call: the same values, maybe another kernel (layout, alignment)
    torch.testing.assert_close(ens.member_logits(X, strategy="loop"), functional)
    storages = {
        t.untyped_storage().data_ptr() for t in [*ens.stacked.values(), *ens.shared.values()]
    }
    modules = ens._member_modules()
    assert modules is not None and len(modules) == 3
    for m in modules:
        assert all(t.untyped_storage().data_ptr() in storages for t in m.state_dict().values())
    ens.to("cpu")  # new storage dictionaries: the modules are rebuilt on them
    assert ens._member_modules() is not modules


def test_the_loop_builds_member_modules_only_for_an_ensemble_used_on_many_batches(
    bn_net, monkeypatch
):
    """A scale search predicts a few batches per ensemble (`Ensemble._sharing`): those run by
    functional_call, without a module copy per member, and from batch LOOP_MODULES_AFTER on
    the member modules; an ensemble a user holds builds them on its first batch
    (LOOP_MODULES_AFTER_HELD). The same logits either way (up to float32 rounding: batches of
    2 and one of 8 may run matrix-product kernels that round differently)."""
    from peg.runtime import strategies as _strategies

    monkeypatch.setattr(_strategies, "LOOP_MODULES_AFTER", 2)
    held = peg.Ensemble.from_models(members(bn_net, 3))
    search = peg.Ensemble._sharing(held.skeleton, held.stacked, held.shared)
    X = torch.randn(8, 2)
    for ens, first in ((search, 2), (held, 0)):
        built = []
        real = ens._member_modules
        monkeypatch.setattr(ens, "_member_modules", lambda b=built, r=real: b.append(1) or r())
        batches = [ens.member_logits(X[i : i + 2], strategy="loop") for i in range(0, 8, 2)]
        assert len(built) == 4 - first  # from batch `first` (0-based) on
        whole = ens.member_logits(X, strategy="loop")
        torch.testing.assert_close(torch.cat(batches, 1), whole)


@pytest.mark.parametrize("autocast", ["bf16", torch.bfloat16, "fp16"])
@pytest.mark.parametrize("strategy", ["loop", "folded", "vmap"])
def test_autocast_runs_the_forward_in_low_precision_and_returns_float32(autocast, strategy):
    torch.manual_seed(7)
    models = [nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)) for _ in range(3)]
    ens = peg.Ensemble.from_models(models)
    X = torch.randn(40, 20)
    full = ens.member_logits(X, strategy=strategy)
    low = ens.member_logits(X, strategy=strategy, autocast=autocast)
    assert low.dtype == torch.float32 and low.shape == full.shape
    assert not torch.equal(low, full)  # the forward really ran at the lower precision
    torch.testing.assert_close(low, full, rtol=0.05, atol=0.05)


def test_autocast_values_are_checked(bn_net):
    ens = peg.Ensemble.from_models(members(bn_net, 2))
    with pytest.raises(ValueError, match="autocast: expected None, 'bf16', 'fp16'"):
        ens.member_logits(torch.zeros(3, 2), autocast="int8")
    with pytest.raises(ValueError, match="autocast"):
        ens.member_logits(torch.zeros(3, 2), autocast=torch.float64)


def test_module_predictors_take_autocast_too():
    torch.manual_seed(8)
    net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 5))
    X = torch.randn(30, 20)
    full = peg.MCDropout(n_members=4, seed=0).fit(net).member_logits(X)
    low = peg.MCDropout(n_members=4, seed=0).fit(net).member_logits(X, autocast="bf16")
    assert low.dtype == torch.float32 and not torch.equal(low, full)
    torch.testing.assert_close(low, full, rtol=0.05, atol=0.05)


class ItemInside(nn.Module):
    """An MLP whose forward calls .item(), which vmap cannot run."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 4), nn.Linear(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * (1.0 + 0.0 * float(self.body[0].weight.sum().item()))


def test_a_verdict_of_vmap_is_kept_for_one_architecture_not_every_sequential():
    """A model vmap cannot run is looped from then on; another model of the same class name
    but another structure (here: any other nn.Sequential) is still vectorised."""
    from peg.runtime import auto_strategy as _auto_strategy

    torch.manual_seed(0)
    failing = peg.Ensemble.from_models([nn.Sequential(ItemInside()) for _ in range(3)])
    X = torch.randn(4, 2)
    failing.member_logits(X, strategy="auto")  # vmap fails, remembered
    assert _heads_arch(failing) in _auto_strategy._NOT_VMAPPABLE
    assert failing._choose(X, None) == "loop"  # not tried again
    other = peg.Ensemble.from_models([nn.Sequential(nn.Linear(2, 2)) for _ in range(3)])
    assert other._choose(X, None) != "loop"


def _heads_arch(ensemble: peg.Ensemble) -> tuple[str, str, str]:
    from peg.runtime.heads import architecture

    return architecture(ensemble.skeleton)


def test_members_keep_a_channels_last_models_layout():
    """Members stacked contiguously (as PEG builds them: θ + η·D from flat rows) take a
    channels-last skeleton's layout, so its fast kernels run, with the same logits; a
    contiguous skeleton's entries are taken as they are."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(4 * 2 * 2, 5)).eval()  # fmt: skip
    models = [net, _with_noise(net), _with_noise(net)]  # one architecture, other weights
    states = [m.state_dict() for m in models]
    stacked = {k: torch.stack([s[k] for s in states]).contiguous() for k in states[0]}
    X = torch.randn(6, 1, 8, 8)
    expected = torch.stack([m(X) for m in models])
    plain = peg.Ensemble(net, stacked)
    assert all(plain.stacked[k].data_ptr() == v.data_ptr() for k, v in stacked.items())
    skeleton = copy.deepcopy(net).to(memory_format=torch.channels_last)
    ensemble = peg.Ensemble(skeleton, stacked)
    weight = ensemble.member_state(1)["1.weight"]
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    assert torch.equal(weight, stacked["1.weight"][1])
    # one input channel: the weight is contiguous both ways, and its strides are the skeleton's
    assert ensemble.member_state(1)["0.weight"].stride() == skeleton[0].weight.stride()
    for strategy in ("loop", "vmap"):
        logits = ensemble.member_logits(X, strategy=strategy)
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)


def _with_noise(model: nn.Module) -> nn.Module:
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return other
