"""Every method, calibrator and application with the model and the data on different devices.

Three placements, as users hit them: CPU data with the model on the GPU (what a `DataLoader`
yields), GPU data with a GPU model, GPU data with a CPU model. On a machine with CUDA the GPU is
the real one; elsewhere (CI) it is `fakegpu` (tests/fake_gpu.py): a second device that keeps
its values on the CPU and raises where CUDA would, so placement is checked everywhere and the
numbers must equal the CPU's exactly. On CUDA they agree within `GPU_TOL`: TF32 convolutions
and matrix products (on by default for convolutions) round to 10 bits of mantissa, which moved
PEG-5's probabilities by up to 2e-3 on a CIFAR-10 CNN; these tests switch TF32 off, leaving the
order of reductions, 1e-4 on probabilities over a few hundred float32 terms.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg

from conftest import CUDA, overfit

GPU_TOL = 1e-4 if CUDA else 1e-6
# K-FAC's damped solve amplifies float32 rounding: on an AVX-512 EPYC one of its products takes
# another kernel for the fake device's operands, and last-layer PEG-4's directions differ by
# 3.5e-7 (of 0.03), 2.2e-6 on probabilities at its η = 44 (the CPU's numbers, not placement)
KFAC_TOL = max(GPU_TOL, 1e-5)
PLACEMENTS = ["cpu-data+gpu-model", "gpu-data+gpu-model", "gpu-data+cpu-model"]


class Net(nn.Module):
    """A small CNN with BatchNorm and dropout: every layer kind peg treats specially."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    X = torch.randn(n, 1, 6, 6, generator=g) + y[:, None, None, None].float()
    return X, y


@pytest.fixture(scope="module")
def trained() -> nn.Module:
    torch.manual_seed(0)
    return overfit(Net(), *data(96, 0), steps=30)


def place(placement: str, model: nn.Module, device: torch.device, *sets: Any) -> list[Any]:
    """The model and the data sets where `placement` puts them (copies; the CPU originals stay)."""
    model_on, data_on = placement.split("+")[1], placement.split("+")[0]
    model = copy.deepcopy(model).to(device if model_on == "gpu-model" else "cpu")
    where = device if data_on == "gpu-data" else torch.device("cpu")
    return [model, *[tuple(t.to(where) for t in s) for s in sets]]


def cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu")


def pegs(**options: Any) -> Callable[[nn.Module, Any], Any]:
    return lambda m, v: peg.PEG(n_members=4, grad_batch_size=8, seed=0, **options).fit(m, v)


FITS: dict[str, Callable[[nn.Module, Any], Any]] = {
    "TS": lambda m, v: peg.TemperatureScaling().fit(m, v),
    "Vector scaling": lambda m, v: peg.VectorScaling().fit(m, v),
    "Matrix scaling": lambda m, v: peg.MatrixScaling().fit(m, v),
    "Dirichlet": lambda m, v: peg.DirichletCalibration().fit(m, v),
    "Hist. binning": lambda m, v: peg.HistogramBinning().fit(m, v),
    "Isotonic": lambda m, v: peg.IsotonicCalibration().fit(m, v),
    "Spline": lambda m, v: peg.SplineCalibration().fit(m, v),
    "Ensemble TS": lambda m, v: peg.EnsembleTemperatureScaling().fit(m, v),
    "Order-preserving": lambda m, v: peg.OrderPreservingScaling().fit(m, v),
    "PEG-4": pegs(eta=0.01),
    "PEG-4 search": pegs(),
    "PEG-4 diag": pegs(precondition="diag"),
    "PEG-4 kfac weights": pegs(precondition="kfac", params="weights"),
    "PEG-4 unbiased": pegs(variant="unbiased"),
    "PEG-4 lazy": pegs(lazy=True),
    "Last-layer PEG-4": pegs(params="last_layer"),
    "Last-layer PEG-4 kfac": pegs(params="last_layer", precondition="kfac"),
    "PEP-4": lambda m, v: peg.PEP(n_members=4, seed=0).fit(m, v),
    "MC dropout-4": lambda m, v: peg.MCDropout(n_members=4, seed=0).fit(m, v),
    "Conformal APS": lambda m, v: peg.ConformalClassifier(alpha=0.2, score="aps").fit(m, v),
}


