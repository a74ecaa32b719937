"""Spline calibration (Gupta et al. 2021), ensemble temperature scaling (Zhang et al. 2020) and
diagonal order-preserving scaling (Rahimi et al. 2020): each as its paper defines it, checked
against an independent computation, on saved logits `[N, C]` read through `nn.Identity()`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from torch import nn

import peg
from peg.methods.calibration import _monotone
from peg.methods.calibration.spline import interpolate, natural_spline_basis

C = 6


def distorted(n: int, seed: int, c: int = C) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels drawn from softmax(z*); logits h(z*) with one monotone over-confident h."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g) * 1.5
    z[torch.arange(n), torch.randint(0, c, (n,), generator=g)] += 3
    y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]
    return 0.5 * z + 0.4 * z * z.abs(), y


def nll(probs: torch.Tensor, y: torch.Tensor) -> float:
    return float(-probs.double().log().gather(1, y[:, None]).mean())


VAL, TEST = distorted(2000, 0), distorted(2000, 1)


# ---------------------------------------------------------------- spline calibration
def test_the_natural_spline_basis_and_its_derivative():
    """Linear beyond the boundary knots (a natural spline), the derivative the basis's own
    (finite differences), and a least-squares fit of a cubic-free target exact."""
    knots = torch.linspace(0, 1, 5, dtype=torch.float64)
    t = torch.linspace(-0.5, 1.5, 401, dtype=torch.float64)
    value, slope = natural_spline_basis(t, knots)
    h = 1e-6
    ahead, _ = natural_spline_basis(t + h, knots)
    torch.testing.assert_close(slope, (ahead - value) / h, atol=1e-4, rtol=0)
    outside = (t < 0) | (t > 1)
    second = value.diff(dim=0).diff(dim=0)  # linear outside [t_0, t_K]: no curvature there
    assert second[outside[1:-1]].abs().max() < 1e-9
    target = 0.3 - 2.0 * t
    coef = torch.linalg.lstsq(value, target[:, None]).solution
    torch.testing.assert_close((slope @ coef)[:, 0], torch.full_like(t, -2.0))


def test_spline_maps_the_top_label_as_the_reference_procedure():
    """Recomputed by hand as Gupta et al.'s code does: sort the confidences, cumulate the
    accuracy minus the confidence, fit the spline, differentiate, interpolate; the top class
    gets the result (clipped), the others keep their proportions, the class never changes."""
    sc = peg.SplineCalibration(n_knots=6).fit(nn.Identity(), VAL)
    log_p = VAL[0].double().log_softmax(-1)
    conf, pred = log_p.max(-1)
    order = conf.argsort()
    f, hits = conf[order].exp(), (pred[order] == VAL[1][order]).double()
    n = len(f)
    t = torch.linspace(0, 1, n, dtype=torch.float64)
    value, slope = natural_spline_basis(t, torch.linspace(0, 1, 6, dtype=torch.float64))
    coef = torch.linalg.lstsq(value, ((hits - f).cumsum(0) / n)[:, None]).solution
    gamma = (f + (slope @ coef)[:, 0] * n / (n - 1)).clamp(0, 1)
    kept = torch.linspace(0, n - 1, 129, dtype=torch.float64).round().long()  # the map's points
    torch.testing.assert_close(sc.confidences_, f[kept])
    torch.testing.assert_close(sc.calibrated_, gamma[kept])
    X = TEST[0]
    p, before = sc.predict_proba(X).double(), X.double().softmax(-1)
    top = before.argmax(-1)
    assert torch.equal(p.argmax(-1), top)
    q = interpolate(before.max(-1).values, sc.confidences_, sc.calibrated_)
    mask = torch.ones_like(p, dtype=torch.bool).scatter(1, top[:, None], False)
    r = before[mask].view(len(X), C - 1)
    share = (1 - sc.floor) * r / r.sum(-1, keepdim=True) + sc.floor / (C - 1)
    a = share.max(-1).values  # the runner-up's share: at a / (1 + a) it would tie with the top
    expected = torch.maximum(q, a / (1 + a) + sc.floor).clamp(max=1 - sc.floor)
    torch.testing.assert_close(p.gather(1, top[:, None])[:, 0], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(p[mask].view(len(X), C - 1), (1 - expected)[:, None] * share,
                               atol=1e-6, rtol=1e-5)  # fmt: skip


def test_spline_lowers_the_top_label_ece_of_an_over_confident_model():
    from peg.metrics import ece

    sc = peg.SplineCalibration().fit(nn.Identity(), VAL)
    raw, calibrated = TEST[0].softmax(-1), sc.predict_proba(TEST[0])
    assert ece(calibrated, TEST[1]) < 0.5 * ece(raw, TEST[1])


# ---------------------------------------------------------------- ensemble temperature scaling
def test_ets_weights_are_the_nll_optimum_on_the_simplex():
    """The EM weights against scipy's SLSQP on the simplex (the reference code's optimiser),
    T fixed at temperature scaling's."""
    ets = peg.EnsembleTemperatureScaling().fit(nn.Identity(), VAL)
    ts = peg.TemperatureScaling().fit(nn.Identity(), VAL)
    assert ets.temperature_ == ts.temperature_
    s, y = VAL[0].double().log_softmax(-1), VAL[1]
    parts = torch.stack([(s / ets.temperature_).softmax(-1), s.softmax(-1),
                         torch.full_like(s, 1 / C)])  # fmt: skip
    true = parts.gather(2, y[None, :, None].expand(3, -1, 1))[..., 0].T.numpy()

    def loss(w: np.ndarray) -> float:
        return float(-np.log(true @ w).mean())

    simplex = {"type": "eq", "fun": lambda w: w.sum() - 1}
    best = minimize(loss, np.full(3, 1 / 3), method="SLSQP", bounds=[(0, 1)] * 3,
                    constraints=simplex, tol=1e-12)  # fmt: skip
    w = ets.weights_.numpy()
    assert w.min() >= 0 and abs(w.sum() - 1) < 1e-12
    assert loss(w) <= best.fun + 1e-7
    assert nll(ets.predict_proba(VAL[0]), y) <= nll(ts.predict_proba(VAL[0]), y) + 1e-9


