"""peg.ConformalClassifier / peg.ConformalRegressor: the sets and intervals against literal
reference implementations of the papers' formulas (Angelopoulos & Bates 2021, Romano et al.
2020, Angelopoulos et al. 2021 "RAPS"), streaming, class-conditional quantiles, saving, the
metrics in `peg.evaluate`, and the bad input they refuse."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import peg
from bad_inputs import raises_test
from peg.errors import NotFittedError
from peg.methods.conformal._split import class_scores, conformal_quantile, quantile_rank
from peg.metrics import conformal as cm

from conftest import mlp, moons

X, Y = moons(400, 0, noise=0.4)
XC, YC, XT, YT = X[:200], Y[:200], X[200:], Y[200:]


def _model(classes: int = 2, seed: int = 0) -> nn.Module:
    return mlp(seed, hidden=8, classes=classes).eval()


def _probs(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(x).softmax(-1).double().numpy()


# ------------------------------------------------------------------ literal references
def ref_score(p: np.ndarray, c: int, score: str, u: float = 1.0, k_reg=1, lam=0.0) -> float:
    """The nonconformity score of class c for one row of probabilities, from the papers'
    formulas, one class at a time: the mass of the classes more probable than c, plus u·p̂_c
    (equal probabilities share a rank)."""
    if score == "lac":
        return 1.0 - p[c]
    above = [j for j in range(len(p)) if p[j] > p[c]]
    s = sum(p[j] for j in above) + u * p[c]
    if score == "raps":
        s += lam * max(0, len(above) + 1 - k_reg)
    return s


def ref_quantile(scores: list[float], alpha: float) -> float:
    n = len(scores)
    k = math.ceil((n + 1) * (1 - alpha) - 1e-12)
    return sorted(scores)[k - 1]


def test_quantile_rank_is_exact():
    assert quantile_rank(99, 0.45) == 55  # a float product gives 55.00000000000001
    assert quantile_rank(9, 0.3) == 7  # α as written (3/10), not its binary value
    assert quantile_rank(9, 0.1) == 9
    assert quantile_rank(1000, 0.05) == 951
    with pytest.raises(ValueError, match="too few"):
        quantile_rank(8, 0.1)
    s = torch.tensor([0.5, 0.1, 0.9, 0.3], dtype=torch.float64)
    assert conformal_quantile(s, 0.2) == 0.9  # k = ⌈5 · 0.8⌉ = 4
    assert conformal_quantile(s, 0.4) == 0.5  # k = 3


@pytest.mark.parametrize(
    ("score", "randomized", "lam"),
    [
        ("lac", False, 0.0),
        ("aps", False, 0.0),
        ("aps", True, 0.0),
        ("raps", False, 0.2),
        ("raps", True, 0.2),
    ],
)
def test_sets_match_the_literal_reference(score, randomized, lam):
    model = _model(3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(60, 2, generator=g), torch.randint(0, 3, (60,), generator=g)
    cp = peg.ConformalClassifier(
        alpha=0.2, score=score, randomized=randomized, lam=lam, k_reg=1, seed=5, batch_size=16
    ).fit(model, (x[:30], y[:30]))
    # the uniform draws the classifier used, in row order, from its documented streams
    u_cal = peg.streams.generator(5, 0) if randomized else None
    u_cal = torch.rand(30, generator=u_cal, dtype=torch.float64) if randomized else None
    u_test = torch.rand(30, generator=peg.streams.generator(5, 1), dtype=torch.float64)
    p_cal, p_test = _probs(model, x[:30]), _probs(model, x[30:])
    cal = [
        ref_score(p_cal[i], int(y[i]), score, 1.0 if u_cal is None else float(u_cal[i]), 1, lam)
        for i in range(30)
    ]
    q = ref_quantile(cal, 0.2)
    assert cp.quantile_ == pytest.approx(q, abs=1e-12)
    sets = cp.predict_set(x[30:])
    assert sets.dtype == torch.bool and sets.shape == (30, 3)
    for i in range(30):
        u = float(u_test[i]) if randomized else 1.0
        for c in range(3):
            s = ref_score(p_test[i], c, score, u, 1, lam)
            if abs(s - q) > 1e-9:  # away from the threshold: rounding cannot decide
                assert bool(sets[i, c]) == (s <= q), (i, c)


@pytest.mark.parametrize("score", ["aps", "raps"])
@pytest.mark.parametrize("scale", [0.0, 0.3, 3.0, 30.0])
def test_sets_ranking_only_candidates_equal_the_full_scores(score, scale):
    """`class_sets` (top-k of the classes that can be in a set) equals thresholding every
    class's score, ties (scale 0: uniform rows) and saturated rows included."""
    from peg.methods.conformal._split import class_sets, sets_from_scores

    g = torch.Generator().manual_seed(0)
    p = (scale * torch.randn(300, 20, generator=g)).softmax(-1).double()
    u = torch.rand(300, generator=g, dtype=torch.float64)
    for q in [0.05, 0.5, 0.9, 0.99, 1.2, torch.rand(20, generator=g, dtype=torch.float64)]:
        for draws in (None, u):
            full = sets_from_scores(class_scores(p, score, 2, 0.05, draws), q)
            assert torch.equal(class_sets(p, q, score, 2, 0.05, draws), full)


