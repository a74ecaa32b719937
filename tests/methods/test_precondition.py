"""Preconditioned PEG (`precondition="kfac" | "diag"`): the step against a dense reference, the
limit of large damping, recipes, and bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import peg
from bad_inputs import raises_test
from peg.methods.perturbation import _precondition
from peg.methods.perturbation.peg import draw_batch
from peg.streams import VALIDATION, generator

K, VAL_BATCHES, SEED = 16, 3, 4


def _net(features: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, 5), nn.Tanh(), nn.Linear(5, 4)).eval()


def _data(n: int = 120, features: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, features, generator=g), torch.randint(0, 4, (n,), generator=g)


def _fit(features: int = 3, **options: object) -> peg.PEG:
    base = dict(n_members=4, grad_batch_size=K, eta=0.1, seed=SEED, val_batches=VAL_BATCHES)
    model, val = _net(features), _data(features=features)
    return peg.PEG(**{**base, **options}, progress=False).fit(model, val)  # type: ignore[arg-type]


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


@pytest.mark.parametrize("features", [3, 64])
def test_kfac_step_matches_the_dense_kronecker_inverse(features: int, monkeypatch) -> None:
    """With 64 inputs the first layer's A (65 × 65) is seen on 3 × 16 = 48 points only: its
    rows are kept and its eigenvectors come from their Gram matrix (`InputMoment`)."""
    ranges: list[bool] = []
    input_eig = _precondition._input_eig
    monkeypatch.setattr(
        _precondition, "_input_eig", lambda lay: (r := input_eig(lay), ranges.append(r[2]))[0]
    )
    plain, pre = _fit(features), _fit(features, precondition="kfac", damping=0.3)
    assert ranges == [features > 3 * K, False]  # the rows' Gram path for the wide layer only
    X, y = _data(features=features)
    F = _dense_kfac(_net(features), *(t[_curvature_points()] for t in (X, y))).double()
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


def test_a_kfac_recipe_of_version_3_rebuilds_with_summed_input_factors(
    tmp_path, monkeypatch
) -> None:
    """Recipes before version 4 made K-FAC's members from the summed input factors, rows kept
    or not: they are rebuilt so (and newer ones from the rows, on a layer seen on fewer points
    than it has inputs)."""
    from peg.methods.perturbation import _recipes

    kept: list[bool] = []

    class Recording(_precondition.InputMoment):
        def __init__(self, keep_rows: bool = True) -> None:
            super().__init__(keep_rows)
            kept.append(keep_rows)

    monkeypatch.setattr(_precondition, "InputMoment", Recording)
    for version, expected in ((3, False), (4, True)):
        fitted = _fit(64, precondition="kfac", eta=0.1, lazy=False)
        fitted.__dict__["_kfac_rows"] = expected  # as that version's fit made them
        monkeypatch.setattr(_recipes, "RECIPE_VERSION", version)
        path = fitted.save(str(tmp_path / f"recipe{version}"))
        kept.clear()
        peg.load(path, _net(64), val=_data(features=64))  # checked against the fingerprints
        assert kept and set(kept) == {expected}


def test_equal_input_rows_are_kept_once_with_their_count() -> None:
    """Mini-batches drawn independently repeat points: a wide layer's equal input rows are kept
    once, times √(their count), so that Rᵀ R is still the mean of a aᵀ over every row."""
    distinct = torch.randn(5, 9, generator=torch.Generator().manual_seed(0))
    rows = distinct[torch.tensor([0, 1, 2, 1, 3, 1, 4, 0])]
    moment = _precondition.InputMoment()
    moment.add(rows[:4], "linear")
    moment.add(rows[4:], "linear")
    A, R = moment.mean()
    assert A is None and R is not None and R.shape == (5, 9)
    torch.testing.assert_close(R.double().T @ R.double(), rows.double().T @ rows.double() / 8)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("channels_last", [True, False])
def test_a_convolution_s_input_rows_are_f_unfold_s(bias: bool, channels_last: bool) -> None:
    """A convolution's patches are written straight into their rows: F.unfold's, in its order
    or (a channels-last input) channels inner, which `input_order` maps back."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1), bias=bias)
    layer = _precondition.KFACLayer("c", conv, "conv2d", 0, 1 if bias else None)
    x = torch.randn(2, 3, 11, 9)
    a = nn.functional.unfold(x, (3, 2), (2, 1), (2, 1), (1, 2)).transpose(1, 2).reshape(-1, 18)
    expected = torch.cat([a, torch.ones(len(a), 1)], 1) if bias else a
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    for inputs in (x, x.double()):  # the second call in the first one's order
        rows, order = layer.inputs(inputs, torch.float32), layer.input_order()
        assert (order is not None) == channels_last
        # exact: both are copies of the same float32 input elements (F.unfold gathers, no
        # arithmetic; the double input's values are float32's), so the bits hold on any CPU
        assert torch.equal(rows if order is None else rows[:, order], expected)