def test_ets_keeps_the_class_and_a_finite_nll_on_saturated_logits():
    ets = peg.EnsembleTemperatureScaling().fit(nn.Identity(), VAL)
    huge = TEST[0] * 1e4  # float64 softmax saturates: exact 0s and 1s
    p = ets.predict_proba(huge)
    assert torch.equal(p.argmax(-1), huge.argmax(-1))
    if ets.weights_[2] > 0:
        assert np.isfinite(nll(p, TEST[1]))


# ---------------------------------------------------------------- order-preserving scaling
def test_the_newton_gradient_and_hessian_are_autograds():
    torch.manual_seed(0)
    s, y = torch.randn(40, 5, dtype=torch.float64) * 3, torch.randint(0, 5, (40,))
    knots = _monotone.place_knots(s, 6)
    beta = torch.rand(len(knots) + 1, dtype=torch.float64) + 0.5
    idx, offset = _monotone.pieces(s, knots)
    widths = _monotone._widths(knots)
    b = beta.clone().requires_grad_(True)
    g = _monotone.evaluate(idx, offset, knots, b)
    loss = (torch.logsumexp(g, -1) - g.gather(1, y[:, None])[:, 0]).mean()
    (grad,) = torch.autograd.grad(loss, b, create_graph=True)
    rows = [torch.autograd.grad(grad[i], b, retain_graph=True)[0] for i in range(len(b))]
    hess = torch.stack(rows)
    p = g.detach().softmax(-1)
    mean, second = _monotone._moments(p, idx, offset, widths)
    true = _monotone._label_features(idx.gather(1, y[:, None])[:, 0],
                                     offset.gather(1, y[:, None])[:, 0], widths)  # fmt: skip
    torch.testing.assert_close((mean - true).mean(0), grad.detach())
    torch.testing.assert_close((second - mean[:, :, None] * mean[:, None, :]).mean(0), hess)


def test_order_preserving_is_monotone_keeps_the_order_and_contains_ts():
    op = peg.OrderPreservingScaling(reg=0.0).fit(nn.Identity(), VAL)
    ts = peg.TemperatureScaling().fit(nn.Identity(), VAL)
    assert op.scores_ == "logits" and bool((op.slopes_ > 0).all())
    mapped = op.member_logits(TEST[0])[0]
    assert torch.equal(mapped.argsort(-1), TEST[0].float().argsort(-1))
    # from TS, Newton only descends: the fitted validation NLL is never above TS's
    assert nll(op.predict_proba(VAL[0]), VAL[1]) <= nll(ts.predict_proba(VAL[0]), VAL[1]) + 1e-9
    stiff = peg.OrderPreservingScaling(reg=1e8).fit(nn.Identity(), VAL)  # one slope: TS
    torch.testing.assert_close(stiff.slopes_, torch.full_like(stiff.slopes_, 1 / ts.temperature_),
                               rtol=1e-3, atol=0)  # fmt: skip
    torch.testing.assert_close(stiff.predict_proba(TEST[0]), ts.predict_proba(TEST[0]),
                               atol=2e-3, rtol=0)  # fmt: skip


