"""What users pass in, read as scikit-learn reads it: array-likes (lists, pandas objects) as
arrays, the output in the input's type; labels that name their classes mapped by `classes=`,
refused clearly without it; whole-number float labels read as class labels by one rule
(`evaluate`, the fits, `compare`); big-endian arrays byte-swapped; hints written for the type
the user passed (a NumPy array has no `.unsqueeze`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg
from bad_inputs import _mlp, _val, raises_test
from peg.apps.compare import compare
from peg.source import Source

NAMES = ["cat", "dog", "eel"]


def _logits(n: int = 300, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    y = g.integers(0, classes, n)
    logits = g.normal(size=(n, classes)) + 1.5 * np.eye(classes)[y]
    return logits.astype(np.float32), y


def _named() -> tuple[np.ndarray, np.ndarray]:
    logits, y = _logits()
    return logits, np.asarray(NAMES)[y]


def _fit_warned_free(make: Callable[[], object]) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()


STRINGS = (
    r"expected numbers, got strings \('.*'(, \.\.\.)?\); string labels: pass classes=\[\.\.\.\] "
    r"to say"
)

ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    (
        "calibrators",
        "string labels without classes=",
        lambda: peg.TemperatureScaling().fit(*_named()),
        TypeError,
        "labels: " + STRINGS,
    ),
    (
        "calibrators",
        "string labels of a pair (X, y) without classes=",
        lambda: peg.TemperatureScaling().fit(_mlp(), (_val()[0], np.asarray(NAMES)[_val()[1]])),
        TypeError,
        "val labels: " + STRINGS,
    ),
    (
        "evaluate",
        "string labels without classes=",
        lambda: peg.evaluate(_mlp(), _val()[0], list(np.asarray(NAMES)[_val()[1]])),
        TypeError,
        "y: " + STRINGS,
    ),
    (
        "metrics",
        "string labels",
        lambda: peg.metrics.nll(np.full((2, 3), 1 / 3), np.array(["a", "b"])),
        TypeError,
        "y: " + STRINGS,
    ),
    (
        "calibrators",
        "a label that is none of classes=",
        lambda: peg.TemperatureScaling().fit(
            _named()[0], _named()[1], classes=["cat", "dog", "fox"]
        ),
        ValueError,
        r"labels: label 'eel' \(row \d+\) is none of classes \['cat', 'dog', 'fox'\]",
    ),
    (
        "calibrators",
        "classes= of another count than the logits' columns",
        lambda: peg.TemperatureScaling().fit(*_named(), classes=[*NAMES, "fox"]),
        ValueError,
        r"classes: names 4 classes, but the logits have 3 columns",
    ),
    (
        "calibrators",
        "classes= naming a class twice",
        lambda: peg.TemperatureScaling().fit(*_named(), classes=["cat", "dog", "cat"]),
        ValueError,
        r"classes: names a class twice",
    ),
    (
        "calibrators",
        "classes= with a loader, whose labels it cannot map",
        lambda: peg.TemperatureScaling().fit(
            _mlp(), DataLoader(TensorDataset(*_val()), batch_size=50), classes=NAMES
        ),
        ValueError,
        r"classes: maps the labels of a pair \(val as \(X, y\)\) or of fit\(logits, labels\); "
        r"a loader's or a Dataset's labels must be class indices",
    ),
    (
        "LabelShift",
        "integer target logits",
        lambda: peg.LabelShift().fit(*_logits(), target=np.ones((50, 3), np.int64)),
        ValueError,
        r"target: expected floating-point logits \[N, C\] like the validation logits \(a 2-D "
        r"tensor or array\), got shape \(50, 3\) and dtype int64",
    ),
    (
        "metrics",
        "probabilities not summing to 1, as a NumPy array",
        lambda: peg.metrics.nll(np.full((2, 3), 0.5), np.array([0, 1])),
        ValueError,
        r"e\.g\. logits\[None\] \(np\.expand_dims\(logits, 0\)\)$",
    ),
    (
        "ood",
        "mutual information without members, as a NumPy array",
        lambda: peg.metrics.mutual_information(np.full((2, 3), 1 / 3)),
        ValueError,
        r"pass a single model's logits as logits\[None\] \(np\.expand_dims",
    ),
    (
        "evaluate",
        "a model of one output column (a binary scorer)",
        lambda: peg.evaluate(
            torch.nn.Linear(2, 1), torch.zeros(5, 2), torch.tensor([0, 1, 0, 1, 0])
        ),
        ValueError,
        r"predictor: gives 1 column of logits \[N, 1\], a binary scorer, which evaluate "
        r"reads as saved scores: evaluate\(scores, labels\)",
    ),
    (
        "evaluate",
        "float targets that are not class indices, for a classifier",
        lambda: peg.evaluate(_mlp(), _val()[0], _val()[1].float() + 0.5),
        ValueError,
        r"y: floating-point targets that are not class indices \(whole numbers in "
        r"\[0, 3\)\) mean regression, which needs Gaussian heads",
    ),
    (
        "TemperatureScaling",
        "validation labels of one class only",
        lambda: peg.TemperatureScaling().fit(
            _mlp(), (_val()[0], torch.ones(200, dtype=torch.long))
        ),
        ValueError,
        r"val labels: every label is 1 \(one class only\): temperature scaling cannot "
        r"learn a map",
    ),
    (
        "calibrators",
        "saved logits with labels of one class only",
        lambda: peg.VectorScaling().fit(_logits()[0], np.zeros(300, np.int64)),
        ValueError,
        r"val labels: every label is 0 \(one class only\)",
    ),
]
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


# --- array-likes ---------------------------------------------------------------------------------


def test_lists_and_pandas_objects_are_read_as_arrays_and_give_numpy_back():
    pd = pytest.importorskip("pandas")
    logits, y = _logits()
    want = peg.TemperatureScaling().fit(logits, y)
    for X, labels in [
        (logits.tolist(), y.tolist()),
        (pd.DataFrame(logits), pd.Series(y)),
        (logits, tuple(y.tolist())),
    ]:
        ts = peg.TemperatureScaling().fit(X, labels)
        assert ts.temperature_ == pytest.approx(want.temperature_, rel=1e-6)
        probs = ts.predict_proba(X)
        assert isinstance(probs, np.ndarray) and probs.shape == (300, 3)
        np.testing.assert_allclose(probs, want.predict_proba(logits), rtol=1e-6)
    assert isinstance(want.predict_proba(torch.from_numpy(logits)), torch.Tensor)
    # two rows of logits as a list are rows, not a pair (X, y)
    assert want.predict_proba(logits[:2].tolist()).shape == (2, 3)
    assert peg.evaluate(logits.tolist(), pd.Series(y)) == peg.evaluate(logits, y)
    # a nullable integer column and a categorical one are read as their values' type
    nullable = peg.TemperatureScaling().fit(logits, pd.Series(y, dtype="Int64"))
    assert nullable.temperature_ == want.temperature_
    names = pd.Series(np.asarray(NAMES)[y], dtype="category")
    named = peg.TemperatureScaling().fit(logits, names, classes=pd.Index(NAMES))
    assert named.temperature_ == want.temperature_
    X, labels = _val()
    model = _mlp()
    assert peg.evaluate(model, X, labels.tolist()) == peg.evaluate(model, X, labels)


def test_string_labels_are_mapped_by_classes_where_labels_are_read():
    logits, y = _logits()
    names = np.asarray(NAMES)[y]
    ts = peg.TemperatureScaling().fit(logits, list(names), classes=NAMES)
    assert ts.temperature_ == peg.TemperatureScaling().fit(logits, y).temperature_
    reversed_ = peg.TemperatureScaling().fit(logits[:, ::-1].copy(), names, classes=NAMES[::-1])
    assert reversed_.temperature_ == pytest.approx(ts.temperature_, rel=1e-6)
    cp = peg.ConformalClassifier(alpha=0.2).fit(logits, names, classes=NAMES)
    assert float(cp.quantile_) == float(peg.ConformalClassifier(alpha=0.2).fit(logits, y).quantile_)
    shift = peg.LabelShift().fit(logits, names, target=logits[:100], classes=NAMES)
    want = peg.LabelShift().fit(logits, y, target=logits[:100])
    torch.testing.assert_close(shift.priors_, want.priors_)
    assert peg.evaluate(logits, names, classes=NAMES) == peg.evaluate(logits, y)
    X, labels = _val()
    model = _mlp()
    got = peg.evaluate(model, X, np.asarray(NAMES)[labels.numpy()], classes=NAMES)
    assert got == peg.evaluate(model, X, labels)
    fitted = peg.TemperatureScaling().fit(model, (X, np.asarray(NAMES)[labels]), classes=NAMES)
    assert fitted.temperature_ == peg.TemperatureScaling().fit(model, (X, labels)).temperature_


# --- whole-number float labels: one rule -------------------------------------------------------


def test_whole_number_float_labels_are_class_labels_in_evaluate_fit_and_compare():
    X, y = _val()
    model = _mlp()
    want = peg.evaluate(model, X, y)
    assert peg.evaluate(model, X, y.double()) == want
    assert peg.evaluate(model, X, y.numpy().astype(np.float32)) == want
    loader = DataLoader(TensorDataset(X, y.float()), batch_size=64)
    assert peg.evaluate(model, loader) == pytest.approx(want)
    ts = peg.TemperatureScaling().fit(model, (X, y.float()))
    assert ts.temperature_ == peg.TemperatureScaling().fit(model, (X, y)).temperature_
    peg_float = peg.PEG(n_members=2, eta=0.1, progress=False).fit(model, (X, y.float()))
    peg_int = peg.PEG(n_members=2, eta=0.1, progress=False).fit(model, (X, y))
    torch.testing.assert_close(peg_float.member_logits(X), peg_int.member_logits(X))
    out = compare(
        model,
        (X, y.float()),
        DataLoader(TensorDataset(X, y.float()), batch_size=50),
        ["TS", "Dirichlet"],
        say=None,
        progress=False,
    )
    assert not out.failed
    assert [r["nll"] for r in out.table] == pytest.approx(
        [
            r["nll"]
            for r in compare(
                model, (X, y), (X, y), ["TS", "Dirichlet"], say=None, progress=False
            ).table
        ]
    )


def test_regression_targets_stay_regression():
    torch.manual_seed(0)
    head = nn.Linear(2, 2)  # a Gaussian head: mean, log-variance
    X = torch.randn(100, 2)
    result = peg.evaluate(head, X, torch.randn(100))
    assert set(result) >= {"rmse", "lpd"}
    # whole-number targets beyond the classes' range are not class labels either
    assert "rmse" in peg.evaluate(head, X, torch.randint(0, 40, (100,)).float() + 2)


# --- saved probabilities: the fix for arrays -----------------------------------------------------


def test_saved_probabilities_are_told_to_take_their_log():
    logits, y = _logits()
    probs = torch.from_numpy(logits).softmax(-1).numpy()
    for fit in (
        lambda: peg.TemperatureScaling().fit(probs, y),
        lambda: peg.ConformalClassifier().fit(probs, y),
        lambda: compare(probs, y, (probs, y), ["TS"], say=None, progress=False),
        lambda: peg.AutoSelect(candidates=["TS"], cv=2, progress=False).fit(
            nn.Identity(), (probs, y)
        ),
    ):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fit()
        said = [str(w.message) for w in seen]
        assert any(
            s.startswith("logits: the saved values look like probabilities")
            and "np.log(probs)" in s
            for s in said
        ), said
        assert not any("with_output" in s for s in said)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # their log: no warning
        peg.TemperatureScaling().fit(np.log(probs), y)


def test_hints_are_written_for_the_type_passed():
    bad = np.full((2, 3), 0.5)
    with pytest.raises(ValueError, match=r"e\.g\. logits\.unsqueeze\(0\)$"):
        peg.metrics.nll(torch.from_numpy(bad), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"logits\[None\]") as e:
        peg.metrics.nll(bad, np.array([0, 1]))
    assert "unsqueeze" not in str(e.value)


# --- big-endian arrays ---------------------------------------------------------------------------


def test_big_endian_arrays_are_read_as_native_ones(tmp_path):
    logits, y = _logits()
    big, big_y = logits.astype(">f4"), y.astype(">i8")
    want = peg.TemperatureScaling().fit(logits, y)
    ts = peg.TemperatureScaling().fit(big, big_y)
    assert ts.temperature_ == want.temperature_
    np.testing.assert_array_equal(ts.predict_proba(big), want.predict_proba(logits))
    assert peg.evaluate(big, big_y) == peg.evaluate(logits, y)
    assert peg.metrics.nll(big[None], big_y) == peg.metrics.nll(logits[None], y)
    np.save(tmp_path / "l.npy", big)
    mapped = np.load(tmp_path / "l.npy", mmap_mode="r")
    assert not mapped.dtype.isnative
    np.testing.assert_array_equal(ts.predict_proba(mapped), want.predict_proba(logits))
    batches = [x for x, _ in Source(mapped).batches(128)]  # swapped a batch at a time
    assert [len(b) for b in batches] == [128, 128, 44] and batches[0].dtype == torch.float32
    torch.testing.assert_close(torch.cat(batches), torch.from_numpy(logits))


# --- saved logits that require grad --------------------------------------------------------------


def test_saved_logits_that_require_grad_are_read_as_data():
    logits, y = _logits()
    t = torch.from_numpy(logits).requires_grad_(True)
    op = peg.OrderPreservingScaling().fit(t, torch.from_numpy(y))
    want = peg.OrderPreservingScaling().fit(torch.from_numpy(logits), torch.from_numpy(y))
    torch.testing.assert_close(op.predict_proba(t), want.predict_proba(torch.from_numpy(logits)))