def test_randomized_aps_sets_are_nested_and_smaller():
    model = _model()
    plain = peg.ConformalClassifier(score="aps").fit(model, (XC, YC)).predict_set(XT)
    rand = peg.ConformalClassifier(score="aps", randomized=True).fit(model, (XC, YC))
    sets = rand.predict_set(XT)
    assert torch.equal(sets, rand.predict_set(XT))  # reproducible from the seed
    assert sets.sum() <= plain.sum() + 5


def test_scores_are_one_float_per_point_and_batches_agree():
    """The quantile is the same whatever the batching, from tensors, a Dataset or a loader,
    and a loader is read once."""

    class Counted(Dataset):
        def __init__(self) -> None:
            self.reads = 0

        def __len__(self) -> int:
            return len(XC)

        def __getitem__(self, i: int):
            self.reads += 1
            return XC[i], YC[i]

    model = _model()
    ref = peg.ConformalClassifier(score="aps").fit(model, (XC, YC)).quantile_
    data = Counted()
    for val in ((XC, YC), TensorDataset(XC, YC), DataLoader(data, batch_size=7)):
        cp = peg.ConformalClassifier(score="aps", batch_size=13).fit(model, val)
        assert cp.quantile_ == ref and cp.n_calib_ == len(XC)
    assert data.reads == len(XC)  # one pass


def test_class_conditional_quantiles_are_per_class():
    model = _model()
    cp = peg.ConformalClassifier(score="lac", class_conditional=True).fit(model, (XC, YC))
    p = torch.from_numpy(_probs(model, XC))
    s = class_scores(p, "lac").gather(1, YC[:, None])[:, 0]
    for c in range(2):
        assert float(cp.quantile_[c]) == conformal_quantile(s[torch.eq(YC, c)], 0.1)
    sets = cp.predict_set(XT)
    scores = class_scores(torch.from_numpy(_probs(model, XT)), "lac")
    assert torch.equal(sets, scores <= cp.quantile_)


def test_predict_proba_and_logits_pass_through():
    model = _model()
    ts = peg.TemperatureScaling().fit(model, (XC, YC))
    cp = peg.ConformalClassifier().fit(ts, (XC, YC))
    assert torch.equal(cp.predict_proba(XT), ts.predict_proba(XT))
    assert torch.equal(cp.member_logits(XT), ts.member_logits(XT))
    ens = peg.Ensemble.from_models([_model(seed=s) for s in range(3)])
    cp = peg.ConformalClassifier().fit(ens, (XC, YC))
    assert len(cp) == 3 and torch.equal(cp.predict_proba(XT), ens.predict_proba(XT))