def test_a_kfac_recipe_made_before_equal_rows_were_merged_still_rebuilds(
    tmp_path, monkeypatch
) -> None:
    """Version-4 recipes were made from every input row, equal ones included: merging them
    moves the members by rounding only (1.2e-6 of a row on a CNN's classifier), within the
    fingerprints' tolerance, so such a recipe still rebuilds (no new recipe version)."""
    points = _curvature_points()
    assert len(points.unique()) < len(points)  # some points drawn twice: rows merged

    def every_row(self: _precondition.InputMoment) -> tuple:
        if self.total is not None:
            return self.total / self.count, None
        return None, torch.cat(self.rows) / self.count**0.5

    with monkeypatch.context() as m:
        m.setattr(_precondition.InputMoment, "mean", every_row)
        fitted = _fit(64, precondition="kfac", eta=0.1, lazy=False)
        path = fitted.save(str(tmp_path / "recipe"))
    loaded = peg.load(path, _net(64), val=_data(features=64))  # checked against the fingerprints
    built, merged = fitted.ensemble(), _fit(64, precondition="kfac", eta=0.1, lazy=False)
    for m in range(len(built)):
        a, b = loaded.member_state(m), built.member_state(m)
        assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in b)
    D, D0 = merged.directions_[0].double(), fitted.directions_[0].double()
    assert ((D - D0).norm(dim=1) / D0.norm(dim=1)).max() < 1e-5


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.Linear(5, 4)).eval()
    with torch.no_grad():  # running statistics away from (0, 1): the affine part matters
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    return net


def _dense_kron(a: torch.Tensor, g: torch.Tensor, bias: bool) -> torch.Tensor:
    """A ⊗ G `[P, P]` in a layer's row order (W row-major, then b), from per-row inputs `a`
    (with the bias's 1 appended) and per-point output gradients `g` (rows = points)."""
    A, G = a.T @ a / len(a), g.T @ g / len(g)
    out, d = G.shape[0], A.shape[0]
    F = torch.kron(G, A)
    w = d - 1 if bias else d
    order = [o * d + i for o in range(out) for i in range(w)]
    order += [o * d + d - 1 for o in range(out)] if bias else []
    return F[order][:, order]


def _preconditioned(F: torch.Tensor, rows: torch.Tensor, damping: float) -> torch.Tensor:
    lam = damping * F.trace() / F.shape[0]
    return lam * torch.linalg.solve(F + lam * torch.eye(len(F), dtype=F.dtype), rows.T).T


def test_kfac_with_batchnorm_is_kronecker_on_the_linears_and_diagonal_on_the_affine() -> None:
    options = dict(n_members=4, grad_batch_size=K, eta=0.1, seed=SEED, val_batches=VAL_BATCHES)
    X, y = _data()
    plain = peg.PEG(**options, progress=False).fit(_bn_net(), (X, y))  # type: ignore[arg-type]
    pre = peg.PEG(**options, precondition="kfac", damping=0.3, progress=False)  # type: ignore[arg-type]
    pre.fit(_bn_net(), (X, y))
    assert pre.meta_["curvature"] == {
        "kfac": {"0": "Linear", "2": "Linear"},
        "diagonal": {"1.weight": "BatchNorm1d", "1.bias": "BatchNorm1d"},
    }
    net, idx = _bn_net(), _curvature_points()
    # per point: the layers' inputs and output gradients, and the affine parameters' gradients
    a0, g0, a2, g2, bn = [], [], [], [], []
    for x, t in zip(X[idx], y[idx], strict=True):
        h0 = net[0](x[None])
        h0.retain_grad()
        h1 = net[1](h0)
        out = net[2](h1)
        net.zero_grad()
        nn.functional.cross_entropy(out, t[None]).backward()
        a0.append(torch.cat([x, torch.ones(1)]))
        g0.append(h0.grad[0].clone())
        a2.append(torch.cat([h1[0].detach(), torch.ones(1)]))
        g2.append(net[2].bias.grad.clone())
        bn.append(torch.cat([net[1].weight.grad, net[1].bias.grad]))
    # the diagonal: (Σ_n ∇ℓ_n)² / K per mini-batch, averaged over the mini-batches
    sums = torch.stack(bn).reshape(VAL_BATCHES, K, -1).sum(1)
    diag = (sums.square() / K).mean(0)
    blocks = [
        _dense_kron(torch.stack(a0), torch.stack(g0), True),
        torch.diag(diag),
        _dense_kron(torch.stack(a2), torch.stack(g2), True),
    ]
    F = torch.block_diag(*blocks).double()
    expected = _preconditioned(F, plain.directions_[0].double(), 0.3)
    torch.testing.assert_close(pre.directions_[0].double(), expected, rtol=1e-4, atol=1e-6)


