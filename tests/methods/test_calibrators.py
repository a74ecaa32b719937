"""The calibrators beside temperature scaling (vector / matrix scaling, Dirichlet calibration,
histogram binning, isotonic regression), on a miscalibrated linear model of synthetic data:
each against the uncalibrated predictor and temperature scaling, against independent NumPy /
SciPy / scikit-learn fits, on ensembles and a fitted PEG, saved and loaded, streamed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize
from scipy.special import log_softmax
from sklearn.isotonic import IsotonicRegression
from torch import nn

import peg
from peg import archive
from peg.methods.calibration import _affine
from peg.methods.calibration import _affine_solvers as solvers
from peg.methods.calibration.binning import renormalised
from peg.metrics._inputs import ensemble_log_probs

from conftest import mlp, moons, overfit

C, D = 5, 8
TINY = 1e-7  # the optimisers' tolerance, in nats of validation NLL


def _task(seed: int = 0, n: int = 3000) -> tuple[nn.Module, tuple, tuple]:
    """A linear model 3x too confident, and off in its weights, with validation and test data
    drawn from the true linear model."""
    g = torch.Generator().manual_seed(seed)
    true = torch.randn(D, C, generator=g)

    def draw(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        X = torch.randn(rows, D, generator=g)
        return X, torch.multinomial((X @ true).softmax(-1), 1, generator=g)[:, 0]

    model = nn.Linear(D, C)
    with torch.no_grad():
        model.weight.copy_(3 * (true.T + 0.3 * torch.randn(C, D, generator=g)))
        model.bias.copy_(0.5 * torch.randn(C, generator=g))
    return model.eval(), draw(n), draw(n)


MODEL, VAL, TEST = _task()
CALIBRATORS = {
    "vector": lambda: peg.VectorScaling(),  # "auto": shrunk towards TS by cross-validation
    "vector-guo": lambda: peg.VectorScaling(reg_mu=0.0),
    "matrix": lambda: peg.MatrixScaling(),
    "matrix-guo": lambda: peg.MatrixScaling(reg_lambda=0.0, reg_mu=0.0),
    "matrix-odir": lambda: peg.MatrixScaling(reg_lambda=1.0, reg_mu=1.0),
    "dirichlet": lambda: peg.DirichletCalibration(),
    "dirichlet-odir": lambda: peg.DirichletCalibration(reg_lambda=10.0, reg_mu=10.0),
    "dirichlet-l2": lambda: peg.DirichletCalibration(reg_lambda=0.0, reg_mu=0.0, l2=1.0),
    "histogram": lambda: peg.HistogramBinning(),
    "histogram-quantile": lambda: peg.HistogramBinning(n_bins=8, strategy="quantile"),
    "isotonic": lambda: peg.IsotonicCalibration(),
}
# W = I / T, b = 0 at no penalty (the centre of "auto"; off-diagonal and b 0 for ODIR)
CONTAIN_TS = (
    "vector",
    "vector-guo",
    "matrix",
    "matrix-guo",
    "matrix-odir",
    "dirichlet",
    "dirichlet-odir",
)


def nll(predictor, data) -> float:
    return peg.evaluate(predictor, *data)["nll"]


@pytest.fixture(scope="module")
def ts() -> peg.TemperatureScaling:
    return peg.TemperatureScaling().fit(MODEL, VAL)


@pytest.fixture(scope="module", params=list(CALIBRATORS))
def fitted(request) -> tuple[str, object]:
    return request.param, CALIBRATORS[request.param]().fit(MODEL, VAL)


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_a_class_absent_from_the_labels_is_warned_of(name):
    """Per-class parameters learn nothing of a class the labels never show: its probability
    goes towards 0 (Dirichlet's test NLL is then infinite on a point of it), so fit says so."""
    X, y = VAL
    kept = y != C - 1
    with pytest.warns(UserWarning, match=rf"val: classes \[{C - 1}\] \(1 of {C}\) never appear"):
        fitted = CALIBRATORS[name]().fit(MODEL, (X[kept], y[kept]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one parameter for all classes: nothing to say
        peg.TemperatureScaling().fit(MODEL, (X[kept], y[kept]))
        every = CALIBRATORS[name]().fit(MODEL, VAL)  # every class: nothing to say
    absent = TEST[1] == C - 1  # what it warns of: their NLL > 3 x the one fitted on them
    Xa = TEST[0][absent]
    assert nll(fitted, (Xa, TEST[1][absent])) > 3 * nll(every, (Xa, TEST[1][absent]))


# ---------------------------------------------------------------- against the uncalibrated and TS
def test_each_calibrator_lowers_the_validation_nll(fitted, ts):
    name, calibrator = fitted
    before = nll(MODEL, VAL)
    assert nll(calibrator, VAL) < before - 0.3  # 3x over-confident: a large gain
    assert nll(calibrator, TEST) < nll(MODEL, TEST) - 0.3
    if name in CONTAIN_TS:  # its family holds temperature scaling at no penalty
        assert nll(calibrator, VAL) <= nll(ts, VAL) + TINY


def test_vector_scaling_contains_temperature_scaling_on_either_scores(ts):
    for scores in ("auto", "log_probs"):
        vs = peg.VectorScaling(scores=scores).fit(MODEL, VAL)
        assert nll(vs, VAL) <= nll(ts, VAL) + TINY
        assert vs.scores_ == ("logits" if scores == "auto" else "log_probs")


def test_unregularised_matrix_scaling_is_at_least_as_good_as_vector_scaling_on_validation():
    for scores in ("auto", "log_probs"):
        vs = peg.VectorScaling(reg_mu=0.0, scores=scores).fit(MODEL, VAL)
        ms = peg.MatrixScaling(reg_lambda=0.0, reg_mu=0.0, scores=scores).fit(MODEL, VAL)
        assert nll(ms, VAL) <= nll(vs, VAL) + TINY


def test_matrix_scaling_of_log_probs_is_unregularised_dirichlet_calibration():
    ms = peg.MatrixScaling(reg_lambda=0.0, reg_mu=0.0, scores="log_probs").fit(MODEL, VAL)
    dc = peg.DirichletCalibration(reg_lambda=0.0, reg_mu=0.0).fit(MODEL, VAL)
    torch.testing.assert_close(
        ms.predict_proba(TEST[0]), dc.predict_proba(TEST[0]), atol=1e-5, rtol=0
    )
    raw = peg.MatrixScaling(reg_lambda=0.0, reg_mu=0.0).fit(MODEL, VAL)  # W z ≠ W log p̄
    assert raw.scores_ == "logits" and not torch.allclose(raw.weights_, ms.weights_, atol=1e-3)


# ---------------------------------------------------------------- against independent fits
def _scipy_dirichlet(s: np.ndarray, y: np.ndarray, lam: float, mu: float, l2: float):
    """Kull et al.'s objective, written out in NumPy, minimised by SciPy's L-BFGS-B."""
    n, c = s.shape
    off = 1 - np.eye(c)
    lam, mu, l2 = lam / (c * (c - 1)), mu / c, l2 / (c * (c + 1))
    onehot = np.eye(c)[y]

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        W, b = theta[: c * c].reshape(c, c), theta[c * c :]
        log_p = log_softmax(s @ W.T + b, axis=1)
        r = (np.exp(log_p) - onehot) / n
        value = -log_p[np.arange(n), y].mean()
        value += lam * (off * W**2).sum() + mu * (b**2).sum() + l2 * ((W**2).sum() + (b**2).sum())
        gW = r.T @ s + 2 * lam * off * W + 2 * l2 * W
        gb = r.sum(0) + 2 * mu * b + 2 * l2 * b
        return value, np.concatenate([gW.ravel(), gb])

    start = np.concatenate([np.eye(c).ravel(), np.zeros(c)])
    options = {"maxiter": 20000, "maxfun": 40000, "gtol": 1e-11, "ftol": 1e-15, "maxcor": 30}
    result = minimize(objective, start, jac=True, method="L-BFGS-B", options=options)
    return result.x[: c * c].reshape(c, c), result.x[c * c :]


@pytest.mark.parametrize(("lam", "mu", "l2"), [(1.0, 1.0, 0.0), (0.0, 0.0, 2.0), (5.0, 0.5, 0.1)])
def test_dirichlet_equals_a_direct_scipy_fit_of_the_same_objective(lam, mu, l2):
    dc = peg.DirichletCalibration(reg_lambda=lam, reg_mu=mu, l2=l2).fit(MODEL, VAL)
    with torch.no_grad():
        s = ensemble_log_probs(MODEL(VAL[0])[None])  # log softmax of the one member
    W, b = _scipy_dirichlet(s.numpy(), VAL[1].numpy(), lam, mu, l2)
    torch.testing.assert_close(dc.weights_, torch.from_numpy(W), atol=2e-5, rtol=0)
    torch.testing.assert_close(dc.bias_, torch.from_numpy(b), atol=2e-5, rtol=0)
    # and the gradient of the objective, by autograd, vanishes at peg's optimum
    w, bias = dc.weights_.clone().requires_grad_(), dc.bias_.clone().requires_grad_()
    c = torch.arange(C)
    off = (w[c[:, None] != c]).square().sum() * lam / (C * (C - 1))
    ridge = l2 / (C * (C + 1)) * (w.square().sum() + bias.square().sum())
    loss = F.cross_entropy(s @ w.T + bias, VAL[1]) + off + mu / C * bias.square().sum() + ridge
    loss.backward()
    assert max(w.grad.abs().max(), bias.grad.abs().max()) < 1e-8


def test_the_newton_cg_path_for_many_classes_finds_newtons_optimum(monkeypatch):
    with torch.no_grad():
        s = ensemble_log_probs(MODEL(VAL[0])[None])
    for full in (True, False):
        newton = _affine.fit_affine(s, VAL[1], full=full, reg_lambda=1.0, reg_mu=1.0)
        monkeypatch.setattr(solvers, "NEWTON_MAX", 0)
        cg = _affine.fit_affine(s, VAL[1], full=full, reg_lambda=1.0, reg_mu=1.0)
        monkeypatch.undo()
        for a, b in zip(newton, cg, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def _probs(model: nn.Module, X: torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """p̄ as the calibrators see it: exp of log p̄ (float64), the logits in the calibrators'
    batches (their default 512 rows: the same matrix-product shapes, so the same bits)."""
    with torch.no_grad():
        logits = torch.cat([model(x) for x in X.split(batch_size)])
        return ensemble_log_probs(logits[None]).exp().numpy()


def _reference_renormalised(q: np.ndarray, floor: float) -> np.ndarray:
    q = np.maximum(q, floor)
    return q / q.sum(1, keepdims=True)


@pytest.mark.parametrize(("bins", "strategy"), [(7, "uniform"), (7, "quantile"), (200, "uniform")])
def test_histogram_binning_equals_a_numpy_reference(bins, strategy):
    floor = 1e-4
    hb = peg.HistogramBinning(n_bins=bins, strategy=strategy, floor=floor).fit(MODEL, VAL)
    p_val, p_test, labels = _probs(MODEL, VAL[0]), _probs(MODEL, TEST[0]), VAL[1].numpy()
    expected = np.empty_like(p_test)
    for c in range(C):
        if strategy == "uniform":
            edges = np.linspace(0, 1, bins + 1)
        else:
            edges = np.quantile(p_val[:, c], np.linspace(0, 1, bins + 1))
        fit_bin = np.digitize(p_val[:, c], edges[1:-1])  # inner[i-1] <= p < inner[i]
        test_bin = np.digitize(p_test[:, c], edges[1:-1])
        for k in range(bins):
            inside = fit_bin == k
            value = (labels[inside] == c).mean() if inside.any() else np.nan
            expected[test_bin == k, c] = value
        empty = np.isnan(expected[:, c])
        expected[empty, c] = p_test[empty, c]  # an empty bin keeps p̄_c
    np.testing.assert_allclose(
        hb.predict_proba(TEST[0]).numpy(), _reference_renormalised(expected, floor), atol=2e-6
    )
    assert hb.bin_values_.shape == (C, bins) and hb.bin_edges_.shape == (C, bins + 1)
    if bins == 200:  # some bins are empty: they keep p̄_c
        assert torch.isnan(hb.bin_values_).any()


def test_isotonic_equals_scikit_learn_applied_by_hand():
    ic = peg.IsotonicCalibration(floor=1e-5).fit(MODEL, VAL)
    p_val, p_test, labels = _probs(MODEL, VAL[0]), _probs(MODEL, TEST[0]), VAL[1].numpy()
    columns = []
    for c in range(C):
        regressor = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)
        regressor.fit(p_val[:, c], (labels == c).astype(float))
        np.testing.assert_array_equal(ic.thresholds_[c][0].numpy(), regressor.X_thresholds_)
        np.testing.assert_array_equal(ic.thresholds_[c][1].numpy(), regressor.y_thresholds_)
        columns.append(regressor.predict(p_test[:, c]))
    expected = _reference_renormalised(np.stack(columns, 1), 1e-5)
    np.testing.assert_allclose(ic.predict_proba(TEST[0]).numpy(), expected, atol=2e-6)


# ---------------------------------------------------------------- what comes out
def test_probabilities_are_finite_floored_and_sum_to_one(fitted):
    _, calibrator = fitted
    X = torch.cat([TEST[0], 30 * TEST[0][:50]])  # and far outside the validation range
    p = calibrator.predict_proba(X)
    assert torch.isfinite(p).all() and torch.isfinite(calibrator.member_logits(X)).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(len(X)), atol=1e-5, rtol=0)
    if hasattr(calibrator, "floor"):  # floored, then divided by at most C
        assert float(p.min()) >= calibrator.floor / C * (1 - 1e-4)
        assert calibrator.member_logits(X).shape == (1, len(X), C)


def test_renormalising_floors_and_a_row_of_zeros_becomes_uniform():
    q = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 1.0]], dtype=torch.float64)
    p = renormalised(q, 1e-6).exp()
    torch.testing.assert_close(p[0], torch.full((3,), 1 / 3, dtype=torch.float64))
    torch.testing.assert_close(p[1], torch.tensor([0.5, 1e-6, 1.0], dtype=torch.float64) / 1.500001)


