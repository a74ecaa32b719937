"""Preconditioned PEG (`precondition="kfac" | "diag"`): the step against a dense reference, the
limit of large damping, recipes, and bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import peg
from bad_inputs import raises_test
from peg.methods.peg import draw_batch
from peg.streams import VALIDATION, generator

K, VAL_BATCHES, SEED = 16, 3, 4


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4)).eval()


def _data(n: int = 120) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=g), torch.randint(0, 4, (n,), generator=g)


def _fit(**options: object) -> peg.PEG:
    base = dict(n_members=4, grad_batch_size=K, eta=0.1, seed=SEED, val_batches=VAL_BATCHES)
    return peg.PEG(**{**base, **options}, progress=False).fit(_net(), _data())  # type: ignore[arg-type]


def _curvature_points() -> torch.Tensor:
    """The points of the `val_batches` mini-batches the curvature is estimated on."""
    n = len(_data()[1])
    return torch.cat([draw_batch(generator(SEED, VALIDATION, 0, j), n, K) for j in range(3)])


def _dense_kfac(net: nn.Module, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A ⊗ G per layer, written out `[P, P]` in the row order (W row-major, then b), from
    per-point quantities computed one point at a time."""
    blocks = []
    for layer in (0, 2):
        a_rows, g_rows = [], []
        for x, t in zip(X, y, strict=True):
            h = x if layer == 0 else torch.tanh(net[0](x))
            net.zero_grad()
            nn.functional.cross_entropy(net(x[None]), t[None]).backward()
            a_rows.append(torch.cat([h.detach(), torch.ones(1)]))  # the bias's 1
            g_rows.append(net[layer].bias.grad.clone())  # ∂ℓ/∂output = ∂ℓ/∂b for one point
        a, g = torch.stack(a_rows), torch.stack(g_rows)
        A, G = a.T @ a / len(a), g.T @ g / len(g)
        out, d = G.shape[0], A.shape[0]
        F = torch.kron(G, A)  # index (o, i) ↦ o·d + i: [W | b] row-major
        order = [o * d + i for o in range(out) for i in range(d - 1)] + [
            o * d + d - 1 for o in range(out)
        ]
        blocks.append(F[order][:, order])
    return torch.block_diag(*blocks)


def test_kfac_step_matches_the_dense_kronecker_inverse() -> None:
    plain, pre = _fit(), _fit(precondition="kfac", damping=0.3)
    X, y = _data()
    F = _dense_kfac(_net(), *(t[_curvature_points()] for t in (X, y))).double()
    lam = 0.3 * F.trace() / F.shape[0]
    expected = (
        lam * torch.linalg.solve(F + lam * torch.eye(len(F)), plain.directions_[0].double().T).T
    )
    torch.testing.assert_close(pre.directions_[0].double(), expected, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(pre.directions_[0], plain.directions_[0], rtol=0.05)


def test_diag_step_matches_the_mean_squared_minibatch_gradient() -> None:
    plain, pre = _fit(), _fit(precondition="diag", damping=0.5)
    X, y = _data()
    net, squares = _net(), []
    for j in range(VAL_BATCHES):
        idx = draw_batch(generator(SEED, VALIDATION, 0, j), len(y), K)
        net.zero_grad()
        nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
        squares.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]) ** 2)
    F = torch.stack(squares).mean(0)
    lam = 0.5 * F.mean()
    torch.testing.assert_close(pre.directions_[0], plain.directions_[0] * lam / (F + lam))


@pytest.mark.parametrize("kind", ["kfac", "diag"])
def test_a_large_damping_recovers_plain_peg(kind: str) -> None:
    plain, pre = _fit(), _fit(precondition=kind, damping=1e7)
    torch.testing.assert_close(pre.directions_[0], plain.directions_[0], rtol=1e-5, atol=1e-6)


def test_kfac_on_a_conv_net_full_and_last_layer() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 5 * 5, 4)
    ).eval()
    X, y = torch.randn(96, 1, 5, 5), torch.randint(0, 4, (96,))
    for params in ("all", "last_layer"):
        options = dict(n_members=3, grad_batch_size=16, eta=0.5, params=params, progress=False)
        plain = peg.PEG(**options).fit(net, (X, y))  # type: ignore[arg-type]
        pre = peg.PEG(**options, precondition="kfac").fit(net, (X, y))  # type: ignore[arg-type]
        D, D0 = pre.directions_[0], plain.directions_[0]
        assert D.shape == D0.shape and torch.isfinite(D).all()
        assert (D.norm(dim=1) < D0.norm(dim=1)).all()  # λ(F + λ)⁻¹ shrinks every step
        assert pre.meta_["precondition"] == "kfac"


@pytest.mark.parametrize("kind", ["kfac", "diag"])
def test_a_preconditioned_recipe_rebuilds_bit_identical_members(tmp_path, kind: str) -> None:
    fitted = _fit(precondition=kind, eta="search", lazy=False)
    path = fitted.save(str(tmp_path / "recipe"))
    loaded = peg.load(path, _net(), val=_data())  # rebuilt and checked against fingerprints
    assert loaded.meta["precondition"] == kind and loaded.meta["eta"] == fitted.eta_
    built = fitted.ensemble()
    for m in range(len(built)):
        a, b = loaded.member_state(m), built.member_state(m)
        assert all(torch.equal(a[k], b[k]) for k in b)


def _bn_net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.Linear(5, 4)).eval()


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    (
        "PEG",
        "precondition='kfac' on a layer without Kronecker factors",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1, precondition="kfac").fit(
            _bn_net(), _data()
        ),
        ValueError,
        r"precondition: .*layer '1' \(BatchNorm1d\)",
    ),
    (
        "PEG",
        "precondition='kfac' on a bias without its weight",
        lambda: peg.PEG(
            n_members=2,
            grad_batch_size=8,
            eta=0.1,
            precondition="kfac",
            params=lambda name, p: name == "2.bias",
        ).fit(_net(), _data()),
        ValueError,
        r"precondition: .*layer '2'",
    ),
    (
        "PEG",
        "unknown precondition",
        lambda: peg.PEG(precondition="full"),
        ValueError,
        "precondition",
    ),
    (
        "PEG",
        "damping <= 0",
        lambda: peg.PEG(precondition="kfac", damping=0.0),
        ValueError,
        "damping",
    ),
    ("PEG", "damping not a number", lambda: peg.PEG(damping="big"), ValueError, "damping"),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
