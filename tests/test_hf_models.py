"""HuggingFace vision and text models as users bring them: dict batches from a DataLoader,
every method that takes data, `peg.compare`, and the head found by running the model.

The models are transformers' ViT, ResNet and BERT built from tiny configurations (`tiny_hf`:
random weights, a few thousand parameters: the code paths and the batch shapes are what is
tested, in well under a second per fit). Batches are HuggingFace's: `{"pixel_values", "labels"}`
or `{"input_ids", "attention_mask", "labels"}`; peg needs neither a `batch_fn` nor a
`with_output`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg
from peg.subspace import RandomSubspace
from peg.train import Recipe
from tiny_hf import CLASSES, Items, bert, images, resnet, tokens, vit

# name -> (model builder, batch maker, the head the last layer is found in)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[..., dict], str]] = {
    "vit": (vit, images, "classifier"),
    "resnet": (resnet, images, "classifier.1"),  # Sequential(Flatten, Linear)
    "bert": (bert, tokens, "classifier"),
}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request) -> tuple[str, nn.Module, DataLoader, DataLoader]:
    build, make, _ = MODELS[request.param]
    torch.manual_seed(0)
    model = build().eval()
    val = DataLoader(Items(make(260, 1)), batch_size=32)  # compare's PEG holds out half
    test = DataLoader(Items(make(40, 2)), batch_size=16)
    return request.param, model, val, test


def inputs_of(loader: DataLoader) -> dict[str, torch.Tensor]:
    return {k: v for k, v in loader.dataset.data.items() if k != "labels"}


def test_last_layer_peg_finds_the_head_and_shares_the_trunk(case):
    name, model, val, test = case
    ens = peg.PEG(n_members=3, eta="search", grad_batch_size=16, params="last_layer", seed=0)
    ens.fit(model, val)
    head = MODELS[name][2]
    assert ens.meta_["head"] == head
    assert all(n.startswith(f"{head}.") for n in ens.param_names_)
    logits = ens.member_logits(test)
    assert logits.shape == (3, 40, CLASSES) and torch.isfinite(logits).all()
    # the shared-trunk path gives the members' own logits: member 0 run whole
    member = ens.ensemble_.member_model(0).eval()
    with torch.no_grad():
        whole = member(**inputs_of(test)).logits
    torch.testing.assert_close(logits[0], whole, rtol=1e-4, atol=1e-5)
    assert len(set(ens.search_)) >= 2  # η searched on the heads alone


def test_full_peg_on_dict_batches_matches_the_tensor_mapping(case):
    _, model, val, test = case
    kw = dict(n_members=2, eta=0.01, grad_batch_size=16, seed=0)
    ens = peg.PEG(**kw).fit(model, val)
    assert ens.meta_["head"] is None  # every entry perturbed: members run whole
    logits = ens.member_logits(test)
    assert logits.shape == (2, 40, CLASSES)
    assert not torch.equal(logits[0], logits[1])
    again = peg.PEG(**kw).fit(model, val).member_logits(inputs_of(test))
    torch.testing.assert_close(again, logits)  # a mapping of tensors, sliced like a loader


def test_the_other_methods_take_dict_batches(case):
    name, model, val, test = case
    methods = [
        peg.PEP(n_members=2, seed=0),
        peg.PEG(n_members=2, eta=0.01, grad_batch_size=16, variant="unbiased", seed=0),
        peg.PEG(n_members=2, eta=0.01, grad_batch_size=16, params="last_layer", lazy=True),
        peg.TemperatureScaling(),
        peg.VectorScaling(),
        peg.MCDropout(n_members=2, seed=0, insert=0.1 if name == "resnet" else None),
    ]
    for method in methods:
        logits = method.fit(model, val).member_logits(test)
        assert logits.shape[1:] == (40, CLASSES), type(method).__name__
        assert torch.isfinite(logits).all(), type(method).__name__
    metrics = peg.evaluate(methods[0], test)
    assert 0 <= metrics["error"] <= 1


def test_training_methods_and_samplers_take_dict_batches(case):
    _, model, val, test = case
    recipe = Recipe(epochs=3, lr=0.01, batch_size=64, schedule="swa", swa_start=1, swa_lr=0.01)
    methods = [
        peg.DeepEnsemble(n_members=2, recipe=Recipe(epochs=1, lr=0.01, batch_size=64)),
        peg.SWAG(recipe=recipe, n_members=3),
        RandomSubspace(n_members=3),
    ]
    for method in methods:
        logits = method.fit(model, val).member_logits(test)
        assert logits.shape[1:] == (40, CLASSES), type(method).__name__
        assert torch.isfinite(logits).all(), type(method).__name__


def test_compare_with_the_default_methods(case):
    name, model, val, test = case
    result = peg.compare(model, val, test, say=None, progress=False)
    rows = [row["method"] for row in result.table]
    assert {"Model", "TS", "PEP", "PEG", "Last-layer PEG"} <= set(rows)
    assert ("MC dropout" in rows) == (name != "resnet")  # ResNet has no dropout: skipped
    for row in result.table:
        assert 0 <= row["error"] <= 1 and row["nll"] > 0, row


# what K-FAC PEG gives Kronecker factors (layer types) and what the diagonal (parameters'
# layer types), per model: BatchNorm, LayerNorm, class token and position embeddings diagonal
CURVATURE = {
    "vit": ({"Conv2d", "Linear"}, {"LayerNorm", "ViTEmbeddings"}),
    "resnet": ({"Conv2d", "Linear"}, {"BatchNorm2d"}),
    "bert": ({"Embedding", "Linear"}, {"LayerNorm"}),
}


def test_kfac_peg_on_every_parameter_of_vit_resnet_and_bert(case):
    name, model, val, test = case
    ens = peg.PEG(n_members=3, eta=0.01, grad_batch_size=16, precondition="kfac", seed=0)
    ens.fit(model, val)
    layout = ens.meta_["curvature"]
    kfac, diagonal = CURVATURE[name]
    assert set(layout["kfac"].values()) == kfac
    assert set(layout["diagonal"].values()) == diagonal
    if name == "vit":
        assert layout["diagonal"]["vit.embeddings.cls_token"] == "ViTEmbeddings"
        assert layout["kfac"]["vit.embeddings.patch_embeddings.projection"] == "Conv2d"
    if name == "bert":
        assert layout["kfac"]["bert.embeddings.word_embeddings"] == "Embedding"
    logits = ens.member_logits(test)
    assert logits.shape == (3, 40, CLASSES) and torch.isfinite(logits).all()
    plain = peg.PEG(n_members=3, eta=0.01, grad_batch_size=16, seed=0).fit(model, val)
    D, D0 = ens.directions_[0], plain.directions_[0]
    assert (D.norm(dim=1) < D0.norm(dim=1)).all()  # λ(F + λ)⁻¹ shrinks every step


def test_compare_and_autoselect_run_kfac_peg(case):
    _, model, val, test = case
    methods = ["Model", "TS", "PEG", "PEG (kfac)"]
    result = peg.compare(model, val, test, methods=methods, say=None, progress=False)
    rows = {row["method"]: row for row in result.table}
    assert set(rows) == set(methods)
    assert "failed" not in rows["PEG (kfac)"] and 0 < rows["PEG (kfac)"]["nll"] < 10
    sel = peg.AutoSelect(candidates=["TS", "PEG (kfac)"], cv=2, progress=False).fit(model, val)
    assert {r["candidate"] for r in sel.report_} == {"TS", "PEG (kfac)"}


class Pixels(nn.Module):
    """An image model taking `pixel_values` as a tensor and returning its logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


