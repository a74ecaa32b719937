"""Lazy PEG/PEP (`lazy=True`): no members held after fit, the same predictions as the stacked
ensemble, members regenerated a chunk at a time; recipes still saved and loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg
from peg.archive import read_header
from peg.methods.perturbation._members import LAZY_CHUNK_SIZE

from conftest import mlp


def _logits_close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Lazy and stacked members are the same weights run by other computations (chunks of
    members folded or vmapped together, other strategies), whose kernels and summation order
    depend on the CPU. The overfit MLP's logits (up to ~27) are sums of terms up to ~400: float32
    resolves those to 400 · 2⁻²⁴ ≈ 2.4e-5, so two summation orders can differ by ~1e-4 (members
    at other scales or in another order differ by far more)."""
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def _same_predictions(a, b, X: torch.Tensor) -> None:
    """The predicted classes agree wherever the top two probabilities are further apart than
    the logits' tolerance could move them (a near-tie may go either way on another CPU)."""
    top = b.predict_proba(X).topk(2, dim=-1).values
    clear = top[:, 0] - top[:, 1] > 1e-3
    assert clear.float().mean() > 0.99
    assert torch.equal(a.predict(X)[clear], b.predict(X)[clear])


def _pair(cls, model, val, **options):
    """The same ensemble fitted eagerly and lazily."""
    return cls(progress=False, **options).fit(model, val), cls(
        progress=False, lazy=True, **options
    ).fit(model, val)


@pytest.mark.parametrize(
    "options",
    [
        {"n_members": 7, "grad_batch_size": 32, "eta": 0.1},
        {
            "n_members": 6,
            "grad_batch_size": 32,
            "eta": 0.1,
            "variant": "unbiased",
            "val_batches": 3,
        },
        {
            "n_members": 5,
            "grad_batch_size": 32,
            "eta": [0.01, 0.1],
            "search": peg.ScaleSearch(max_points=200),
        },
    ],
    ids=["vanilla", "unbiased", "searched"],
)
def test_lazy_peg_predicts_what_the_stacked_ensemble_predicts(overfit_mlp, moons_data, options):
    eager, lazy = _pair(peg.PEG, overfit_mlp, moons_data["val"], **options)
    assert lazy.eta_ == eager.eta_ and lazy.search_ == eager.search_
    X = moons_data["test"][0]
    want = eager.member_logits(X, 256)
    assert len(lazy) == len(eager) == options["n_members"]
    for strategy, chunk in [("auto", None), ("loop", 1), ("vmap", 3), ("chunked", 2), ("auto", 7)]:
        got = lazy.member_logits(X, 256, strategy=strategy, chunk_size=chunk)
        assert got.shape == want.shape
        _logits_close(got, want)
    _logits_close(lazy.predict_proba(X), eager.predict_proba(X))
    _same_predictions(lazy, eager, X)


@pytest.mark.parametrize("cls", [peg.PEG, peg.PEP])
@pytest.mark.parametrize("as_ensemble", [False, True])
def test_lazy_several_base_models_are_base_major(moons_data, cls, as_ensemble):
    bases = [mlp(0), mlp(1), mlp(2)]
    model = peg.Ensemble.from_models(bases) if as_ensemble else bases
    scale = {"eta": 0.1, "grad_batch_size": 32} if cls is peg.PEG else {"sigma": 0.05}
    eager, lazy = _pair(cls, model, moons_data["val"], n_members=4, **scale)
    X = moons_data["test"][0]
    want = eager.member_logits(X)
    assert want.shape[0] == 12 and len(lazy) == 12
    for chunk in (None, 1, 3, 5):
        _logits_close(lazy.member_logits(X, 300, chunk_size=chunk), want)


def test_lazy_pep_and_searched_sigma(overfit_mlp, moons_data):
    eager, lazy = _pair(peg.PEP, overfit_mlp, moons_data["val"], n_members=6, sigma="search")
    assert lazy.sigma_ == eager.sigma_
    X = moons_data["test"][0]
    _logits_close(lazy.member_logits(X, chunk_size=4), eager.member_logits(X))