# ---------------------------------------------------------------- any predictor
def _ensemble() -> peg.Ensemble:
    members = []
    for seed in range(3):
        member = nn.Linear(D, C)
        g = torch.Generator().manual_seed(seed + 10)
        with torch.no_grad():
            member.weight.copy_(MODEL.weight + 0.5 * torch.randn(C, D, generator=g))
            member.bias.copy_(MODEL.bias)
        members.append(member.eval())
    return peg.Ensemble.from_models(members, meta={"method": "three"})


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_composes_with_an_ensemble_of_three(name):
    ensemble = _ensemble()
    ts = peg.TemperatureScaling().fit(ensemble, VAL)
    calibrator = CALIBRATORS[name]().fit(ensemble, VAL)
    assert calibrator.scores_ == "log_probs"  # an ensemble has no single logits
    assert nll(calibrator, VAL) < nll(ensemble, VAL)
    if name in CONTAIN_TS:
        assert nll(calibrator, VAL) <= nll(ts, VAL) + TINY
    assert calibrator.meta_["predictor"] == {"method": "three"}


@pytest.fixture(scope="module")
def moons_peg() -> tuple[peg.PEG, tuple]:
    X, y = moons(300, 0)
    val = moons(400, 1)
    base = overfit(mlp(0, hidden=16), X, y, steps=400)
    return peg.PEG(n_members=4, grad_batch_size=32, eta=0.05, progress=False).fit(base, val), val