STOCHASTIC = {"MC dropout-4"}  # SampledDropout draws its masks by another kernel off the CPU


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("name", list(FITS))
def test_every_method_fits_and_predicts_in_every_placement(name, placement, gpu, trained):
    val, test = data(64, 1), data(32, 2)
    model, val_on, test_on = place(placement, trained, gpu, val, test)
    if name in STOCHASTIC:  # masks drawn on another device differ: compare on the model's
        reference = FITS[name](*place("gpu-data+gpu-model", trained, gpu, val)).predict_proba
        if placement.endswith("cpu-model"):
            reference = FITS[name](copy.deepcopy(trained), val).predict_proba
        expected = cpu(reference(test_on[0]))
    else:
        expected = FITS[name](copy.deepcopy(trained), val).predict_proba(test[0])
    fitted = FITS[name](model, val_on)
    loader = DataLoader(TensorDataset(*test_on), batch_size=10)
    for X in (test_on[0],) if name in STOCHASTIC else (test_on[0], loader):  # masks per batch
        probs = fitted.predict_proba(X)
        assert probs.shape == (32, 3)
        tol = KFAC_TOL if "kfac" in name else GPU_TOL
        torch.testing.assert_close(cpu(probs), expected, atol=tol, rtol=0)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_evaluate_and_conformal_sets_in_every_placement(placement, gpu, trained):
    val, test = data(64, 1), data(32, 2)
    model, val_on, test_on = place(placement, trained, gpu, val, test)
    expected = peg.evaluate(peg.TemperatureScaling().fit(copy.deepcopy(trained), val), *test)
    got = peg.evaluate(peg.TemperatureScaling().fit(model, val_on), *test_on)
    assert got == pytest.approx(expected, abs=1e-5)
    loader = DataLoader(TensorDataset(*test_on), batch_size=10)
    assert peg.evaluate(model, loader) == pytest.approx(peg.evaluate(trained, *test), abs=1e-5)
    conformal = peg.ConformalClassifier(alpha=0.2, score="lac").fit(model, val_on)
    reference = peg.ConformalClassifier(alpha=0.2, score="lac").fit(trained, val)
    sets, expected_sets = cpu(conformal.predict_set(test_on[0])), reference.predict_set(test[0])
    # another device's kernels round otherwise: a score within that of q̂ may go either way
    scores = 1 - reference.predict_proba(test[0]).double()  # the "lac" score
    near = (scores - torch.as_tensor(reference.quantile_).double()).abs() <= GPU_TOL
    assert torch.equal(sets[~near], expected_sets[~near])


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_training_time_methods_in_every_placement(placement, gpu):
    train = data(64, 3)
    recipe = peg.train.Recipe(epochs=3, batch_size=32, lr=0.01, schedule="swa", swa_start=1,
                              swa_lr=0.01)  # fmt: skip
    model, train_on, test_on = place(placement, Net(), gpu, train, data(16, 4))
    for method in (
        peg.SWAG(recipe=recipe, n_members=3, max_num_models=2, batch_size=16),
        peg.SWAG(recipe=recipe, n_members=3, diag=True, batch_size=16),
        peg.DeepEnsemble(n_members=2, recipe=recipe),
    ):
        fitted = method.fit(copy.deepcopy(model), train_on)
        probs = fitted.predict_proba(test_on[0])
        assert probs.shape == (16, 3) and torch.isfinite(cpu(probs)).all()


def archives() -> dict[str, Callable[[nn.Module, Any], Any]]:
    return {
        "PEG recipe": pegs(eta=0.01),
        "PEG materialized": pegs(eta=0.01),
        "TS": FITS["TS"],
        "Dirichlet": FITS["Dirichlet"],
        "Conformal APS": FITS["Conformal APS"],
    }