@pytest.mark.parametrize("inner", [None, "temperature"])
@pytest.mark.parametrize("kwargs", [{"score": "aps"}, {"class_conditional": True, "alpha": 0.2}])
def test_saved_and_loaded(tmp_path, inner, kwargs):
    model = _model()
    predictor = model if inner is None else peg.TemperatureScaling().fit(model, (XC, YC))
    cp = peg.ConformalClassifier(**kwargs).fit(predictor, (XC, YC))
    back = peg.load(cp.save(tmp_path / "cp.safetensors"), _model(seed=9))
    assert type(back) is peg.ConformalClassifier and back.get_params() == cp.get_params()
    assert torch.equal(torch.as_tensor(back.quantile_), torch.as_tensor(cp.quantile_))
    assert torch.equal(back.predict_set(XT), cp.predict_set(XT))
    if inner is not None:
        assert type(back.predictor_) is peg.TemperatureScaling


def test_evaluate_selects_the_conformal_metrics():
    model = _model()
    cp = peg.ConformalClassifier(score="raps", randomized=True).fit(model, (XC, YC))
    out = peg.evaluate(cp, XT, YT, batch_size=32, metrics=["coverage", "nll", "set_size"])
    assert list(out) == ["coverage", "nll", "set_size"]
    sets = cp.predict_set(XT)
    assert out["coverage"] == cm.coverage(sets, YT)
    assert out["set_size"] == pytest.approx(cm.mean_size(sets))
    assert out["nll"] == pytest.approx(peg.evaluate(model, XT, YT)["nll"])
    loader = DataLoader(TensorDataset(XT, YT), batch_size=9)
    assert peg.evaluate(cp, loader, metrics="coverage")["coverage"] == out["coverage"]


def test_metrics_against_direct_counts():
    g = torch.Generator().manual_seed(0)
    sets = torch.rand(500, 4, generator=g) < 0.5
    y = torch.randint(0, 4, (500,), generator=g)
    hit = sets[torch.arange(500), y]
    assert cm.coverage(sets, y) == hit.double().mean().item()
    assert cm.mean_size(sets) == sets.sum(1).double().mean().item()
    per = [hit[y == c].double().mean().item() for c in range(4)]
    assert cm.class_coverage(sets, y).tolist() == pytest.approx(per)
    assert cm.worst_class_coverage(sets, y) == pytest.approx(min(per))
    strata = cm.size_stratified_coverage(sets, y)
    for k, (cov, count) in strata.items():
        at = sets.sum(1) == k
        assert count == int(at.sum()) and cov == pytest.approx(hit[at].double().mean().item())
    one = cm.conformal_metrics(sets, y)
    stream = cm.ConformalStream()
    for start in range(0, 500, 37):
        stream.update(sets[start : start + 37], y[start : start + 37])
    assert stream.compute() == pytest.approx(one)
    assert one["worst_size_coverage"] == pytest.approx(min(c for c, _ in strata.values()))
    iv = torch.stack([torch.zeros(5), torch.ones(5)], 1)
    t = torch.tensor([0.5, 1.0, -0.1, 2.0, 0.0])
    assert cm.coverage(iv, t) == 0.6 and cm.mean_size(iv) == 1.0


# ------------------------------------------------------------------ regression
def _gaussian_ensemble() -> peg.Ensemble:
    models = []
    for s in range(3):
        torch.manual_seed(s)
        models.append(nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)).eval())
    return peg.Ensemble.from_models(models)