@pytest.mark.parametrize("bn", ["eval", "batch", "refresh"])
def test_lazy_with_batchnorm(bn_net, moons_data, bn):
    val = (moons_data["val"][0], moons_data["val"][1] % 3)
    extra = {"bn_data": moons_data["train"][0]} if bn == "refresh" else {}
    options = {"n_members": 4, "grad_batch_size": 32, "eta": 0.05, "bn": bn, "progress": False}
    eager = peg.PEG(**options).fit(bn_net, val, **extra)
    lazy = peg.PEG(lazy=True, **options).fit(bn_net, val, **extra)
    X = moons_data["test"][0]
    _logits_close(lazy.member_logits(X, chunk_size=3), eager.member_logits(X))


def test_lazy_drops_the_same_members(overfit_mlp, moons_data):
    calls = {"n": 0}

    def loss(out, target):
        calls["n"] += 1
        losses = torch.nn.functional.cross_entropy(out, target, reduction="none")
        return losses * float("nan") if calls["n"] == 2 else losses  # member 1 diverges

    fitted = []
    for lazy in (False, True):
        calls["n"] = 0
        options = {"n_members": 4, "grad_batch_size": 32, "eta": 0.1, "loss": loss, "lazy": lazy}
        fitted.append(peg.PEG(on_nonfinite="drop", **options).fit(overfit_mlp, moons_data["val"]))
    eager, lazy = fitted
    assert lazy.dropped_ == eager.dropped_ == [1] and len(lazy) == 3
    X = moons_data["test"][0]
    for chunk in (None, 1, 2):
        _logits_close(lazy.member_logits(X, chunk_size=chunk), eager.member_logits(X))
    assert lazy.ensemble().meta["dropped"] == [1]


