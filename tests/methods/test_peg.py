"""PEG: Algorithm 1 exactly, Algorithm 2, the unbiased variant, η selection, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import peg
from peg.methods.perturbation import _scale_search as search_module
from peg.methods.perturbation.peg import draw_batch
from peg.source import Source
from peg.streams import MEMBER, generator

from conftest import mlp, moons


def test_eta_zero_reproduces_the_base_exactly(overfit_mlp, moons_data):
    X, _ = moons_data["test"]
    p = peg.PEG(n_members=4, grad_batch_size=32, eta=0.1).fit(overfit_mlp, moons_data["val"])
    at_zero = p.ensemble_at(0.0)
    theta = overfit_mlp.state_dict()
    for m in range(4):  # θ + 0·D is θ, bit for bit
        state = at_zero.member_state(m)
        assert state.keys() == theta.keys()
        assert all(torch.equal(state[k], theta[k]) for k in theta)
    # The logits are another computation than the base's own forward (4 members folded into one
    # batch, 512-row batches), whose kernels and summation order depend on the CPU: equal up to
    # float32 rounding of sums of terms up to ~400 here (400 · 2⁻²⁴ ≈ 2.4e-5), not bit for bit.
    logits = at_zero.member_logits(X)
    with torch.no_grad():
        base = overfit_mlp(X)
    for m in range(4):
        torch.testing.assert_close(logits[m], base, rtol=1e-5, atol=1e-4)


def test_members_differ_for_positive_eta(overfit_mlp, moons_data):
    p = peg.PEG(n_members=5, grad_batch_size=32, eta=0.1).fit(overfit_mlp, moons_data["val"])
    w = p.ensemble_.stacked["2.weight"]
    assert w.shape[0] == 5
    assert all(not torch.equal(w[i], w[j]) for i in range(5) for j in range(i + 1, 5))


def test_same_seed_same_members_other_seed_other_members(overfit_mlp, moons_data):
    a = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, seed=7).fit(
        overfit_mlp, moons_data["val"]
    )
    b = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, seed=7).fit(
        overfit_mlp, moons_data["val"]
    )
    c = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, seed=8).fit(
        overfit_mlp, moons_data["val"]
    )
    for k in a.ensemble_.stacked:
        assert torch.equal(a.ensemble_.stacked[k], b.ensemble_.stacked[k])
    assert not torch.equal(a.ensemble_.stacked["0.weight"], c.ensemble_.stacked["0.weight"])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_every_member_is_one_sgd_step_from_theta(overfit_mlp, moons_data, reduction):
    """Restart, never chaining: member i = θ − η∇L(θ; Bᵢ), checked against torch.optim.SGD."""
    X, y = moons_data["val"]
    eta, K, S = 0.05, 32, 4
    p = peg.PEG(n_members=S, grad_batch_size=K, eta=eta, seed=3, reduction=reduction).fit(
        overfit_mlp, (X, y)
    )
    for i in range(S):
        idx = draw_batch(generator(3, MEMBER, 0, i), len(X), K)
        ref = mlp(1)
        ref.load_state_dict(overfit_mlp.state_dict())
        opt = torch.optim.SGD(ref.parameters(), lr=eta)
        nn.functional.cross_entropy(ref(X[idx]), y[idx], reduction=reduction).backward()
        opt.step()
        member = p.ensemble_.member_state(i)
        for k, v in ref.state_dict().items():
            torch.testing.assert_close(member[k], v, rtol=1e-5, atol=1e-6)


def test_the_ascent_step_is_the_descent_step_negated(overfit_mlp, moons_data, tmp_path):
    """direction="ascent" (Algorithm 1 read literally): θ + η∇L(θ; Bᵢ), the same mini-batches;
    recorded in the metadata and the recipe, which rebuilds it."""
    val = moons_data["val"]
    options = {"n_members": 4, "grad_batch_size": 32, "eta": 0.05, "seed": 3}
    down = peg.PEG(**options).fit(overfit_mlp, val)
    up = peg.PEG(**options, direction="ascent").fit(overfit_mlp, val)
    # the same gradients on the same mini-batches, negated: the same bits
    torch.testing.assert_close(up.directions_[0], -down.directions_[0], rtol=0, atol=0)
    assert up.meta_["direction"] == "ascent" and down.meta_["direction"] == "descent"
    theta = overfit_mlp.state_dict()["0.weight"]
    step = up.ensemble_.member_state(0)["0.weight"] - theta
    torch.testing.assert_close(step, theta - down.ensemble_.member_state(0)["0.weight"])
    up.save(tmp_path / "up")
    loaded = peg.load(tmp_path / "up", overfit_mlp, val=val)
    assert loaded.meta["direction"] == "ascent"
    torch.testing.assert_close(loaded.member_logits(val[0]), up.member_logits(val[0]))
    searched = peg.PEG(**{**options, "eta": "search"}, direction="ascent").fit(overfit_mlp, val)
    assert 1 <= len(searched.search_) <= 3  # the search runs on the ascent members


def test_gradient_reuse_equals_members_built_one_at_a_time(overfit_mlp, moons_data):
    searched = peg.PEG(
        n_members=4, grad_batch_size=32, eta=[0.01, 0.1, 1.0], search=peg.ScaleSearch(holdout=0.0)
    ).fit(overfit_mlp, moons_data["val"])
    assert searched.eta_ in (0.01, 0.1, 1.0) and len(searched.search_) == 3
    direct = peg.PEG(n_members=4, grad_batch_size=32, eta=searched.eta_).fit(
        overfit_mlp, moons_data["val"]
    )
    for k, v in direct.ensemble_.stacked.items():
        torch.testing.assert_close(searched.ensemble_.stacked[k], v)


@pytest.mark.parametrize("search", ["surrogate", "golden"])
def test_eta_search_holds_out_half_the_validation_set(overfit_mlp, moons_data, search):
    p = peg.PEG(n_members=3, grad_batch_size=32, eta="search", search=search)
    p.fit(overfit_mlp, moons_data["val"])
    points = p.ensemble_.meta["validation_points"]
    assert points == {"total": 600, "directions": 300, "scoring": 300}
    assert p.search_[p.eta_] == min(p.search_.values())
    assert p.meta_["search"] == search
    if search == "surrogate":  # the grid's lowest η first, then at most two more
        assert 0.001 in p.search_ and 1 <= len(p.search_) <= 3 and p.search_predicted_
        return
    assert {0.001, 0.01, 0.1, 1.0} <= set(p.search_)
    assert len(p.search_) > 4  # golden-section refinement evaluated more points
    assert p.search_[p.eta_] == min(p.search_.values())


def test_algorithm_2_builds_q_times_r_members(moons_data):
    bases = [mlp(s).eval() for s in range(3)]
    p = peg.PEG(n_members=5, grad_batch_size=32, eta=0.1).fit(bases, moons_data["val"])
    assert len(p) == 15
    assert p.member_logits(moons_data["test"][0]).shape == (15, 1000, 2)
    # members 0-4 come from base 0, 5-9 from base 1: each close to its own base
    for r in range(3):
        for i in range(5):
            w = p.ensemble_.member_state(5 * r + i)["0.weight"]
            dist = [float((w - b.state_dict()["0.weight"]).norm()) for b in bases]
            assert min(range(3), key=dist.__getitem__) == r
    # an Ensemble works as input too
    ens = peg.Ensemble.from_models(bases)
    q = peg.PEG(n_members=2, grad_batch_size=32, eta=0.1).fit(ens, moons_data["val"])
    assert len(q) == 6


def test_unbiased_mean_displacement_is_zero_vanilla_is_not(overfit_mlp, moons_data):
    """Claim 1(1): E[θᵢ − θ] = 0 for the unbiased update; vanilla drifts by −η∇L(V)."""
    S = 400
    theta = torch.cat([p.detach().reshape(-1) for p in overfit_mlp.parameters()])

    def z2(variant: str) -> float:
        p = peg.PEG(n_members=S, grad_batch_size=32, eta=0.1, variant=variant, seed=1).fit(
            overfit_mlp, moons_data["val"]
        )
        disp = p.directions_[0] * 0.1  # θᵢ − θ, [S, P]
        member0 = torch.cat([p.ensemble_.member_state(0)[n].reshape(-1) for n in p.param_names_])
        torch.testing.assert_close(member0 - theta, disp[0], rtol=1e-4, atol=1e-6)
        moving = disp.std(0) > 0  # dead ReLU units never move
        mean, se = disp[:, moving].mean(0), disp[:, moving].std(0) / math.sqrt(S)
        return float(((mean / se) ** 2).mean())  # ≈ 1 when the mean displacement is 0

    unbiased, vanilla = z2("unbiased"), z2("vanilla")
    assert unbiased < 4.0, unbiased  # seeds 0-3 gave 0.15-1.6
    assert vanilla > 15.0, vanilla  # seeds 0-3 gave 29-38


def test_unbiased_momentum_options(overfit_mlp, moons_data):
    zero = {n: torch.zeros_like(p) for n, p in overfit_mlp.named_parameters()}
    a = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, variant="unbiased", momentum="none").fit(
        overfit_mlp, moons_data["val"]
    )
    b = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, variant="unbiased", momentum=zero).fit(
        overfit_mlp, moons_data["val"]
    )
    c = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, variant="unbiased").fit(
        overfit_mlp, moons_data["val"]
    )
    torch.testing.assert_close(a.directions_[0], b.directions_[0])
    assert not torch.allclose(a.directions_[0], c.directions_[0])
    assert a.ensemble_.meta["variant"] == "unbiased"


def test_peg_lowers_test_nll_of_an_overfit_mlp(overfit_mlp, moons_data):
    X, y = moons_data["test"]
    p = peg.PEG(n_members=15, grad_batch_size=64, eta="search", seed=0).fit(
        overfit_mlp, moons_data["val"]
    )
    base = peg.evaluate(overfit_mlp, X, y)
    ens = peg.evaluate(p, X, y)
    assert ens["nll"] < 0.9 * base["nll"], (base, ens, p.eta_)


@pytest.mark.parametrize("bn", ["eval", "batch", "refresh"])
def test_batchnorm_modes(bn_net, bn, moons_data):
    X = torch.randn(300, 2)
    y = torch.randint(0, 3, (300,))
    before = {k: v.clone() for k, v in bn_net.state_dict().items()}
    kwargs = {"bn_data": torch.randn(256, 2) * 2} if bn == "refresh" else {}
    p = peg.PEG(n_members=3, grad_batch_size=32, eta=0.5, bn=bn).fit(bn_net, (X, y), **kwargs)
    for k, v in bn_net.state_dict().items():  # the caller's model is untouched
        assert torch.equal(v, before[k]), k
    assert not bn_net.training
    running = "body.1.running_mean"
    if bn == "refresh":
        assert running in p.ensemble_.stacked  # re-estimated per member
    else:
        assert torch.equal(p.ensemble_.shared[running], before[running])
    assert p.member_logits(X).shape == (3, 300, 3)


def test_bn_modes_change_the_gradient(bn_net):
    X, y = torch.randn(300, 2), torch.randint(0, 3, (300,))
    a = peg.PEG(n_members=2, grad_batch_size=32, eta=0.5, bn="eval").fit(bn_net, (X, y))
    b = peg.PEG(n_members=2, grad_batch_size=32, eta=0.5, bn="batch").fit(bn_net, (X, y))
    assert not torch.allclose(a.directions_[0], b.directions_[0])


def test_dataloader_validation_input(overfit_mlp, moons_data):
    X, y = moons_data["val"]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=50)
    a = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1).fit(overfit_mlp, loader)
    b = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1).fit(overfit_mlp, (X, y))
    torch.testing.assert_close(a.directions_[0], b.directions_[0])
    Xt = moons_data["test"][0]
    test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(Xt), batch_size=64)
    # the tensor in the loader's 64-row batches: the same computation (other batch boundaries
    # can change the last bits of the logits, depending on the CPU's kernels)
    torch.testing.assert_close(a.predict_proba(test_loader), a.predict_proba(Xt, 64))


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_members": 0}, "n_members"),
        ({"n_members": 2.5}, "n_members"),
        ({"eta": 0.0}, "eta"),
        ({"eta": -1.0}, "eta"),
        ({"eta": [0.1, -0.1]}, "eta"),
        ({"eta": "grid"}, "eta"),
        ({"eta": float("nan")}, "eta"),
        ({"batch_size": 0}, "batch_size"),
        ({"variant": "biased"}, "variant"),
        ({"reduction": "max"}, "reduction"),
        ({"bn": "train"}, "bn"),
        ({"search": "exhaustive"}, "search"),
        ({"beta": 1.0}, "beta"),
        ({"momentum": "adam"}, "momentum"),
        ({"params": "biases"}, "params"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        peg.PEG(**kwargs)


def test_bad_validation_data(overfit_mlp):
    X, y = moons(100, 5)
    with pytest.raises(ValueError, match="val.*empty"):
        peg.PEG(n_members=2, eta=0.1).fit(overfit_mlp, (X[:0], y[:0]))
    with pytest.raises(ValueError, match="val: 100 points.*at least 128"):
        peg.PEG(n_members=2, eta=0.1).fit(overfit_mlp, (X, y))
    with pytest.raises(ValueError, match="val: 50 points after holding out 50%"):
        peg.PEG(n_members=2, grad_batch_size=64, eta="search").fit(overfit_mlp, (X, y))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\).*max 2"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(overfit_mlp, (X, y + 1))
    with pytest.raises(ValueError, match="100 inputs but 99 labels"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(overfit_mlp, (X, y[:99]))
    with pytest.raises(ValueError, match="val: labels are needed"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(overfit_mlp, X)
    with pytest.raises(TypeError, match="val: expected a tuple"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(overfit_mlp, "data.csv")


def test_bad_models(moons_data):
    val = moons_data["val"]

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x), x

    with pytest.raises(TypeError, match="must return a Tensor of logits"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(Pair(), val)
    with pytest.raises(ValueError, match=r"logits \[B, C\], got shape \(2,\)"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            nn.Sequential(nn.Linear(2, 1), nn.Flatten(0)), val
        )
    frozen = mlp(0).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(frozen, val)
    with pytest.raises(TypeError, match="model: expected an nn.Module"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit("resnet", val)
    with pytest.raises(ValueError, match="bn_data"):
        peg.PEG(n_members=2, grad_batch_size=8, eta=0.1, bn="refresh").fit(mlp(0), val)


def test_non_finite_loss_names_the_member(overfit_mlp):
    X, y = moons(200, 3)
    X[17] = 3e38  # finite, but the logits overflow: the loss of a batch holding it is nan
    with pytest.raises(peg.NonFiniteError, match=r"member \d+ \(base model 0\): the loss is nan"):
        peg.PEG(n_members=30, grad_batch_size=32, eta=0.1).fit(overfit_mlp, (X, y))


def test_not_fitted():
    with pytest.raises(peg.NotFittedError):
        peg.PEG().predict_proba(torch.zeros(3, 2))


def test_a_diverging_member_is_named_or_dropped(overfit_mlp, moons_data):
    X, y = moons_data["val"]
    calls = {"n": 0}

    def loss(out, target):
        calls["n"] += 1
        losses = torch.nn.functional.cross_entropy(out, target, reduction="none")
        return losses * float("nan") if calls["n"] == 2 else losses  # member 1 diverges

    with pytest.raises(peg.NonFiniteError, match="member 1"):
        peg.PEG(n_members=4, grad_batch_size=32, eta=0.1, loss=loss).fit(overfit_mlp, (X, y))
    calls["n"] = 0
    p = peg.PEG(n_members=4, grad_batch_size=32, eta=0.1, loss=loss, on_nonfinite="drop").fit(
        overfit_mlp, (X, y)
    )
    assert p.dropped_ == [1] and len(p) == 3
    assert p.ensemble().meta["dropped"] == [1]
    assert torch.isfinite(p.member_logits(moons_data["test"][0])).all()
    with pytest.raises(ValueError, match="on_nonfinite"):
        peg.PEG(on_nonfinite="ignore")


def test_a_model_in_training_mode_gets_a_warning_and_is_left_alone(bn_net, moons_data):
    X, y = moons_data["val"]
    bn_net.train()
    with pytest.warns(UserWarning, match="training mode"):
        p = peg.PEG(n_members=2, grad_batch_size=32, eta=0.1).fit(bn_net, (X, y % 3))
    assert bn_net.training  # not switched behind the caller's back
    assert torch.isfinite(p.member_logits(X)).all()


def test_early_stopped_eta_search_picks_the_exhaustive_eta(overfit_mlp, moons_data):
    options = {"n_members": 4, "grad_batch_size": 32, "eta": "search"}
    fast = peg.PEG(**options, batch_size=32, search=peg.ScaleSearch(method="golden", race=0))
    fast.fit(overfit_mlp, moons_data["val"])
    every = peg.ScaleSearch(method="golden", race=0, early_stop=False)
    full = peg.PEG(**options, batch_size=32, search=every)
    full.fit(overfit_mlp, moons_data["val"])
    assert fast.eta_ == full.eta_ and fast.search_.keys() == full.search_.keys()
    assert fast.search_stopped_ and not full.search_stopped_
    for eta, value in fast.search_.items():
        if eta in fast.search_stopped_:  # a lower bound, above the best
            assert fast.search_[fast.eta_] < value <= full.search_[eta]
        else:
            assert value == full.search_[eta]


def test_whole_set_criteria_are_scored_as_themselves(overfit_mlp, moons_data):
    """ECE is not a mean of per-point losses: scored in one piece, its values are ECEs."""
    X, y = moons_data["val"]
    p = peg.PEG(
        n_members=4,
        grad_batch_size=32,
        eta=[0.01, 0.1],
        search=peg.ScaleSearch(criterion="ece", holdout=0.0),
    )
    p.fit(overfit_mlp, (X, y))
    # The search scored the points in its own (seeded) order, batch_size rows at a time: the same
    # computation here, since logits of other batches may differ in the last bits on another CPU,
    # which moves an ECE by ~1e-7 (or a whole bin's gap when a confidence crosses an edge).
    _, score = p._split(Source((X, y)).rows())  # the scoring points' indices
    Xs, ys = X[score], y[score]
    assert len(Xs) == len(X)  # holdout=0: every point scores
    for eta, value in p.search_.items():
        logits = p.ensemble_at(eta).member_logits(Xs, p.batch_size, progress=False)
        expected = peg.metrics.ece(logits, ys)
        assert value == pytest.approx(expected, abs=1e-9) and 0.0 <= value <= 1.0


@pytest.mark.parametrize("criterion", ["nll", "brier"])
def test_a_raced_eta_search_picks_the_exhaustive_eta_on_fewer_points(
    overfit_mlp, moons_data, monkeypatch, criterion
):
    monkeypatch.setattr(search_module, "RACE_FIRST", 32)  # 300 scoring points: looks at 32, 64, ...
    options = {"n_members": 4, "grad_batch_size": 32, "eta": "search"}
    raced_search = peg.ScaleSearch(method="golden", criterion=criterion)
    raced = peg.PEG(**options, search=raced_search).fit(overfit_mlp, moons_data["val"])
    every = raced_search.set_params(race=0, early_stop=False)
    full = peg.PEG(**options, search=every).fit(overfit_mlp, moons_data["val"])
    assert raced.eta_ == full.eta_ and raced.search_.keys() == full.search_.keys()
    n = full.ensemble_.meta["validation_points"]["scoring"]
    assert set(full.search_points_.values()) == {n} and not full.search_stopped_
    assert raced.search_stopped_ == [e for e, k in raced.search_points_.items() if k < n]
    assert sum(raced.search_points_.values()) < n * len(full.search_)  # some settled early
    best = raced.search_[raced.eta_]
    assert all(value >= best for value in raced.search_.values())
    assert raced.ensemble_.meta["search_points"] == {
        f"{e:.6g}": k for e, k in raced.search_points_.items()
    }


def test_the_surrogate_search_scores_a_prefix_of_the_scoring_points(overfit_mlp, moons_data):
    options = {"n_members": 4, "grad_batch_size": 32, "eta": "search", "progress": False}
    options["search"] = peg.ScaleSearch(exact_points=40)
    fitted = peg.PEG(**options).fit(overfit_mlp, moons_data["val"])
    n = fitted.meta_["validation_points"]["scoring"]
    assert n > 40 and set(fitted.search_points_.values()) == {40}
    assert fitted.search_stopped_ == list(fitted.search_)  # every scale on fewer than all
    _, score = fitted._split(Source(moons_data["val"]).rows())
    Xs, ys = (t[score[:40]] for t in moons_data["val"])
    for eta, value in fitted.search_.items():  # scored on exactly those 40 points
        expected = peg.metrics.nll(fitted.ensemble_at(eta).member_logits(Xs), ys)
        assert value == pytest.approx(float(expected), rel=1e-6)