def _targets(x: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return x[:, 0] + 0.3 * torch.randn(len(x), generator=g)


@pytest.mark.parametrize("score", ["absolute", "normalized"])
def test_intervals_match_the_reference(score, tmp_path):
    ens, t = _gaussian_ensemble(), _targets(X)
    cr = peg.ConformalRegressor(score=score, alpha=0.2, batch_size=50).fit(ens, (XC, t[:200]))
    with torch.no_grad():
        out = ens.member_logits(X).double()
    mu = out[..., 0].mean(0)
    var = (out[..., 1].exp() + out[..., 0] ** 2).mean(0) - mu**2  # the mixture's variance
    w = var.sqrt() if score == "normalized" else torch.ones_like(mu)
    q = ref_quantile(((t - mu).abs() / w)[:200].tolist(), 0.2)
    assert cr.quantile_ == pytest.approx(q, rel=1e-9)
    iv = cr.predict_interval(XT)
    assert iv.shape == (200, 2)
    expected = torch.stack([mu - q * w, mu + q * w], 1)[200:]
    torch.testing.assert_close(iv, expected, rtol=1e-9, atol=1e-9)
    back = peg.load(cr.save(tmp_path / "cr.safetensors"), _gaussian_ensemble().skeleton)
    assert type(back) is peg.ConformalRegressor and torch.equal(back.predict_interval(XT), iv)


# ------------------------------------------------------------------ bad input
class _NaNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        return torch.where(x[:, :1] == x[0, 0], float("nan"), out)  # the first row: NaN


class _NoLogits:
    def predict_proba(self, x):
        return torch.full((len(x), 2), 0.5)


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    (
        "conformal",
        "alpha outside (0, 1)",
        lambda: peg.ConformalClassifier(alpha=1.0),
        ValueError,
        r"alpha: expected a miscoverage level in \(0, 1\), got 1.0",
    ),
    (
        "conformal",
        "an unknown score",
        lambda: peg.ConformalClassifier(score="tps"),
        ValueError,
        r"score: expected one of \['lac', 'aps', 'raps'\]",
    ),
    (
        "conformal",
        "randomised LAC",
        lambda: peg.ConformalClassifier(randomized=True),
        ValueError,
        r"randomized: LAC has no randomised variant",
    ),
    (
        "conformal",
        "a negative RAPS penalty",
        lambda: peg.ConformalClassifier(lam=-1.0),
        ValueError,
        r"lam: expected a finite number >= 0",
    ),
    (
        "conformal",
        "too few calibration points for alpha",
        lambda: peg.ConformalClassifier(alpha=0.1).fit(_model(), (XC[:8], YC[:8])),
        ValueError,
        r"val: 8 calibration points are too few for alpha=0.1: .* n >= 1/alpha - 1 = 9",
    ),
    (
        "conformal",
        "labels outside the classes",
        lambda: peg.ConformalClassifier().fit(_model(), (XC, YC + 1)),
        ValueError,
        r"val labels: expected labels in \[0, 2\)",
    ),
    (
        "conformal",
        "a predictor without member_logits",
        lambda: peg.ConformalClassifier().fit(_NoLogits(), (XC, YC)),
        TypeError,
        r"predictor: expected an nn.Module or an object with member_logits",
    ),
    (
        "conformal",
        "NaN scores",
        lambda: peg.ConformalClassifier().fit(_NaNModel(), (XC, YC)),
        ValueError,
        r"val: the logits hold NaN or ±inf in 1 of 200 rows, the first in row 0 \(NaN\)",
    ),
    (
        "conformal",
        "predict_set before fit",
        lambda: peg.ConformalClassifier().predict_set(XT),
        NotFittedError,
        r"ConformalClassifier: call fit\(\.\.\.\) before predicting",
    ),
    (
        "conformal",
        "a class with too few points for class-conditional quantiles",
        lambda: peg.ConformalClassifier(class_conditional=True).fit(
            _model(), (XC[:40], torch.cat([torch.zeros(35), torch.ones(5)]).long())
        ),
        ValueError,
        r"val: class_conditional=True needs >= 9 calibration points per class .* "
        r"\(class 1: 5\)",
    ),
    (
        "conformal",
        "integer targets for regression",
        lambda: peg.ConformalRegressor().fit(_model(), (XC, YC)),
        ValueError,
        r"val: conformal regression needs float targets",
    ),
    (
        "conformal",
        "a regressor without Gaussian heads",
        lambda: peg.ConformalRegressor().fit(_model(3), (XC, XC[:, 0])),
        ValueError,
        r"predictor: conformal regression needs Gaussian head outputs \[M, B, 2\]",
    ),
    (
        "conformal",
        "evaluate's set metrics on a predictor without sets",
        lambda: peg.evaluate(_model(), XT, YT, metrics=["coverage"]),
        ValueError,
        r"metrics: \['coverage'\] are metrics of prediction sets",
    ),
    (
        "conformal",
        "sets of another shape than labels",
        lambda: cm.coverage(torch.ones(3, 2, dtype=torch.bool), torch.zeros(4)),
        ValueError,
        r"y: expected 3 labels \[N\]",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