@pytest.mark.parametrize("name", ["vector", "dirichlet", "histogram", "isotonic"])
def test_composes_with_a_fitted_peg(moons_peg, name):
    ensemble, val = moons_peg
    calibrator = CALIBRATORS[name]().fit(ensemble, val)
    assert nll(calibrator, val) < nll(ensemble, val)
    assert calibrator.member_logits(val[0]).shape == (1, len(val[0]), 2)
    assert calibrator.meta_["predictor"]["method"] == "PEG"


# ---------------------------------------------------------------- save, load, stream
@pytest.mark.parametrize("on", ["module", "Ensemble"])
def test_save_and_load_give_identical_member_logits(fitted, on, tmp_path):
    name, calibrator = fitted
    if on == "Ensemble":
        calibrator = CALIBRATORS[name]().fit(_ensemble(), VAL)
    path = calibrator.save(tmp_path / "calibrated.peg")
    loaded = peg.load(path, nn.Linear(D, C))
    assert type(loaded) is type(calibrator) and loaded.get_params() == calibrator.get_params()
    assert torch.equal(loaded.member_logits(TEST[0]), calibrator.member_logits(TEST[0]))
    assert loaded.meta_ == calibrator.meta_ and loaded.scores_ == calibrator.scores_
    header = archive.read_header(path)
    assert header["meta"]["calibration"]["method"] == calibrator.method
    assert header["calibration"]  # the map's arrays stored as tensors, not in the JSON


