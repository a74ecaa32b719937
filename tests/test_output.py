"""The `output_fn` hook (`peg.with_output`) for models whose forward returns a tuple or a dict,
and the device rule (data follows the model; `meta` is refused), on every entry point."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict

import pytest
import torch
from torch import nn

import peg
from peg import metrics
from peg.output import OutputFnError, WithOutput
from peg.train import Recipe


class Net(nn.Module):
    """A plain classifier: logits [B, 3]."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class DictNet(Net):
    """HuggingFace-style output: a dict (an OrderedDict, as `ModelOutput`) with "logits"."""

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:  # type: ignore[override]
        features = self.body(x)
        return OrderedDict(logits=self.head(features), hidden_states=features)


class TupleNet(Net):
    """`(logits, features)`."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        features = self.body(x)
        return self.head(features), features


def _same_weights(cls: type[Net]) -> Net:
    torch.manual_seed(0)
    return cls().eval()


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    X = torch.randn(240, 2, generator=g)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()


WRAPPED = {
    "dict": lambda: peg.with_output(_same_weights(DictNet), "logits"),
    "tuple": lambda: peg.with_output(_same_weights(TupleNet), 0),
    "callable": lambda: peg.with_output(_same_weights(TupleNet), lambda out: out[0]),
}


@pytest.mark.parametrize("kind", sorted(WRAPPED))
def test_wrapped_model_predicts_like_the_plain_one(kind, data):
    X, y = data
    plain, wrapped = _same_weights(Net), WRAPPED[kind]()
    assert not wrapped.training  # starts in the model's mode
    assert torch.equal(wrapped(X), plain(X))
    for strategy in ("loop", "vmap"):
        a = peg.Ensemble.from_models([wrapped, wrapped]).member_logits(X, strategy=strategy)
        b = peg.Ensemble.from_models([plain, plain]).member_logits(X, strategy=strategy)
        torch.testing.assert_close(a, b)
    assert peg.evaluate(wrapped, X, y) == peg.evaluate(plain, X, y)
    t_wrapped = peg.TemperatureScaling().fit(wrapped, (X, y))
    t_plain = peg.TemperatureScaling().fit(plain, (X, y))
    assert t_wrapped.temperature_ == pytest.approx(t_plain.temperature_)


@pytest.mark.parametrize("kind", ["dict", "tuple"])
@pytest.mark.parametrize("method", ["peg", "pep"])
def test_peg_and_pep_with_the_hook_equal_the_plain_model(kind, method, data):
    X, y = data
    make = {
        "peg": lambda: peg.PEG(n_members=4, eta=[0.01, 0.1], grad_batch_size=16, progress=False),
        "pep": lambda: peg.PEP(n_members=4, sigma=[0.001, 0.01], progress=False),
    }[method]
    a = make().fit(WRAPPED[kind](), (X, y))
    b = make().fit(_same_weights(Net), (X, y))
    assert a.search_ == pytest.approx(b.search_)
    torch.testing.assert_close(a.member_logits(X), b.member_logits(X))
    assert peg.evaluate(a, X, y) == pytest.approx(peg.evaluate(b, X, y))


def test_training_methods_accept_the_wrapper(data):
    X, y = data
    recipe = Recipe(epochs=3, batch_size=32, schedule="swa", swa_start=1, swa_lr=0.01)
    for cls, kwargs in [
        (peg.DeepEnsemble, {"n_members": 2, "recipe": Recipe(epochs=1, batch_size=32)}),
        (peg.SWA, {"recipe": recipe}),
        (peg.SWAG, {"recipe": recipe, "n_members": 3, "diag": True}),
    ]:
        a = cls(**kwargs, progress=False).fit(WRAPPED["tuple"](), (X, y))
        b = cls(**kwargs, progress=False).fit(_same_weights(Net), (X, y))
        torch.testing.assert_close(a.member_logits(X), b.member_logits(X))
    model, history = peg.train.train(WRAPPED["dict"](), (X, y), epochs=1, progress=False)
    assert isinstance(model, WithOutput) and len(history) == 1


def test_mc_dropout_inserts_inside_the_wrapper(data):
    X, _ = data
    mc = peg.MCDropout(n_members=3, insert=0.2).fit(WRAPPED["dict"](), X)
    assert mc.member_logits(X).shape == (3, len(X), 3)


def test_archives_round_trip_with_the_model_prefix(data, tmp_path):
    X, y = data
    fitted = peg.PEG(n_members=3, eta=0.1, grad_batch_size=16, progress=False).fit(
        WRAPPED["dict"](), (X, y)
    )
    assert all(k.startswith("model.") for k in fitted.ensemble().stacked)
    path = fitted.save(str(tmp_path / "members.peg"), materialize=True)
    loaded = peg.load(path, peg.with_output(DictNet(), "logits"))
    torch.testing.assert_close(loaded.member_logits(X), fitted.member_logits(X))
    recipe = fitted.save(str(tmp_path / "recipe.peg"))  # the default: base weights + recipe
    rebuilt = peg.load(recipe, peg.with_output(DictNet(), "logits"), val=(X, y))
    torch.testing.assert_close(rebuilt.member_logits(X), fitted.member_logits(X))
    with pytest.raises(peg.ArchiveError, match="peg.with_output"):
        peg.load(path, DictNet())
    # an archive of the bare model loads into a wrapper (its entries get the prefix)
    bare = peg.Ensemble.from_models([_same_weights(Net)]).save(str(tmp_path / "bare.peg"))
    as_wrapped = peg.load(bare, peg.with_output(Net(), lambda out: out))
    torch.testing.assert_close(as_wrapped.member_logits(X), _same_weights(Net)(X)[None])


def test_the_wrapper_copies_and_pickles_with_a_key(data):
    X, _ = data
    wrapped = WRAPPED["dict"]()
    for clone in (copy.deepcopy(wrapped), pickle.loads(pickle.dumps(wrapped))):
        assert torch.equal(clone(X), wrapped(X))
    assert "output_fn='logits'" in repr(wrapped)


def _calls(X, y):
    return [
        lambda m: peg.PEG(n_members=2, eta=0.1, grad_batch_size=16, seed=0).fit(m, (X, y)),
        lambda m: peg.Ensemble.from_models([m, m]).member_logits(X[:8], strategy="vmap"),
        lambda m: peg.Ensemble.from_models([m]).member_logits(X, strategy="loop"),
        lambda m: peg.evaluate(m, X, y),
        lambda m: peg.TemperatureScaling().fit(m, (X, y)),
        lambda m: peg.train.train(m, (X, y), epochs=1),
    ]


class KeyNet(Net):
    """A mapping without "logits": the hook is needed."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"scores": self.head(self.body(x))}