def _tensor_bytes(obj, seen=None) -> int:
    """Bytes of the distinct tensor storages reachable from obj (attributes, containers)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        key = obj.untyped_storage().data_ptr() if obj.device.type != "meta" else id(obj)
        if key in seen or obj.device.type == "meta":
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        return sum(_tensor_bytes(t, seen) for t in obj.state_dict().values())
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return sum(_tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


@pytest.mark.parametrize("eta", [0.05, [0.01, 0.1]], ids=["fixed", "searched"])
@pytest.mark.parametrize(
    ("store", "row_bytes"), [("regenerate", 0), ("full", 4), ("bfloat16", 2), ("float16", 2)]
)
def test_a_lazy_peg_holds_no_members(eta, store, row_bytes):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
    model.append(nn.Linear(256, 3)).eval()
    X, y = torch.randn(300, 2), torch.randint(0, 3, (300,))
    base = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    data = X.numel() * 4 + y.numel() * 8
    S = 20
    rows = S * sum(p.numel() for p in model.parameters()) * row_bytes  # the rows it keeps
    options = {"n_members": S, "grad_batch_size": 32, "eta": eta, "progress": False}
    eager = peg.PEG(**options).fit(model, (X, y))
    lazy = peg.PEG(lazy=True, lazy_store=store, **options).fit(model, (X, y))
    assert not hasattr(lazy, "directions_") and not hasattr(lazy, "ensemble_")
    assert lazy.lazy_store_ == store and eager.lazy_store_ is None
    seen = {t.untyped_storage().data_ptr() for t in model.state_dict().values()}  # the caller's
    held = _tensor_bytes(lazy, set(seen))
    # the stored base, the rows kept (+ the validation data, a reference, + the float16 scales)
    assert rows <= held < 2 * base + 2 * data + rows
    assert _tensor_bytes(eager, set(seen)) > 2 * S * base  # rows + stacked members, for contrast
    # predicting leaves nothing behind
    lazy.member_logits(torch.randn(50, 2), chunk_size=3)
    assert _tensor_bytes(lazy, set(seen)) == held


def test_lazy_ensemble_save_and_load(overfit_mlp, moons_data, tmp_path):
    val, X = moons_data["val"], moons_data["test"][0]
    options = {"n_members": 5, "grad_batch_size": 32, "eta": [0.01, 0.1]}
    eager, lazy = _pair(peg.PEG, overfit_mlp, val, **options)
    want = eager.member_logits(X)
    # ensemble() builds every member on demand, equal to the eager one
    ensemble = lazy.ensemble()
    assert len(ensemble) == 5 and ensemble.meta["eta"] == eager.eta_
    _logits_close(ensemble.member_logits(X), want)
    _logits_close(lazy.ensemble_at(0.02).member_logits(X), eager.ensemble_at(0.02).member_logits(X))
    # recipe: about the base's size, rebuilt and checked from the validation data
    recipe = lazy.save(str(tmp_path / "lazy"))
    eager_recipe = eager.save(str(tmp_path / "eager"))
    got, ref = (read_header(Path(p))["meta"]["recipe"] for p in (recipe, eager_recipe))
    assert Path(recipe).stat().st_size == Path(eager_recipe).stat().st_size
    assert {**got, "fingerprints": None} == {**ref, "fingerprints": None}
    for a, b in zip(got["fingerprints"], ref["fingerprints"], strict=True):
        assert a == pytest.approx(b, rel=1e-9)
    _logits_close(peg.load(recipe, overfit_mlp, val=val).member_logits(X), want)
    # materialised: every member, loaded without data
    full = lazy.save(str(tmp_path / "full"), materialize=True)
    _logits_close(peg.load(full, overfit_mlp).member_logits(X), want)


def test_lazy_pep_recipe_round_trip(overfit_mlp, moons_data, tmp_path):
    val, X = moons_data["val"], moons_data["test"][0]
    lazy = peg.PEP(n_members=4, sigma=0.02, lazy=True, progress=False).fit(overfit_mlp, val)
    path = lazy.save(str(tmp_path / "pep"))
    _logits_close(peg.load(path, overfit_mlp, val=val).member_logits(X), lazy.member_logits(X))


def test_lazy_inputs_and_grad_mode(overfit_mlp, moons_data):
    eager, lazy = _pair(
        peg.PEG, overfit_mlp, moons_data["val"], n_members=4, grad_batch_size=32, eta=0.1
    )
    X = moons_data["test"][0]
    want = eager.member_logits(X)
    loader = DataLoader(TensorDataset(X, torch.zeros(len(X))), batch_size=300)
    _logits_close(lazy.member_logits(loader), want)
    with torch.no_grad():  # the gradients are taken all the same
        _logits_close(lazy.member_logits(X.numpy(), chunk_size=LAZY_CHUNK_SIZE), want)


def test_lazy_leaves_the_caller_model_alone_and_ignores_later_edits(moons_data):
    model = mlp(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lazy = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, lazy=True, progress=False)
    lazy.fit(model, moons_data["val"])
    X = moons_data["test"][0]
    first = lazy.member_logits(X)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert torch.equal(lazy.member_logits(X), first)  # members around the weights at fit time


def test_lazy_errors():
    lazy = peg.PEG(lazy=True)
    with pytest.raises(peg.NotFittedError):
        lazy.predict_proba(torch.zeros(3, 2))
    with pytest.raises(peg.NotFittedError):
        len(lazy)
    with pytest.raises(peg.NotFittedError):
        lazy.ensemble()
    with pytest.raises(ValueError, match="lazy"):
        peg.PEP(lazy="yes")  # type: ignore[arg-type]


def test_lazy_argument_checks(overfit_mlp, moons_data):
    lazy = peg.PEG(n_members=2, grad_batch_size=32, eta=0.1, lazy=True, progress=False)
    lazy.fit(overfit_mlp, moons_data["val"])
    X = moons_data["test"][0]
    with pytest.raises(ValueError, match="strategy"):
        lazy.member_logits(X, strategy="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk_size"):
        lazy.member_logits(X, chunk_size=0)
    with pytest.raises(ValueError, match="no inputs"):
        lazy.member_logits(DataLoader(TensorDataset(X[:0]), batch_size=4))


def test_lazy_prediction_takes_autocast(moons_data):
    X, _ = moons_data["val"]
    lazy = peg.PEG(n_members=3, grad_batch_size=16, eta=0.05, lazy=True, progress=False)
    lazy.fit(mlp(0).eval(), moons_data["val"])
    low = lazy.member_logits(X, autocast="bf16")
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, lazy.member_logits(X), rtol=0.05, atol=0.05)
    with pytest.raises(ValueError, match="autocast"):
        lazy.member_logits(X, autocast="fp8")