def test_a_loaded_isotonic_map_predicts_as_scikit_learn():
    ic = peg.IsotonicCalibration().fit(MODEL, VAL)
    tensors = ic._tensors()
    rebuilt = peg.IsotonicCalibration._from_archive(
        peg.Ensemble.from_models([MODEL]), ic._archived(), tensors
    )
    p_val, p_test = _probs(MODEL, VAL[0]), _probs(MODEL, TEST[0])
    for c, (xs, ys) in enumerate(rebuilt.thresholds_):
        regressor = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)
        regressor.fit(p_val[:, c], (VAL[1].numpy() == c).astype(float))
        np.testing.assert_allclose(
            np.interp(p_test[:, c], xs, ys), regressor.predict(p_test[:, c]), atol=1e-12
        )


def test_streaming_equals_member_logits(fitted):
    _, calibrator = fitted
    whole = calibrator.member_logits(TEST[0], batch_size=256)
    streamed = torch.cat(list(calibrator.iter_member_logits(TEST[0], batch_size=256)), dim=1)
    torch.testing.assert_close(streamed, whole, atol=1e-6, rtol=0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*VAL), batch_size=500)
    again = type(calibrator)(**calibrator.get_params()).fit(MODEL, loader)
    torch.testing.assert_close(
        again.member_logits(TEST[0]), calibrator.member_logits(TEST[0]), atol=1e-5, rtol=0
    )


def test_every_calibrator_is_registered_for_loading():
    for cls in (peg.TemperatureScaling, *(type(make()) for make in CALIBRATORS.values())):
        assert peg.loading.CALIBRATORS[cls.method] == cls._from_archive


def test_a_calibrator_reads_the_model_in_eval_mode_and_leaves_it_as_it_was():
    """The logits of a plain nn.Module are read in eval mode, and the model keeps its modes and
    weights (a one-member ensemble of it: `methods._predictors.member_logits_of`)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)
    ).train()
    X, y = torch.randn(200, 4), torch.randint(0, 3, (200,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random labels: T runs to its bound, and says so
        fitted = peg.TemperatureScaling().fit(model, (X, y))
    assert all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        expected = model.eval()(X).log_softmax(-1) / fitted.temperature_
    torch.testing.assert_close(fitted.member_logits(X)[0].log_softmax(-1), expected.log_softmax(-1))