@pytest.mark.parametrize(
    ("net", "pattern"),
    [(KeyNet, r"peg.with_output\(model, 'scores'\)"), (TupleNet, r"peg.with_output\(model, 0\)")],
)
def test_without_the_hook_the_error_names_it(net, pattern, data):
    X, y = data
    for call in _calls(X, y):
        with pytest.raises(TypeError, match=f"output_fn hook, e.g. {pattern}"):
            call(_same_weights(net))


def test_a_mapping_with_logits_needs_no_hook(data):
    """HuggingFace's convention: `{"logits": ...}` (or `ModelOutput`) works as it is."""
    X, y = data
    for bare, wrapped in zip(_calls(X, y), _calls(X, y), strict=True):
        got, want = bare(_same_weights(DictNet)), wrapped(WRAPPED["dict"]())
        if isinstance(got, torch.Tensor):
            assert torch.equal(got, want)
        elif isinstance(got, dict):
            assert got == want
    a = peg.TemperatureScaling().fit(_same_weights(DictNet), (X, y)).temperature_
    assert a == peg.TemperatureScaling().fit(WRAPPED["dict"](), (X, y)).temperature_


def test_bad_output_fn(data):
    X, _ = data
    with pytest.raises(TypeError, match="output_fn"):
        peg.with_output(Net(), 1.5)  # type: ignore[arg-type]
    with pytest.raises(OutputFnError, match="no key 'logit'"):
        peg.with_output(DictNet(), "logit")(X)
    with pytest.raises(OutputFnError, match="out of range"):
        peg.with_output(TupleNet(), 2)(X)
    with pytest.raises(OutputFnError, match="Tensor"):
        peg.with_output(TupleNet(), lambda out: out)(X)


# ---------------------------------------------------------------- devices
def test_data_follows_the_model_and_meta_is_refused(data):
    """CPU-only here: `meta` stands for data (or weights) that no move can fix."""
    X, y = data
    Xm, ym = X.to("meta"), y.to("meta")
    model = _same_weights(Net)
    on_meta = copy.deepcopy(model).to("meta")
    recipe = Recipe(epochs=2, schedule="swa", swa_start=1, swa_lr=0.01)
    cases = [
        (
            lambda: peg.PEG(n_members=2, eta=0.1, grad_batch_size=16).fit(model, (Xm, y)),
            "val: on the meta",
        ),
        (lambda: peg.PEP(n_members=2, sigma=0.1).fit(model, (X, ym)), "val labels: on the meta"),
        (lambda: peg.PEG(n_members=2, eta=0.1).fit(on_meta, (X, y)), "model: weights on the meta"),
        (lambda: peg.Ensemble.from_models([model]).member_logits(Xm), "X: on the meta"),
        (lambda: peg.evaluate(model, Xm, y), "X: on the meta"),
        (lambda: peg.evaluate(model, X, ym), "y: on the meta"),
        (lambda: peg.evaluate(on_meta, X, y), "predictor: weights on the meta"),
        (lambda: peg.train.train(copy.deepcopy(model), (Xm, y)), "data: on the meta"),
        (lambda: peg.train.train(on_meta, (X, y)), "model: weights on the meta"),
        (lambda: peg.DeepEnsemble(n_members=2).fit(model, (Xm, y)), "train_data: on the meta"),
        (lambda: peg.SWA(recipe=recipe).fit(on_meta, (X, y)), "model: weights on the meta"),
        (lambda: peg.SWAG(recipe=recipe.replace(epochs=3)).fit(model, (Xm, y)), "train_data: on"),
        (lambda: peg.TemperatureScaling().fit(model, (Xm, y)), "val: on the meta"),
        (lambda: peg.MCDropout(insert=0.2).fit(model).member_logits(Xm), "X: on the meta"),
        (lambda: metrics.nll(torch.zeros(1, 4, 3, device="meta"), y[:4]), "pred: on the meta"),
        (lambda: metrics.ece(torch.zeros(1, 4, 3), ym[:4]), "y: on the meta"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            call()
        text = str(info.value)
        assert "meta" in text and ("cpu" in text or "pred" in text or "X:" in text), text


def test_cpu_batches_are_moved_to_the_model_device(data, monkeypatch):
    """Every batch goes through `peg.source._devices.to_device` to the model's device (a no-op
    here)."""
    import peg.source._devices

    X, _ = data
    seen = []
    real = peg.source._devices.to_device

    def spy(t, device, name):
        seen.append((t.device, device, name))
        return real(t, device, name)

    monkeypatch.setattr(peg.source._devices, "to_device", spy)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X), batch_size=100)
    peg.Ensemble.from_models([_same_weights(Net)]).member_logits(loader)
    assert [name for *_, name in seen] == ["X"] * 3