@pytest.mark.parametrize("load_on", ["cpu", "gpu"])
@pytest.mark.parametrize("save_on", ["cpu", "gpu"])
@pytest.mark.parametrize("name", list(archives()))
def test_archives_load_on_the_device_of_the_model_given(name, save_on, load_on, gpu, trained,
                                                        tmp_path):  # fmt: skip
    val, test = data(64, 1), data(32, 2)
    where = {"cpu": torch.device("cpu"), "gpu": gpu}
    model = copy.deepcopy(trained).to(where[save_on])
    val_on = tuple(t.to(where[save_on]) for t in val)
    fitted = archives()[name](model, val_on)
    path = fitted.save(str(tmp_path / "a"), **({"materialize": True} if "mater" in name else {}))
    target = copy.deepcopy(trained).to(where[load_on])
    back = peg.load(path, target, val=tuple(t.to(where[load_on]) for t in val))
    probs = back.predict_proba(test[0])
    assert probs.device == where[load_on]
    torch.testing.assert_close(cpu(probs), cpu(fitted.predict_proba(test[0])), atol=GPU_TOL,
                               rtol=0)  # fmt: skip


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_compare_and_autoselect_in_every_placement(placement, gpu, trained, tmp_path):
    val, test = data(300, 1), data(32, 2)
    model, val_on, test_on = place(placement, trained, gpu, val, test)
    loader = DataLoader(TensorDataset(*val_on), batch_size=50)
    methods = ["TS", "PEG", "Last-layer PEG", "MC dropout", "PEG + TS"]
    table = peg.compare(model, loader, test_on, methods, out=tmp_path / "c", say=None,
                        batch_fn=lambda b: (b[0], b[1]))  # fmt: skip
    failed = {r["method"]: r["failed"] for r in table.table if "failed" in r}
    assert not failed
    chosen = peg.AutoSelect(candidates=["TS", "Vector scaling", "PEG"], cv=2,
                            batch_fn=lambda b: (b[0], b[1])).fit(model, loader)  # fmt: skip
    assert chosen.predict_proba(test_on[0]).shape == (32, 3)



