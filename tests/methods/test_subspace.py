"""Subspace samplers around one solution (Fort et al. §4.2)."""

from __future__ import annotations

import math

import pytest
import torch

from peg.ensemble import Ensemble
from peg.methods.trained.subspace import (
    DiagonalGaussian,
    DropoutSubspace,
    LowRankGaussian,
    RandomSubspace,
    flatten_state,
    unflatten_state,
)

from conftest import mlp


def names_of(model: torch.nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def member_vectors(fitted, names: list[str]) -> torch.Tensor:
    """Flat sampled parameters of every member, `[S, P]` (float64)."""
    ens = fitted.ensemble()
    return torch.stack(
        [flatten_state(ens.member_state(i), names).double() for i in range(len(ens))]
    )


def trajectory(model: torch.nn.Module, K: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """K fake checkpoints: the model's state plus independent noise of per-entry spread."""
    g = torch.Generator().manual_seed(seed)
    base = model.state_dict()
    out = []
    for _ in range(K):
        state = {}
        for k, v in base.items():
            if v.is_floating_point():
                spread = 0.05 * (1 + torch.arange(v.numel()).view(v.shape) % 3)
                state[k] = v + spread * torch.randn(v.shape, generator=g)
            else:
                state[k] = v.clone()
        out.append(state)
    return out


# ---------------------------------------------------------------- flat vectors
def test_flatten_roundtrip(bn_net):
    state = bn_net.state_dict()
    names = names_of(bn_net)
    vector = flatten_state(state, names)
    assert vector.shape == (sum(p.numel() for p in bn_net.parameters()),)
    back = unflatten_state(vector * 2, state, names)
    for k, v in state.items():
        torch.testing.assert_close(back[k], v * 2 if k in names else v)
    with pytest.raises(ValueError, match="vector"):
        unflatten_state(vector[:-1], state, names)


# ---------------------------------------------------------------- random subspace
def test_random_subspace_shapes_and_probabilities(overfit_mlp, moons_data):
    rs = RandomSubspace(n_members=6, radius=0.05).fit(overfit_mlp)
    X = moons_data["test"][0]
    assert rs.member_logits(X).shape == (6, 1000, 2) and len(rs) == 6
    proba = rs.predict_proba(X)
    torch.testing.assert_close(proba.sum(-1), torch.ones(1000))
    meta = rs.ensemble().meta
    assert meta["method"] == "random_subspace" and meta["radius"] == 0.05 and meta["seed"] == 0


@pytest.mark.parametrize("relative", [True, False])
def test_random_subspace_distance_is_t(overfit_mlp, relative):
    names = names_of(overfit_mlp)
    theta0 = flatten_state(overfit_mlp.state_dict(), names).double()
    rs = RandomSubspace(n_members=8, radius=0.3, relative=relative, seed=2).fit(overfit_mlp)
    dist = (member_vectors(rs, names) - theta0).norm(dim=1)
    unit = float(theta0.norm()) if relative else 1.0
    assert rs.ts_.shape == (8,) and bool(((rs.ts_ > 0) & (rs.ts_ < 0.3)).all())
    torch.testing.assert_close(dist, rs.ts_ * unit, rtol=1e-5, atol=1e-5)
    assert rs.theta_norm_ == pytest.approx(float(theta0.norm()))


def test_random_subspace_seeded(overfit_mlp, moons_data):
    X = moons_data["test"][0][:100]
    a = RandomSubspace(n_members=4, seed=1).fit(overfit_mlp).member_logits(X)
    torch.manual_seed(99)  # the global RNG must not matter
    b = RandomSubspace(n_members=4, seed=1).fit(overfit_mlp).member_logits(X)
    c = RandomSubspace(n_members=4, seed=2).fit(overfit_mlp).member_logits(X)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_random_subspace_weights_only(overfit_mlp):
    rs = RandomSubspace(n_members=3, params="weights").fit(overfit_mlp)
    assert rs.param_names_ == ["0.weight", "2.weight"]
    assert torch.equal(rs.ensemble().shared["0.bias"], overfit_mlp.state_dict()["0.bias"])
    assert set(rs.ensemble().stacked) == {"0.weight", "2.weight"}


def test_min_accuracy_rejects_and_redraws(overfit_mlp, moons_data):
    X, y = moons_data["val"]
    rs = RandomSubspace(n_members=5, radius=1.0, min_accuracy=0.8, seed=0)
    rs.fit(overfit_mlp, val=(X, y))
    accuracy = (rs.member_logits(X).argmax(-1) == y).float().mean(1)
    assert bool((accuracy >= 0.8).all())
    assert rs.draws_ > 5  # radius 1·‖θ₀‖ is far: some draws were rejected
    with pytest.raises(ValueError, match="min_accuracy"):  # noisy moons: never 100 % accurate
        RandomSubspace(n_members=2, radius=1.0, min_accuracy=1.0).fit(overfit_mlp, val=(X, y))
    with pytest.raises(ValueError, match="val"):
        RandomSubspace(min_accuracy=0.5).fit(overfit_mlp)


# ---------------------------------------------------------------- dropout subspace
def test_dropout_subspace_zero_fraction():
    model = mlp(0, hidden=200)  # P = 1202 entries, none exactly zero
    names = names_of(model)
    theta0 = flatten_state(model.state_dict(), names).double()
    assert bool((theta0 != 0).all())
    ds = DropoutSubspace(n_members=8, keep=(0.3, 0.9), seed=1).fit(model)
    vectors = member_vectors(ds, names)
    assert ds.keeps_.shape == (8,) and bool(((ds.keeps_ >= 0.3) & (ds.keeps_ <= 0.9)).all())
    P = theta0.numel()
    for vector, keep in zip(vectors, ds.keeps_.tolist(), strict=True):
        zeroed = float((vector == 0).double().mean())
        se = math.sqrt(keep * (1 - keep) / P)
        assert abs(zeroed - (1 - keep)) < 5 * se
        kept = vector != 0
        torch.testing.assert_close(vector[kept], theta0[kept] / keep, rtol=1e-5, atol=1e-6)


def test_dropout_subspace_without_rescale_and_full_keep(overfit_mlp):
    names = names_of(overfit_mlp)
    theta0 = flatten_state(overfit_mlp.state_dict(), names).double()
    ds = DropoutSubspace(n_members=3, keep=0.5, rescale=False).fit(overfit_mlp)
    for vector in member_vectors(ds, names):
        kept = vector != 0
        assert torch.equal(vector[kept], theta0[kept])
    full = DropoutSubspace(n_members=2, keep=(1.0, 1.0)).fit(overfit_mlp)
    for vector in member_vectors(full, names):
        torch.testing.assert_close(vector, theta0)


# ---------------------------------------------------------------- BatchNorm
def test_bn_refresh_changes_running_stats(bn_net, moons_data):
    X = moons_data["train"][0]
    base = bn_net.state_dict()["body.1.running_mean"]
    kept = RandomSubspace(n_members=3, radius=0.3, bn="eval").fit(bn_net).ensemble()
    refreshed = RandomSubspace(n_members=3, radius=0.3, bn="refresh").fit(bn_net, bn_data=X)
    ens = refreshed.ensemble()
    for i in range(3):
        assert torch.equal(kept.member_state(i)["body.1.running_mean"], base)
        mean = ens.member_state(i)["body.1.running_mean"]
        assert not torch.allclose(mean, base, atol=1e-3)
        # the refreshed statistics are those of the member's first layer on the data
        with torch.no_grad():
            w, b = ens.member_state(i)["body.0.weight"], ens.member_state(i)["body.0.bias"]
            torch.testing.assert_close(mean, (X @ w.T + b).mean(0), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="bn_data"):
        RandomSubspace(bn="refresh").fit(bn_net)
    with pytest.raises(ValueError, match="bn_data"):
        DiagonalGaussian(bn="refresh").fit(trajectory(bn_net, 3), skeleton=bn_net)


# ---------------------------------------------------------------- diagonal Gaussian
def test_diagonal_gaussian_moments():
    model = mlp(0, hidden=3)  # P = 17
    states = trajectory(model, K=5)
    names = names_of(model)
    A = torch.stack([flatten_state(s, names).double() for s in states])
    dg = DiagonalGaussian(n_members=2000, seed=3).fit(states, skeleton=model)
    torch.testing.assert_close(dg.mean_.double(), A.mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dg.std_.double(), A.std(0, correction=1), rtol=1e-5, atol=1e-6)
    S = member_vectors(dg, names)
    n = S.shape[0]
    mu, sigma = A.mean(0), A.std(0, correction=1)
    z_mean = (S.mean(0) - mu) / (sigma / math.sqrt(n))
    z_std = (S.std(0) - sigma) / (sigma / math.sqrt(2 * n))
    assert float(z_mean.abs().max()) < 5 and float(z_std.abs().max()) < 5


def test_diagonal_gaussian_scale_and_buffers(bn_net):
    states = trajectory(bn_net, K=4)
    for i, s in enumerate(states):  # distinct BatchNorm statistics per checkpoint
        s["body.1.running_mean"] = s["body.1.running_mean"] + i
    dg = DiagonalGaussian(n_members=3, scale=0.5).fit(states, skeleton=bn_net)
    ens = dg.ensemble()
    for i in range(3):
        assert torch.equal(
            ens.member_state(i)["body.1.running_mean"], states[-1]["body.1.running_mean"]
        )
        assert torch.equal(
            ens.member_state(i)["body.1.num_batches_tracked"],
            states[-1]["body.1.num_batches_tracked"],
        )
    assert "running_mean" not in " ".join(dg.param_names_)
    assert ens.meta["method"] == "diagonal_gaussian" and ens.meta["scale"] == 0.5


@pytest.mark.parametrize(
    ("cls", "kwargs"), [(DiagonalGaussian, {}), (LowRankGaussian, {"rank": 2})]
)
def test_gaussians_accept_an_ensemble_and_are_seeded(cls, kwargs, moons_data):
    models = [mlp(i, hidden=5) for i in range(4)]
    ens = Ensemble.from_models(models)
    X = moons_data["test"][0][:50]
    a = cls(n_members=3, seed=1, **kwargs).fit(ens).member_logits(X)
    b = cls(n_members=3, seed=1, **kwargs).fit(models).member_logits(X)
    c = cls(n_members=3, seed=2, **kwargs).fit(ens)
    assert a.shape == (3, 50, 2)
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c.member_logits(X))
    torch.testing.assert_close(c.predict_proba(X).sum(-1), torch.ones(50))


# ---------------------------------------------------------------- low-rank Gaussian
def test_low_rank_gaussian_span_and_covariance():
    model = mlp(0, hidden=10)  # P = 52
    states = trajectory(model, K=6)
    names = names_of(model)
    A = torch.stack([flatten_state(s, names).double() for s in states])
    lr = LowRankGaussian(n_members=2000, rank=3, seed=0).fit(states, skeleton=model)
    V = lr.components_.double()
    assert V.shape == (3, A.shape[1]) and lr.rank_ == 3
    S = member_vectors(lr, names)
    # every sample lies in μ + span(components)
    Q, _ = torch.linalg.qr(V.T)
    centred = S - lr.mean_.double()
    residual = centred - (centred @ Q) @ Q.T
    assert float(residual.norm(dim=1).max()) < 1e-5
    # Σ vᵢvᵢᵀ is the top-3 truncation of the sample covariance (computed here the P×P way)
    cov = torch.cov(A.T)
    evals, evecs = torch.linalg.eigh(cov)
    top = evecs[:, -3:] @ torch.diag(evals[-3:]) @ evecs[:, -3:].T
    # components_ are float32: rounding each v_ki by 2⁻²⁴ moves (VᵀV)_ij by up to
    # 2⁻²³ Σ_k |v_ki v_kj| <= 2⁻²³ max|top| (Cauchy-Schwarz), whatever the data. A fixed atol of
    # 1e-9 left a margin of 2 on this CPU's draws only (LAPACK and the float32 normal sampler
    # differ between CPUs); scale atol to the covariance instead.
    torch.testing.assert_close(V.T @ V, top, rtol=1e-6, atol=1e-6 * float(top.abs().max()))
    # the samples' covariance approximates it (relative Frobenius error ~ √(2/n) per direction)
    err = (torch.cov(S.T) - top).norm() / top.norm()
    assert float(err) < 0.1


def test_low_rank_rank_clamped_with_warning():
    model = mlp(0, hidden=4)
    with pytest.warns(UserWarning, match="rank"):
        lr = LowRankGaussian(n_members=2, rank=10).fit(trajectory(model, K=4), skeleton=model)
    assert lr.rank_ == 3 and lr.components_.shape[0] == 3


def test_low_rank_scale_multiplies_spread():
    model = mlp(0, hidden=4)
    states = trajectory(model, K=5)
    names = names_of(model)
    one = LowRankGaussian(n_members=5, rank=2, seed=4).fit(states, skeleton=model)
    half = LowRankGaussian(n_members=5, rank=2, seed=4, scale=0.5).fit(states, skeleton=model)
    mu = one.mean_.double()
    torch.testing.assert_close(
        member_vectors(half, names) - mu,
        0.5 * (member_vectors(one, names) - mu),
        atol=1e-6,
        rtol=1e-4,
    )


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (RandomSubspace, {"n_members": 0}, "n_members"),
        (RandomSubspace, {"radius": 0}, "radius"),
        (RandomSubspace, {"radius": -1.0}, "radius"),
        (RandomSubspace, {"bn": "batch"}, "bn"),
        (RandomSubspace, {"params": "biases"}, "params"),
        (RandomSubspace, {"min_accuracy": 1.5}, "min_accuracy"),
        (DropoutSubspace, {"n_members": 0}, "n_members"),
        (DropoutSubspace, {"keep": (0.0, 0.5)}, "keep"),
        (DropoutSubspace, {"keep": (0.5, 1.2)}, "keep"),
        (DropoutSubspace, {"keep": (0.8, 0.5)}, "keep"),
        (DropoutSubspace, {"bn": "train"}, "bn"),
        (DiagonalGaussian, {"n_members": 0}, "n_members"),
        (DiagonalGaussian, {"scale": 0}, "scale"),
        (DiagonalGaussian, {"bn": "batch"}, "bn"),
        (LowRankGaussian, {"n_members": 0}, "n_members"),
        (LowRankGaussian, {"scale": -1.0}, "scale"),
        (LowRankGaussian, {"rank": 0}, "rank"),
        (LowRankGaussian, {"bn": None}, "bn"),
    ],
)
def test_bad_hyperparameters(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("cls", [DiagonalGaussian, LowRankGaussian])
def test_bad_iterates(cls):
    model = mlp(0, hidden=4)
    states = trajectory(model, K=3)
    with pytest.raises(ValueError, match="iterates"):
        cls().fit(states[:1], skeleton=model)
    missing = [dict(s) for s in states]
    del missing[1]["0.bias"]
    with pytest.raises(ValueError, match="iterates"):
        cls().fit(missing, skeleton=model)
    with pytest.raises(ValueError, match="iterates"):
        cls().fit([*states[:2], mlp(0, hidden=5).state_dict()], skeleton=model)
    with pytest.raises(ValueError, match="skeleton"):
        cls().fit(states)
    with pytest.raises(TypeError, match="iterates"):
        cls().fit(42)  # type: ignore[arg-type]
