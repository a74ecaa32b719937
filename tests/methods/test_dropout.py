"""MC dropout: stochastic forward passes with only the dropout modules in train mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peg.methods.base import NotFittedError
from peg.methods.dropout import MCDropout, insert_dropout

from conftest import mlp


def dropout_mlp(p: float = 0.3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, 3))


def test_shapes_probabilities_and_len(moons_data):
    X = moons_data["test"][0][:100]
    mc = MCDropout(n_members=7).fit(dropout_mlp())
    logits = mc.member_logits(X, batch_size=32)
    assert logits.shape == (7, 100, 3) and len(mc) == 7
    proba = mc.predict_proba(X)
    assert proba.shape == (100, 3)
    torch.testing.assert_close(proba.sum(-1), torch.ones(100))
    assert torch.equal(mc.predict(X), proba.argmax(-1))
    assert mc.meta_["method"] == "mc_dropout" and mc.meta_["n_members"] == 7


def test_members_differ_and_seed_reproduces(moons_data):
    X = moons_data["test"][0][:50]
    model = dropout_mlp()
    a = MCDropout(n_members=5, seed=3).fit(model).member_logits(X)
    torch.manual_seed(123)  # the global RNG state must not matter
    b = MCDropout(n_members=5, seed=3).fit(model).member_logits(X)
    c = MCDropout(n_members=5, seed=4).fit(model).member_logits(X)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert all(not torch.equal(a[0], a[s]) for s in range(1, 5))


def test_global_rng_untouched(moons_data):
    mc = MCDropout(n_members=3).fit(dropout_mlp())
    state = torch.random.get_rng_state()
    mc.member_logits(moons_data["test"][0][:20])
    assert torch.equal(state, torch.random.get_rng_state())


def test_inputs_as_tuple_and_loader(moons_data):
    X, y = moons_data["test"][0][:64], moons_data["test"][1][:64]
    mc = MCDropout(n_members=4).fit(dropout_mlp())
    ref = mc.member_logits(X, batch_size=16)
    assert torch.equal(mc.member_logits((X, y), batch_size=16), ref)
    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    assert torch.equal(mc.member_logits(loader), ref)


def test_batchnorm_statistics_never_change(bn_net, moons_data):
    before = {k: v.clone() for k, v in bn_net.state_dict().items()}
    mc = MCDropout(n_members=6).fit(bn_net)
    X = moons_data["test"][0][:200]
    logits = mc.member_logits(X, batch_size=50)
    assert logits.shape == (6, 200, 3)
    bn = mc.model_.body[1]
    assert isinstance(bn, nn.BatchNorm1d) and not bn.training
    for k, v in mc.model_.state_dict().items():  # running_mean, running_var, num_batches_tracked
        assert torch.equal(v, before[k]), k
    for k, v in bn_net.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not torch.equal(logits[0], logits[1])  # dropout still active


def test_batchnorm_uses_running_statistics(bn_net, moons_data):
    # With dropout at p ~ 0, every member equals the eval-mode model: BatchNorm is in eval mode.
    bn_net.body[3].p = 1e-7
    X = moons_data["test"][0][:100]
    logits = MCDropout(n_members=3).fit(bn_net).member_logits(X)
    with torch.no_grad():
        expected = bn_net.eval()(X)
    for s in range(3):
        torch.testing.assert_close(logits[s], expected)


def test_tiny_dropout_approximates_deterministic_model(moons_data):
    model = dropout_mlp(p=1e-6).eval()
    X = moons_data["test"][0]
    with torch.no_grad():
        expected = model(X).softmax(-1)
    proba = MCDropout(n_members=4).fit(model).predict_proba(X)
    torch.testing.assert_close(proba, expected, atol=1e-5, rtol=1e-4)


def test_no_dropout_layer_raises():
    with pytest.raises(ValueError, match="insert"):
        MCDropout().fit(mlp(0))


def test_insert_leaves_callers_model_unchanged(overfit_mlp, moons_data):
    before = {k: v.clone() for k, v in overfit_mlp.state_dict().items()}
    modules_before = [type(m) for m in overfit_mlp.modules()]
    mc = MCDropout(n_members=8, insert=0.2).fit(overfit_mlp)
    assert [type(m) for m in overfit_mlp.modules()] == modules_before
    assert overfit_mlp.state_dict().keys() == before.keys()
    for k, v in overfit_mlp.state_dict().items():
        assert torch.equal(v, before[k])
    # The last Linear ("2") is wrapped: Sequential(Dropout(0.2), Linear); its keys gain ".1".
    wrapped = mc.model_[2]
    assert isinstance(wrapped, nn.Sequential) and isinstance(wrapped[0], nn.Dropout)
    assert wrapped[0].p == 0.2 and "2.1.weight" in mc.model_.state_dict()
    assert mc.meta_["inserted_before"] == "2"
    X = moons_data["test"][0][:100]
    logits = mc.member_logits(X)
    assert logits.shape == (8, 100, 2) and not torch.equal(logits[0], logits[1])


def test_insert_before_last_layer_of_nested_model():
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 4), nn.ReLU()), nn.Linear(4, 2))
    assert insert_dropout(model, 0.1) == "1"
    assert isinstance(model[1][0], nn.Dropout)
    with pytest.raises(ValueError, match="insert"):
        insert_dropout(nn.Sequential(nn.ReLU()), 0.1)


def test_insert_ignored_with_existing_dropout():
    with pytest.warns(UserWarning, match="insert"):
        mc = MCDropout(insert=0.2).fit(dropout_mlp(0.3))
    assert mc.model_[2].p == 0.3 and mc.meta_["inserted_before"] is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_members": 0}, "n_members"),
        ({"insert": 0.0}, "insert"),
        ({"insert": 1.0}, "insert"),
        ({"insert": -0.1}, "insert"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MCDropout(**kwargs)


def test_errors_before_fit_and_bad_model(moons_data):
    with pytest.raises(NotFittedError):
        MCDropout().member_logits(moons_data["test"][0])
    with pytest.raises(TypeError, match="model"):
        MCDropout().fit("not a model")  # type: ignore[arg-type]
    MCDropout().fit(dropout_mlp(), val=moons_data["val"])  # a forward-pass check only

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = dropout_mlp()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.net(x), x

    with pytest.raises(TypeError, match="val"):  # not logits: caught at fit, not at predict
        MCDropout().fit(Pair(), val=moons_data["val"])


def test_sampled_dropout_draws_the_masks_of_nn_dropout_cheaply():
    from peg.methods.dropout import SampledDropout, sampled_dropout

    drop = SampledDropout(0.3).train()
    x = torch.ones(200, 500)
    torch.manual_seed(0)
    out = drop(x)
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01  # each entry kept with 1 − p
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.7))
    torch.manual_seed(0)
    assert torch.equal(drop(x), out)  # seeded by the global RNG, as MC dropout keys it
    assert torch.equal(drop.eval()(x), x)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2), nn.Dropout2d(0.2))
    sampled_dropout(model)
    assert type(model[1]) is SampledDropout and model[1].p == 0.2
    assert type(model[2]) is nn.Dropout2d  # channel masks are small: left as they are
