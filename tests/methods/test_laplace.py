"""`peg.Laplace`: laplace-torch's Laplace approximation behind peg's method contract.

Cross-checked against laplace-torch called directly with the same settings (the same Hessian
batches, prior optimisation and predictive), and on what the method is for: an over-confident
MLP's test NLL falls.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import peg
from peg import metrics
from peg.errors import ArchiveError
from peg.methods.laplace import _variance as _laplace_variance
from peg.streams import generator

from conftest import mlp, moons, overfit

laplace = pytest.importorskip("laplace")


@pytest.fixture(scope="module")
def digits() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    X, y = load_digits(return_X_y=True)
    X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
    return {"train": (X[:400], y[:400]), "test": (X[1000:1300], y[1000:1300])}


@pytest.fixture(scope="module")
def net(digits) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return overfit(model, *digits["train"], steps=300)


def _direct(model: nn.Module, data, batch_size: int, **options):
    """laplace-torch as its documentation calls it: Laplace(...), fit(DataLoader), prior."""
    la = laplace.Laplace(
        model,
        "classification",
        subset_of_weights=options.get("subset_of_weights", "last_layer"),
        hessian_structure=options.get("hessian_structure", "kron"),
    )
    la.fit(DataLoader(TensorDataset(*data), batch_size=batch_size))
    link = options.get("link_approx", "probit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if "val" in options:
            val = DataLoader(TensorDataset(*options["val"]), batch_size=batch_size)
            la.optimize_prior_precision(
                pred_type="glm", method="gridsearch", val_loader=val, link_approx=link
            )
        else:
            la.optimize_prior_precision(pred_type="glm", method="marglik", link_approx=link)
    return la


@pytest.mark.parametrize(
    ("structure", "link", "subset"),
    [("kron", "probit", "last_layer"), ("diag", "bridge", "last_layer"), ("kron", "probit", "all")],
)
def test_the_same_probabilities_and_prior_as_laplace_torch_directly(
    net, digits, structure, link, subset
):
    options = {"hessian_structure": structure, "link_approx": link, "subset_of_weights": subset}
    ours = peg.Laplace(batch_size=128, **options).fit(net, digits["train"])
    theirs = _direct(net, digits["train"], 128, **options)
    assert ours.prior_precision_ == pytest.approx(float(theirs.prior_precision), rel=1e-6)
    assert ours.prior_precision_ != 1.0  # marglik moved it from its start
    X = digits["test"][0]
    expected = theirs(X, pred_type="glm", link_approx=link)
    torch.testing.assert_close(ours.predict_proba(X), expected, rtol=1e-5, atol=1e-6)
    assert ours.meta_["hessian_structure"] == structure and ours.meta_["data_points"] == 400
    kronecker = structure == "kron" and subset == "last_layer"  # the others: laplace-torch's
    assert ours.meta_["fast_variance"] is kronecker


def test_grid_search_gives_laplace_torchs_prior(net, digits):
    val = (digits["test"][0][:100], digits["test"][1][:100])
    ours = peg.Laplace(prior_optimization="gridsearch", batch_size=50).fit(
        net, val, train_data=digits["train"]
    )
    assert ours.meta_["fast_variance"] is True  # the grid search's predictive: the explicit one
    theirs = _direct(net, digits["train"], 50, val=val)
    assert ours.prior_precision_ == pytest.approx(float(theirs.prior_precision), rel=1e-6)
    own = peg.Laplace(prior_optimization="gridsearch", batch_size=50, fast_variance=False)
    own.fit(net, val, train_data=digits["train"])  # laplace-torch's own grid search
    assert own.prior_precision_ == ours.prior_precision_


def test_predictions_are_distributions_and_members_log_probabilities(net, digits):
    X = digits["test"][0]
    fitted = peg.Laplace().fit(net, digits["train"])
    logits = fitted.member_logits(X)
    assert logits.shape == (1, len(X), 10) and len(fitted) == 1
    assert torch.isfinite(logits).all() and (logits <= 0).all()  # floored logs, never -inf
    p = fitted.predict_proba(X)
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(len(X)))
    torch.testing.assert_close(logits[0].exp(), p, rtol=1e-5, atol=1e-6)
    assert torch.equal(fitted.predict(X), p.argmax(-1))
    streamed = torch.cat(list(fitted.iter_member_logits(X, batch_size=70)), dim=1)
    torch.testing.assert_close(streamed, logits)


def test_mc_members_are_laplace_torchs_samples_seeded_per_batch(net, digits):
    X = digits["test"][0]
    mc = peg.Laplace(link_approx="mc", n_members=7, seed=3, batch_size=100)
    mc.fit(net, digits["train"])
    members = mc.member_logits(X)
    assert members.shape == (7, len(X), 10) and len(mc) == 7 and mc.meta_["n_members"] == 7
    draws = torch.Generator().manual_seed(int(generator(3, 1).initial_seed()))
    second = mc.laplace_.predictive_samples(X[100:200], n_samples=7, generator=draws)
    torch.testing.assert_close(members[:, 100:200].exp(), second, rtol=1e-5, atol=1e-6)
    assert torch.equal(mc.member_logits(X), members)  # reproducible
    other = peg.Laplace(link_approx="mc", n_members=7, seed=4, batch_size=100)
    assert not torch.equal(other.fit(net, digits["train"]).member_logits(X), members)
    torch.testing.assert_close(mc.predict_proba(X), members.exp().mean(0))  # the predictive


def test_the_nn_predictive_samples_last_layers_and_puts_the_mean_back(net, digits):
    X = digits["test"][0]
    sampled = peg.Laplace(pred_type="nn", link_approx="mc", n_members=5).fit(net, digits["train"])
    members = sampled.member_logits(X)
    assert members.shape == (5, len(X), 10) and torch.equal(sampled.member_logits(X), members)
    assert torch.equal(sampled.laplace_.model.last_layer.weight, net[2].weight)


def test_laplace_lowers_the_test_nll_of_an_over_confident_mlp():
    for seed in range(3):
        train, test = moons(60, seed), moons(1000, 100 + seed)
        model = overfit(mlp(seed), *train, steps=1500)
        with torch.no_grad():
            before = metrics.nll(model(test[0]).unsqueeze(0), test[1])
        after = metrics.nll(peg.Laplace().fit(model, train).member_logits(test[0]), test[1])
        assert after < 0.9 * before, seed


class _Stream(IterableDataset):
    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        self.X, self.y = X, y

    def __iter__(self):
        return zip(self.X, self.y, strict=True)


def test_loaders_datasets_and_tensors_give_one_fit(net, digits):
    X, y = digits["train"]
    pair = peg.Laplace(batch_size=64).fit(net, (X, y))
    test = digits["test"][0]
    loader = DataLoader(TensorDataset(X, y), batch_size=64)
    for data in (TensorDataset(X, y), loader, _Stream(X, y)):  # a stream is counted first
        fitted = peg.Laplace(batch_size=64).fit(net, data)
        assert fitted.prior_precision_ == pair.prior_precision_
        torch.testing.assert_close(fitted.predict_proba(test), pair.predict_proba(test))


def test_the_callers_model_is_left_alone(digits):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fitted = peg.Laplace().fit(model, digits["train"])
    assert model.training and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert fitted.model_ is not model and fitted.meta_["last_layer"] == "3"


@pytest.mark.parametrize("options", [{}, {"link_approx": "mc", "n_members": 4, "seed": 2}])
def test_save_and_load_give_the_same_predictions_without_the_data(net, digits, tmp_path, options):
    fitted = peg.Laplace(**options).fit(net, digits["train"])
    path = fitted.save(tmp_path / "la.safetensors")
    torch.manual_seed(1)
    other = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))  # weights ignored
    X = digits["test"][0]
    for loaded in (peg.load(path, other), peg.Laplace.load(path, other)):  # one reader
        assert isinstance(loaded, peg.Laplace)
        assert torch.equal(loaded.member_logits(X), fitted.member_logits(X))
        assert loaded.meta_ == fitted.meta_ and loaded.get_params() == fitted.get_params()
    saved = peg.utils.io.load_tree(path)
    assert saved["laplace"]["data"] is None  # laplace-torch's kept training batch is not saved
    with pytest.raises(ArchiveError, match="model: does not match"):
        peg.load(path, nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10)))


class _DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.fc(x)}


def test_bad_data_and_models_are_refused_before_laplace_torch_runs():
    X, y = moons(40, 0)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        peg.Laplace().fit(mlp(0), (X, y + 1))
    loader = DataLoader(TensorDataset(X, y + 1), batch_size=16)
    with pytest.raises(ValueError, match=r"val: batch 0 .*labels must lie in \[0, 2\)"):
        peg.Laplace().fit(mlp(0), loader)
    with pytest.raises(TypeError, match=r"peg\.with_output\(model, 'logits'\)"):
        peg.Laplace().fit(_DictOut(), (X, y))
    wrapped = peg.Laplace().fit(peg.with_output(_DictOut(), "logits"), (X, y))
    assert wrapped.predict_proba(X).shape == (40, 2)
    with pytest.raises(ValueError, match="val: the model cannot run on inputs"):
        peg.Laplace().fit(mlp(0), (torch.randn(40, 3), y))


# ---------------------------------------------------------------- the Kronecker GLM covariance
def _kron_la(C: int, D: int, bias: bool = True, dtype=torch.float32, **options):
    """laplace-torch's last-layer KFAC Laplace, fitted directly on random data, around an MLP
    whose last layer is Linear(D → C)."""
    torch.manual_seed(C * 1000 + D)
    model = nn.Sequential(nn.Linear(4, D), nn.Tanh(), nn.Linear(D, C, bias=bias)).to(dtype)
    X, y = torch.randn(96, 4, dtype=dtype), torch.randint(0, C, (96,))
    la = laplace.Laplace(
        model, "classification", subset_of_weights="last_layer", hessian_structure="kron",
        **options,
    )  # fmt: skip
    la.fit(DataLoader(TensorDataset(X, y), batch_size=32))
    return la, torch.randn(20, 4, dtype=dtype)


def _close(dtype):
    return {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 1e-11, "atol": 0}


@pytest.mark.parametrize(
    ("C", "D", "bias", "dtype"),
    [
        (C, D, bias, dtype)
        for C, D in [(2, 5), (3, 40), (10, 64)]
        for bias in (True, False)
        for dtype in (torch.float32, torch.float64)
    ]
    + [(10, 1568, True, torch.float32)],  # SmallCNN's last layer
)
def test_the_kronecker_covariance_is_laplace_torchs(C, D, bias, dtype):
    la, x = _kron_la(C, D, bias, dtype)
    assert _laplace_variance.supported(la)
    priors = [1.0, 0.37] + ([torch.tensor([0.2, 5.0], dtype=dtype)] if bias else [])
    for prior in priors:  # a scalar prior, and per layer (weight, bias)
        la.prior_precision = prior
        Js, f = la.backend.last_layer_jacobians(x)  # laplace-torch's [B, C, P] Jacobians
        expected = la.functional_variance(Js)
        _, features = la.model.forward_with_features(x)
        ours = _laplace_variance.kron_functional_variance(la.posterior_precision, features, bias)
        assert ours.dtype == dtype and ours.shape == (len(x), C, C)
        torch.testing.assert_close(ours, expected, **_close(dtype))
        moments = _laplace_variance.glm_predictive_distribution(la, x)
        assert moments is not None
        torch.testing.assert_close(moments[1], expected, **_close(dtype))
        assert torch.equal(moments[0], f)


@pytest.mark.parametrize("bias", [True, False])
def test_damping_is_followed_as_laplace_torch_defines_it(bias):
    la, x = _kron_la(4, 12, bias, torch.float64, damping=True)
    la.prior_precision = 0.5
    Js, _ = la.backend.last_layer_jacobians(x)
    _, features = la.model.forward_with_features(x)
    precision = la.posterior_precision
    # laplace-torch 0.3 takes damping=True but does not apply it here: KronLaplace.__init__
    # resets the flag under KronLLLaplace's, and the posterior precision (H · factor + prior) is
    # a new KronDecomposed without it; ours reads the same object, so it is undamped too
    assert not la.damping and not precision.damping
    moments = _laplace_variance.glm_predictive_distribution(la, x)
    assert moments is not None
    undamped = moments[1]
    torch.testing.assert_close(undamped, la.functional_variance(Js), rtol=1e-11, atol=0)
    damped = type(precision)(
        precision.eigenvectors, precision.eigenvalues, precision.deltas, damping=True
    )  # the damped inverse, (a + √δ)(g + √δ), as KronDecomposed._bmm computes it
    expected = damped.inv_square_form(Js)
    ours = _laplace_variance.kron_functional_variance(damped, features, bias)
    torch.testing.assert_close(ours, expected, rtol=1e-11, atol=0)
    assert not torch.allclose(expected, precision.inv_square_form(Js))  # damping changed it


def test_the_links_and_samples_are_laplace_torchs_on_the_kronecker_covariance():
    la, x = _kron_la(5, 30)
    la.prior_precision = 0.3
    assert _laplace_variance.usable(la)
    for link in ("probit", "bridge", "bridge_norm"):
        expected = la(x, pred_type="glm", link_approx=link)
        ours = _laplace_variance.predictive(la, x, link, 1, None)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
        Js, f_mu = la.backend.last_layer_jacobians(x)  # the links alone, on laplace-torch's
        f_var = la.functional_variance(Js)  # own moments: the same operations, the same bits
        own = _laplace_variance.link(f_mu.detach(), f_var.detach(), link)
        assert torch.equal(own, expected)
    draws = [torch.Generator().manual_seed(7) for _ in range(2)]
    expected = la.predictive_samples(x, n_samples=9, generator=draws[0])
    ours = _laplace_variance.predictive(la, x, "mc", 9, draws[1])
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
    assert "_glm_predictive_distribution" not in la.__dict__  # laplace-torch's object untouched


def test_another_laplace_torch_version_takes_laplace_torchs_own_path(net, digits, monkeypatch):
    X = digits["test"][0][:60]
    fast = peg.Laplace().fit(net, digits["train"])
    assert _laplace_variance.tested_version() and fast.meta_["fast_variance"] is True
    monkeypatch.setattr(_laplace_variance.importlib.metadata, "version", lambda name: "0.4.1")
    assert not _laplace_variance.tested_version()
    other = peg.Laplace().fit(net, digits["train"])
    assert other.meta_["fast_variance"] is False
    expected = other.laplace_(X, pred_type="glm", link_approx="probit")
    floored = expected.clamp_min(torch.finfo(expected.dtype).tiny).log()[None]
    assert torch.equal(other.member_logits(X), floored)  # laplace-torch's own call, as is
    torch.testing.assert_close(fast.predict_proba(X), expected, rtol=1e-5, atol=1e-6)
    sampled = peg.Laplace(link_approx="mc", n_members=3).fit(net, digits["train"])
    draws = torch.Generator().manual_seed(int(generator(0, 0).initial_seed()))
    own = sampled.laplace_.predictive_samples(X, n_samples=3, generator=draws)
    assert torch.equal(sampled.member_logits(X), own.clamp_min(torch.finfo(own.dtype).tiny).log())


def test_a_diagonal_prior_is_refused_by_laplace_torch_for_kron():
    la, _ = _kron_la(3, 6)
    with pytest.raises(ValueError, match="Prior precision for Kron either scalar or per-layer"):
        la.prior_precision = torch.ones(la.n_params)


def test_other_posteriors_fall_back_to_laplace_torchs_own_code(net, digits):
    X = digits["test"][0][:50]
    unfitted = laplace.Laplace(net, "classification", last_layer_name="2")
    assert not _laplace_variance.supported(unfitted)
    for options in (
        {"hessian_structure": "diag"},
        {"hessian_structure": "full"},
        {"subset_of_weights": "all"},
    ):
        fitted = peg.Laplace(**options).fit(net, digits["train"])
        assert not _laplace_variance.supported(fitted.laplace_)
        assert fitted.meta_["fast_variance"] is False
        expected = fitted.laplace_(X, pred_type="glm", link_approx="probit")
        torch.testing.assert_close(fitted.predict_proba(X), expected, rtol=1e-6, atol=1e-7)


def test_fast_variance_false_is_laplace_torchs_own_predictive(net, digits):
    X = digits["test"][0]
    fast = peg.Laplace().fit(net, digits["train"])
    slow = peg.Laplace(fast_variance=False).fit(net, digits["train"])
    assert fast.meta_["fast_variance"] is True and slow.meta_["fast_variance"] is False
    assert slow.prior_precision_ == fast.prior_precision_
    expected = slow.laplace_(X, pred_type="glm", link_approx="probit")
    torch.testing.assert_close(slow.predict_proba(X), expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(fast.predict_proba(X), expected, rtol=1e-5, atol=1e-6)
    nn_type = peg.Laplace(pred_type="nn", link_approx="mc", n_members=2).fit(net, digits["train"])
    assert nn_type.meta_["fast_variance"] is False  # sampled networks: no GLM covariance