def test_order_preserving_undoes_a_monotone_distortion_better_than_ts():
    """Logits h(z*) with one monotone h for every class: held-out NLL below TS's beyond twice
    the paired SE (measured: benchmarks/new_calibrators.py, "distorted")."""
    op = peg.OrderPreservingScaling().fit(nn.Identity(), VAL)
    ts = peg.TemperatureScaling().fit(nn.Identity(), VAL)
    X, y = TEST
    d = (-op.predict_proba(X).double().log() + ts.predict_proba(X).double().log()).gather(
        1, y[:, None]
    )[:, 0]
    assert float(d.mean()) < -2 * float(d.std() / len(d) ** 0.5)


@pytest.mark.parametrize("cls", [peg.SplineCalibration, peg.EnsembleTemperatureScaling,
                                 peg.OrderPreservingScaling])  # fmt: skip
def test_a_map_of_saturated_logits_has_a_finite_nll(cls):
    fitted = cls().fit(nn.Identity(), (VAL[0] * 50, VAL[1]))
    assert np.isfinite(peg.evaluate(fitted, TEST[0] * 50, TEST[1])["nll"])


TAMPERED = [
    (peg.SplineCalibration, "calibrated", lambda t: t * 2, "probabilities in"),
    (peg.SplineCalibration, "confidences", lambda t: t.flip(0), "must be sorted"),
    (peg.EnsembleTemperatureScaling, "weights", lambda t: t * 2, "summing to 1"),
    (peg.EnsembleTemperatureScaling, "weights", lambda t: t[:2], "has shape"),
    (peg.OrderPreservingScaling, "slopes", lambda t: -t, "finite and > 0"),
    (peg.OrderPreservingScaling, "slopes", lambda t: t * float("inf"), "'slopes' holds inf"),
    (peg.OrderPreservingScaling, "knots", lambda t: t.flip(0), "increasing"),
]


@pytest.mark.parametrize(("cls", "name", "change", "message"), TAMPERED,
                         ids=[f"{c.__name__}-{n}-{m}" for c, n, _, m in TAMPERED])  # fmt: skip
def test_a_tampered_map_is_an_archive_error(cls, name, change, message, tmp_path):
    """What `peg.load` reads is untrusted: each map's arrays are checked for shape, order,
    range and finiteness before use."""
    fitted = cls().fit(nn.Identity(), VAL)
    tensors = dict(fitted._tensors())
    tensors[name] = change(tensors[name])
    meta = {"inputs": "logits", "calibration": fitted._archived()}
    path = peg.archive.write(tmp_path / "map.peg", {}, {}, meta, "Identity", tensors)
    with pytest.raises(peg.ArchiveError, match=message):
        peg.load(path)


# ---------------------------------------------------------------- any predictor, streamed
NEW = [peg.SplineCalibration, peg.EnsembleTemperatureScaling, peg.OrderPreservingScaling]


def _three() -> peg.Ensemble:
    """Three linear members over the saved logits (an ensemble: no single logits)."""
    members = []
    for s in range(3):
        g = torch.Generator().manual_seed(s)
        linear = nn.Linear(C, C)
        with torch.no_grad():
            linear.weight.copy_(torch.eye(C) + 0.1 * torch.randn(C, C, generator=g))
            linear.bias.zero_()
        members.append(linear.eval())
    return peg.Ensemble.from_models(members, meta={"method": "three"})


@pytest.mark.parametrize("cls", NEW, ids=[c.__name__ for c in NEW])
def test_on_an_ensemble_streamed_saved_and_loaded(cls, tmp_path):
    """On an ensemble (log p̄), fitted from a loader as from tensors, predicting batch by batch
    as whole, and saved with the members: `peg.load(path, model)` gives the same map."""
    ensemble = _three()
    fitted = cls().fit(ensemble, VAL)
    assert fitted.scores_ == "log_probs" and fitted.meta_["predictor"] == {"method": "three"}
    assert peg.evaluate(fitted, *TEST)["error"] == peg.evaluate(ensemble, *TEST)["error"]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*VAL), batch_size=300)
    streamed = cls().fit(ensemble, loader)
    torch.testing.assert_close(streamed.member_logits(TEST[0]), fitted.member_logits(TEST[0]),
                               atol=1e-5, rtol=0)  # fmt: skip
    whole = fitted.member_logits(TEST[0], batch_size=256)
    parts = torch.cat(list(fitted.iter_member_logits(TEST[0], batch_size=256)), dim=1)
    torch.testing.assert_close(parts, whole, atol=1e-5, rtol=0)
    loaded = peg.load(fitted.save(tmp_path / "map.peg"), nn.Linear(C, C))
    assert loaded.meta_ == fitted.meta_
    assert torch.equal(loaded.member_logits(TEST[0]), whole)