class _Tokens(nn.Module):
    """Token ids `[B, T]` → an embedding → mean over positions → a linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(7, 3)
        self.head = nn.Linear(3, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(1))


def test_kfac_on_an_embedding_has_the_token_counts_as_its_input_factor() -> None:
    g = torch.Generator().manual_seed(2)
    X, y = torch.randint(0, 7, (120, 5), generator=g), torch.randint(0, 4, (120,), generator=g)
    options = dict(n_members=3, grad_batch_size=K, eta=0.1, seed=SEED, val_batches=VAL_BATCHES)
    plain = peg.PEG(**options, progress=False).fit(_Tokens().eval(), (X, y))  # type: ignore[arg-type]
    pre = peg.PEG(**options, precondition="kfac", damping=0.2, progress=False)  # type: ignore[arg-type]
    pre.fit(_Tokens().eval(), (X, y))
    assert pre.meta_["curvature"]["kfac"] == {"embed": "Embedding", "head": "Linear"}
    net, idx = _Tokens().eval(), _curvature_points()
    onehots, ge, ah, gh = [], [], [], []
    for ids, t in zip(X[idx], y[idx], strict=True):
        e = net.embed(ids[None])
        e.retain_grad()
        feats = e.mean(1)
        net.zero_grad()
        nn.functional.cross_entropy(net.head(feats), t[None]).backward()
        onehots.append(nn.functional.one_hot(ids, 7).float())  # [T, V]: one row per position
        ge.append(e.grad[0])  # [T, D]
        ah.append(torch.cat([feats[0].detach(), torch.ones(1)]))
        gh.append(net.head.bias.grad.clone())
    a = torch.cat(onehots)  # rows: points × positions (A their mean)
    G = sum(gt.T @ gt for gt in ge) / len(ge)  # summed over positions, mean over points
    # the embedding's entries are W `[V, D]` row-major: index (v, d) ↦ v·D + d; F = A ⊗ G in
    # the (d, v) order of Wᵀ, reordered
    Fe = torch.kron(G, a.T @ a / len(a))
    order = [d * 7 + v for v in range(7) for d in range(3)]
    F = torch.block_diag(Fe[order][:, order], _dense_kron(torch.stack(ah), torch.stack(gh), True))
    expected = _preconditioned(F.double(), plain.directions_[0].double(), 0.2)
    torch.testing.assert_close(pre.directions_[0].double(), expected, rtol=1e-4, atol=1e-6)


def test_kfac_on_huggingface_conv1d_is_linear_s_transposed() -> None:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    linear = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4)).eval()
    conv = nn.Sequential(Conv1D(5, 3), nn.Tanh(), Conv1D(4, 5)).eval()
    with torch.no_grad():
        for lin, c in ((linear[0], conv[0]), (linear[2], conv[2])):
            c.weight.copy_(lin.weight.T)
            c.bias.copy_(lin.bias)
    options = dict(n_members=3, grad_batch_size=K, eta=0.1, seed=SEED, precondition="kfac")
    a = peg.PEG(**options, progress=False).fit(linear, _data())  # type: ignore[arg-type]
    b = peg.PEG(**options, progress=False).fit(conv, _data())  # type: ignore[arg-type]
    assert b.meta_["curvature"] == {"kfac": {"0": "Conv1D", "2": "Conv1D"}, "diagonal": {}}
    for m in range(3):
        sa, sb = a.ensemble_.member_state(m), b.ensemble_.member_state(m)
        for k in sa:
            expected = sa[k].T if k.endswith("weight") else sa[k]
            torch.testing.assert_close(sb[k], expected, rtol=1e-4, atol=1e-6)


def test_kfac_on_a_bias_without_its_weight_is_diagonal() -> None:
    pre = _fit(precondition="kfac", params=lambda name, p: name in ("0.weight", "2.bias"))
    assert pre.meta_["curvature"] == {"kfac": {"0": "Linear"}, "diagonal": {"2.bias": "Linear"}}
    assert torch.isfinite(pre.directions_[0]).all()


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
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