class CudnnRefuses(nn.Module):
    """A model whose forward fails under vmap as cuDNN does on ResNet-50 (batched convolutions
    CUDNN_STATUS_NOT_SUPPORTED), and runs otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch._C._functorch.is_batchedtensor(self.linear.weight):
            raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.")
        return self.linear(x)


def test_vmap_refused_by_cudnn_is_a_clear_error_and_auto_loops():
    torch.manual_seed(0)
    ensemble = peg.Ensemble.from_models([CudnnRefuses(), CudnnRefuses()])
    X = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"strategy='vmap': cuDNN cannot run .*'loop'"):
        ensemble.member_logits(X, strategy="vmap")
    expected = ensemble.member_logits(X, strategy="loop")
    torch.testing.assert_close(ensemble.member_logits(X, strategy="auto"), expected)


def test_a_recipe_rebuilt_with_rounding_in_another_order_passes_its_check():
    """What non-deterministic kernels do to a rebuilt recipe: every entry of a member's
    displacement moved by a relative 1e-6 (float32 rounding in another order). A member almost
    orthogonal to the fingerprint's probe has a projection whose terms nearly cancel: relatively
    to itself it moves by more than 1e-4 (the old check refused it), on the scale of its norm
    by ~1e-6. Members made from other mini-batches are still refused, and TF32 rounding
    (~1e-3) passes only where the recipe or the rebuild used TF32."""
    from peg.recipe import TOLERANCE, fingerprint_probe, fingerprints_match, tolerance
    from peg.recipe import displacement_fingerprints as fingerprints

    g = torch.Generator().manual_seed(0)
    P = 100_000
    probe = fingerprint_probe(P)
    D = torch.randn(3, P, generator=g)
    D -= (1 - 1e-5) * (D @ probe)[:, None] * probe / probe.dot(probe)  # nearly orthogonal
    noisy = D * (1 + 1e-6 * torch.randn(3, P, generator=g))
    saved, rebuilt = fingerprints([D], 0.01), fingerprints([noisy], 0.01)
    relative = max(abs(a[0] - b[0]) / abs(a[0]) for a, b in zip(saved, rebuilt, strict=True))
    assert relative > TOLERANCE  # the old, relative check refused these members
    assert fingerprints_match(rebuilt, saved, P) == []
    other = fingerprints([torch.randn(3, P, generator=g)], 0.01)
    assert fingerprints_match(other, saved, P) == [0, 1, 2]
    tf32 = fingerprints([D * (1 + 1e-3 * torch.randn(3, P, generator=g))], 0.01)
    assert fingerprints_match(tf32, saved, P, tolerance("fp32", "fp32")) != []
    assert fingerprints_match(tf32, saved, P, tolerance("tf32", "fp32")) == []


def test_a_pinned_multi_worker_loader_feeds_a_gpu_model(gpu, trained):
    """What a training script hands peg: a DataLoader with workers and pinned memory (CPU
    tensors, pinned where CUDA is), for fitting and predicting."""
    val, test = data(64, 1), data(32, 2)
    model = copy.deepcopy(trained).to(gpu)
    loader = DataLoader(TensorDataset(*val), batch_size=16, num_workers=2, pin_memory=CUDA)
    fitted = pegs(eta=0.01)(model, loader)
    expected = pegs(eta=0.01)(copy.deepcopy(trained), val).predict_proba(test[0])
    tests = DataLoader(TensorDataset(*test), batch_size=8, num_workers=2, pin_memory=CUDA)
    torch.testing.assert_close(cpu(fitted.predict_proba(tests)), expected, atol=GPU_TOL, rtol=0)
    assert peg.evaluate(fitted, tests)["nll"] == pytest.approx(
        peg.evaluate(fitted, test_on_cpu := test[0], test[1])["nll"], abs=1e-5
    ) and test_on_cpu.device.type == "cpu"


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_huggingface_dict_batches_in_every_placement(placement, gpu):
    """A tiny ViT and BERT from transformers with HuggingFace's dict batches: TS, last-layer
    PEG and compare, the batches' tensors moved whole."""
    from tiny_hf import Items, bert, images, tokens, vit

    for build, make in ((vit, images), (bert, tokens)):
        torch.manual_seed(0)
        base = build().eval()
        val_items, test_items = make(64, 1), make(16, 2)
        model = copy.deepcopy(base).to(gpu if placement.endswith("gpu-model") else "cpu")
        where = gpu if placement.startswith("gpu-data") else torch.device("cpu")
        val = DataLoader(Items({k: v.to(where) for k, v in val_items.items()}), batch_size=16)
        test = DataLoader(Items({k: v.to(where) for k, v in test_items.items()}), batch_size=8)
        for fit in (FITS["TS"], pegs(params="last_layer")):
            reference = fit(copy.deepcopy(base), DataLoader(Items(val_items), batch_size=16))
            expected = reference.predict_proba(DataLoader(Items(test_items), batch_size=8))
            probs = fit(model, val).predict_proba(test)
            torch.testing.assert_close(cpu(probs), expected, atol=GPU_TOL, rtol=0)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_laplace_in_every_placement(placement, gpu):
    pytest.importorskip("laplace")
    if not CUDA and placement.endswith("gpu-model"):
        pytest.skip("laplace-torch's backends take no FakeGpu parameters (checked on CUDA)")
    torch.manual_seed(0)  # laplace-torch's backends take Linear/Conv layers, not BatchNorm
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(36, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    val, test = data(64, 1), data(32, 2)
    model, val_on, test_on = place(placement, mlp, gpu, val, test)
    probs = peg.Laplace().fit(model, val_on).predict_proba(test_on[0])
    expected = peg.Laplace().fit(copy.deepcopy(mlp), val).predict_proba(test[0])
    torch.testing.assert_close(cpu(probs), expected, atol=max(GPU_TOL, 1e-5), rtol=0)