def test_laplace_fits_and_predicts_on_dict_batches(case, tmp_path):
    name, model, val, test = case
    fitted = peg.Laplace().fit(model, val)
    assert fitted.meta_["last_layer"] == MODELS[name][2] and fitted.meta_["keyword_inputs"]
    assert fitted.meta_["fast_variance"]  # the Kronecker path, on the wrapped model's features
    probs = fitted.predict_proba(test)
    assert probs.shape == (40, CLASSES) and torch.isfinite(probs).all()
    torch.testing.assert_close(probs.sum(1), torch.ones(40))
    torch.testing.assert_close(fitted.predict_proba(inputs_of(test)), probs)  # a mapping whole
    # laplace-torch's own predictive on the same mappings gives the same numbers
    own = peg.Laplace(fast_variance=False).fit(model, val).predict_proba(test)
    torch.testing.assert_close(own, probs, rtol=1e-4, atol=1e-5)
    if name != "bert":  # the same model taking the pixels as a tensor: the same fit
        data = val.dataset.data
        pairs = DataLoader(TensorDataset(data["pixel_values"], data["labels"]), batch_size=32)
        tensors = peg.Laplace().fit(Pixels(model), pairs)
        assert tensors.prior_precision_ == pytest.approx(fitted.prior_precision_, rel=1e-4)
        pixels = test.dataset.data["pixel_values"]
        torch.testing.assert_close(tensors.predict_proba(pixels), probs, rtol=1e-4, atol=1e-5)
    path = fitted.save(tmp_path / "la.safetensors")
    torch.manual_seed(1)
    loaded = peg.load(path, MODELS[name][0]())  # another instance: its weights are replaced
    assert loaded.meta_ == fitted.meta_
    torch.testing.assert_close(loaded.member_logits(test), fitted.member_logits(test))


