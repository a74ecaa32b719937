"""Arrays first: `fit(logits, labels)` with tensors, NumPy arrays or a memory-mapped `.npy` on
every calibrator, `ConformalClassifier`, `LabelShift`, `AutoSelect` and `evaluate` (as
`fit(nn.Identity(), (logits, labels))`, the one path: `peg.methods._predictors.read_predictor`),
the output in the input's type (NumPy in, NumPy out), and temperature scaling against
scikit-learn's `CalibratedClassifierCV(FrozenEstimator(...), method="temperature")`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import sklearn
import torch
from torch import nn

import peg
from bad_inputs import raises_test
from peg.methods._predictors import SavedLogits

C = 5


def saved(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    return torch.randn(n, C, generator=g) * 2 + 3 * nn.functional.one_hot(y, C), y


CALIBRATORS: dict[str, Callable[[], object]] = {
    "TS": peg.TemperatureScaling,
    "Vector scaling": peg.VectorScaling,
    "Matrix scaling": peg.MatrixScaling,
    "Dirichlet": peg.DirichletCalibration,
    "Hist. binning": peg.HistogramBinning,
    "Isotonic": peg.IsotonicCalibration,
    "Spline": peg.SplineCalibration,
    "Ensemble TS": peg.EnsembleTemperatureScaling,
    "Order-preserving": peg.OrderPreservingScaling,
    "Conformal": lambda: peg.ConformalClassifier(alpha=0.1, score="aps"),
}


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_fit_on_arrays_is_fit_on_nn_identity_and_numpy_comes_back(name):
    (X, y), (Xt, _) = saved(300, 0), saved(60, 1)
    reference = CALIBRATORS[name]().fit(nn.Identity(), (X, y))
    fitted = CALIBRATORS[name]().fit(X.numpy(), y.numpy())
    assert isinstance(fitted.predictor_, SavedLogits)  # what it was fitted on, recorded
    probs = fitted.predict_proba(Xt.numpy())
    assert isinstance(probs, np.ndarray) and probs.shape == (60, C)
    np.testing.assert_allclose(probs, reference.predict_proba(Xt).numpy(), atol=1e-6)
    predicted = fitted.predict(Xt.numpy())
    assert isinstance(predicted, np.ndarray) and predicted.dtype == np.int64
    on_tensors = CALIBRATORS[name]().fit(X, y)  # tensors in, tensors out
    assert isinstance(on_tensors.predict_proba(Xt), torch.Tensor)


def test_a_memory_mapped_npy_is_read_as_nn_identitys_and_saved_as_a_map_alone(tmp_path):
    (X, y), (Xt, _) = saved(300, 0), saved(60, 1)
    np.save(tmp_path / "val.npy", X.numpy())
    mapped = np.load(tmp_path / "val.npy", mmap_mode="r")
    ts = peg.TemperatureScaling().fit(mapped, y.numpy())
    assert ts.temperature_ == peg.TemperatureScaling().fit(nn.Identity(), (X, y)).temperature_
    header = peg.archive.read_header(ts.save(tmp_path / "ts.peg"))
    assert header["meta"]["inputs"] == "logits" and header["stacked"] == []
    np.testing.assert_array_equal(peg.load(tmp_path / "ts.peg").predict_proba(Xt.numpy()),
                                  ts.predict_proba(Xt.numpy()))  # fmt: skip


def test_conformal_sets_follow_the_input_type():
    (X, y), (Xt, _) = saved(300, 0), saved(60, 1)
    sets = peg.ConformalClassifier(alpha=0.1).fit(X.numpy(), y.numpy())
    as_numpy = sets.predict_set(Xt.numpy())
    assert isinstance(as_numpy, np.ndarray) and as_numpy.dtype == np.bool_
    np.testing.assert_array_equal(as_numpy, sets.predict_set(Xt).numpy())


def test_label_shift_fits_on_logits_labels_and_target_logits():
    (X, y), (Xt, _) = saved(300, 0), saved(200, 1)
    reference = peg.LabelShift().fit(nn.Identity(), (X, y), target=Xt)
    fitted = peg.LabelShift().fit(X.numpy(), y.numpy(), target=Xt.numpy())
    torch.testing.assert_close(fitted.priors_, reference.priors_)
    assert isinstance(fitted.predict_proba(Xt.numpy()), np.ndarray)


def test_evaluate_takes_logits_and_labels_and_gives_floats():
    Xt, yt = saved(100, 1)
    reference = peg.evaluate(nn.Identity(), Xt, yt)
    for got in (peg.evaluate(Xt.numpy(), yt.numpy()), peg.evaluate(Xt, yt)):
        assert got == pytest.approx(reference)
        assert all(type(v) is float for v in got.values())


def test_autoselect_fits_on_logits_and_labels():
    X, y = saved(300, 0)
    chosen = peg.AutoSelect(candidates=["TS", "Vector scaling"], cv=2, progress=False)
    chosen.fit(X.numpy(), y.numpy())
    assert isinstance(chosen.predict_proba(X[:5].numpy()), np.ndarray)
    reference = peg.AutoSelect(candidates=["TS", "Vector scaling"], cv=2, progress=False)
    assert chosen.chosen_ == reference.fit(nn.Identity(), (X, y)).chosen_


def test_a_model_is_read_as_before():
    """`fit(model, val)` unchanged: a module with parameters stays the predictor."""
    X, y = saved(300, 0)
    model = nn.Linear(C, C)
    with torch.no_grad():
        model.weight.copy_(torch.eye(C))
    ts = peg.TemperatureScaling().fit(model, (X, y))
    assert ts.predictor_ is model


def _frozen_identity_logits(X: np.ndarray, y: np.ndarray):
    """A fitted scikit-learn classifier whose decision function is its input (the logits)."""
    from sklearn.base import BaseEstimator, ClassifierMixin

    class Logits(ClassifierMixin, BaseEstimator):
        def fit(self, X, y):
            self.classes_ = np.unique(y)
            return self

        def decision_function(self, X):
            return np.asarray(X, dtype=np.float64)

        def predict(self, X):
            return self.classes_[np.argmax(X, axis=1)]

    return Logits().fit(X, y)


def test_temperature_scaling_agrees_with_scikit_learns():
    """CalibratedClassifierCV(FrozenEstimator(...), method="temperature") (scikit-learn >= 1.8)
    fits the same temperature on the same logits: probabilities within 1e-6."""
    try:
        from sklearn.calibration import CalibratedClassifierCV
        from sklearn.frozen import FrozenEstimator

        CalibratedClassifierCV(method="temperature")._validate_params()
    except (ImportError, ValueError) as e:
        pytest.skip(f"scikit-learn {sklearn.__version__} has no temperature scaling ({e})")
    (X, y), (Xt, _) = saved(1000, 0), saved(300, 1)
    X, Xt = X.double().numpy() * 1.7, Xt.double().numpy() * 1.7  # over-confident
    frozen = FrozenEstimator(_frozen_identity_logits(X, y.numpy()))
    theirs = CalibratedClassifierCV(frozen, method="temperature").fit(X, y.numpy())
    ours = peg.TemperatureScaling().fit(X, y.numpy())
    np.testing.assert_allclose(ours.predict_proba(Xt), theirs.predict_proba(Xt), atol=1e-6)
    beta = theirs.calibrated_classifiers_[0].calibrators[0].beta_
    assert ours.temperature_ == pytest.approx(1 / float(beta), rel=1e-5)


def _logits() -> np.ndarray:
    return saved(20, 0)[0].numpy()


def _labels() -> np.ndarray:
    return saved(20, 0)[1].numpy()


def _nan_logits() -> np.ndarray:
    logits = _logits().copy()
    logits[3, 1] = np.nan
    return logits


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    ("calibrators", "fit(logits, labels): member logits [1, N, C] (read as dense [B, C, *S])",
     lambda: peg.TemperatureScaling().fit(_logits()[None], _labels()),
     ValueError,
     r"labels: expected 1 labels \[N\] for logits of shape \(1, 20, 5\), got shape \(20,\)"),
    ("calibrators", "fit(logits, labels): labels first",
     lambda: peg.TemperatureScaling().fit(_labels(), _logits()),
     ValueError, r"logits: expected floating-point logits \[N, C\] .* got shape \(20,\)"),
    ("calibrators", "fit(logits, labels): a label short",
     lambda: peg.TemperatureScaling().fit(_logits(), _labels()[:-1]),
     ValueError, r"labels: expected 20 labels \[N\] for logits of shape \(20, 5\), got shape "
     r"\(19,\)"),
    ("calibrators", "fit(logits, labels): NaN among the logits",
     lambda: peg.VectorScaling().fit(_nan_logits(), _labels()),
     ValueError, r"logits: the inputs contain NaN or inf \(1 of 20 samples\)"),
    ("calibrators", "fit(logits) without labels",
     lambda: peg.TemperatureScaling().fit(_logits()),
     ValueError, r"labels: fit\(logits, labels\) needs the labels \[N\]"),
    ("calibrators", "fit(logits, (X, y)): a pair for labels",
     lambda: peg.TemperatureScaling().fit(_logits(), (_logits(), _labels())),
     TypeError, r"labels: expected class labels \[N\] .* got tuple"),
    ("calibrators", "fit(a set, labels): neither a module nor logits",
     lambda: peg.TemperatureScaling().fit({1.0, 2.0}, _labels()),
     TypeError, r"predictor: expected an nn.Module or an object with member_logits\(X\) .*, or "
     r"logits \[N, C\] \(a tensor, a NumPy array or an array-like\) .* got set"),
    ("conformal", "fit(logits, labels): a label short",
     lambda: peg.ConformalClassifier().fit(_logits(), _labels()[:-1]),
     ValueError, r"labels: expected 20 labels"),
    ("evaluate", "evaluate(logits, labels): scores [N] and labels of another length",
     lambda: peg.evaluate(_logits()[0], _labels()),
     ValueError, r"X: 5 rows of logits \(5,\) but labels of shape \(20,\)"),
    ("evaluate", "evaluate(logits, X, y): labels given twice",
     lambda: peg.evaluate(_logits(), _logits(), _labels()),
     ValueError, r"y: evaluate\(logits, labels\) takes the labels second"),
]  # fmt: skip

test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


@pytest.mark.parametrize("name", ["TS", "Spline", "Order-preserving"])
def test_a_map_fitted_on_arrays_is_saved_as_a_map_over_logits(tmp_path, name):
    """`fit(logits, labels)` reads through `SavedLogits` (an `nn.Identity`): its archive is a
    map over logits, loaded with no model or with `nn.Identity()`, not one over a module."""
    z, y = saved(300, 0)
    fitted = CALIBRATORS[name]().fit(z.numpy(), y.numpy())
    fitted.save(tmp_path / "m.peg")
    for model in (None, nn.Identity()):
        loaded = peg.load(tmp_path / "m.peg", model)
        np.testing.assert_allclose(
            loaded.predict_proba(z[:20].numpy()), fitted.predict_proba(z[:20].numpy()), atol=1e-6
        )