def test_laplace_grid_search_and_mc_on_dict_batches(case):
    _, model, val, test = case
    for options in ({"prior_optimization": "gridsearch"}, {"link_approx": "mc", "n_members": 3}):
        fast = peg.Laplace(**options).fit(model, val)
        own = peg.Laplace(fast_variance=False, **options).fit(model, val)
        assert fast.prior_precision_ == pytest.approx(own.prior_precision_, rel=1e-4)
        torch.testing.assert_close(
            fast.member_logits(test), own.member_logits(test), rtol=1e-4, atol=1e-4
        )


def test_compare_with_laplace_on_dict_batches(case):
    _, model, val, test = case
    result = peg.compare(model, val, test, methods=["Model", "Laplace"], say=None, progress=False)
    assert not result.failed and [row["method"] for row in result.table] == ["Model", "Laplace"]
    for row in result.table:
        assert 0 <= row["error"] <= 1 and row["nll"] > 0, row


class HeadFirst(nn.Module):
    """The head registered before the trunk: registration order would pick the trunk's layer."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(8, CLASSES)
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.score(self.body(x))


def test_the_last_layer_is_the_last_to_run_not_the_last_registered():
    torch.manual_seed(0)
    X, y = torch.randn(200, 4), torch.randint(0, CLASSES, (200,))
    ens = peg.PEG(n_members=3, eta=0.01, grad_batch_size=16, params="last_layer")
    ens.fit(HeadFirst().eval(), (X, y))
    assert ens.param_names_ == ["score.weight", "score.bias"]
    assert ens.meta_["head"] == "score"


class Functional(nn.Module):
    """Weights used through torch.nn.functional only: no Linear or Conv module."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(CLASSES, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight)


def _unlabelled_loader() -> DataLoader:
    data = images(64, 0)
    return DataLoader(Items({"pixel_values": data["pixel_values"], "target": data["labels"]}))


# (area, what, call, kind, regex): collected into docs/errors.md after the merge
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    (
        "PEG",
        "params='last_layer' on a model without a Linear or Conv layer",
        lambda: peg.PEG(params="last_layer", eta=0.1).fit(
            Functional(), (torch.randn(64, 4), torch.randint(0, CLASSES, (64,)))
        ),
        ValueError,
        r"params: 'last_layer' found no Linear or Conv.*modules seen.*params=\['name', \.\.\.\]",
    ),
    (
        "PEG",
        "dict batches without 'labels' in fit",
        lambda: peg.PEG(eta=0.1).fit(vit().eval(), _unlabelled_loader()),
        ValueError,
        r"val: the batch is a mapping without 'labels' or 'label' \(keys: \['pixel_values', "
        r"'target'\]\)",
    ),
    (
        "Laplace",
        "pred_type='nn' on dict batches",
        lambda: peg.Laplace(pred_type="nn", link_approx="mc").fit(
            vit().eval(), DataLoader(Items(images(16, 0)), batch_size=8)
        ),
        ValueError,
        r"val: pred_type='nn' is laplace-torch's sampled networks, which take tensor inputs",
    ),
    (
        "Laplace",
        "dict inputs to a Laplace fitted on tensors",
        lambda: peg.Laplace()
        .fit(Pixels(vit().eval()), (images(16, 0)["pixel_values"], images(16, 0)["labels"]))
        .predict_proba({"pixel_values": images(4, 1)["pixel_values"]}),
        TypeError,
        r"X: this Laplace was fitted on tensor inputs, got dict \{\['pixel_values'\]",
    ),
]


@pytest.mark.parametrize(
    "area, what, call, kind, pattern", ERROR_CASES, ids=[c[1] for c in ERROR_CASES]
)
def test_bad_input_raises_a_clear_error(area, what, call, kind, pattern):
    with pytest.raises(kind, match=pattern):
        call()
