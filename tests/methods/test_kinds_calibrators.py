"""The calibrators on every kind of input (`peg.source._kinds`, `_kinded.py`): binary scores,
multilabel heads (one shared map or one per label), dense maps (images, token sequences) with
ignored labels; fitted on saved arrays and through a model, predictions in the input's shape,
saved and loaded, exported; every refusal names what settles it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg
from bad_inputs import raises_test
from peg.methods.calibration._calibrator import calibrators
from peg.methods.calibration.temperature import fit_temperature


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _binary(n: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Over-confident scores `[N]` (4x the true log-odds) and their 0/1 labels `[N]`."""
    s = torch.randn(n, generator=_g(seed)) * 1.5
    y = (torch.rand(n, generator=_g(seed + 1)) < s.sigmoid()).long()
    return 4 * s, y


def _multilabel(n: int = 300, k: int = 4, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits `[N, K]` whose labels' scales differ per label, multi-hot labels `[N, K]`."""
    s = torch.randn(n, k, generator=_g(seed))
    y = (torch.rand(n, k, generator=_g(seed + 1)) < s.sigmoid()).long()
    return s * torch.linspace(0.5, 4.0, k), y


def _dense(b: int = 6, c: int = 3, h: int = 5, w: int = 4, seed: int = 4):
    """Logits `[B, C, H, W]` and labels `[B, H, W]`, a tenth of them ignored (-100)."""
    z = torch.randn(b, c, h, w, generator=_g(seed))
    y = torch.distributions.Categorical(logits=z.movedim(1, -1)).sample()
    y[torch.rand(b, h, w, generator=_g(seed + 1)) < 0.1] = -100
    return 3 * z, y


def _two_columns(s: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.zeros_like(s), s], -1)


# ---------------------------------------------------------------- binary
@pytest.mark.parametrize("shape", ["[N]", "[N, 1]"])
def test_binary_ts_is_ts_on_zero_and_the_score(shape):
    s, y = _binary()
    scores = s if shape == "[N]" else s[:, None]
    ts = peg.TemperatureScaling().fit(scores, y)
    reference = peg.TemperatureScaling().fit(_two_columns(s), y)
    assert ts.kind_.kind == "binary" and ts.n_classes_ == 2
    assert ts.temperature_ == pytest.approx(reference.temperature_, rel=1e-9)
    assert ts.temperature_ > 2  # the scores were 4x too sharp
    p = ts.predict_proba(scores[:50])
    assert p.shape == scores[:50].shape  # P(y = 1), in the input's shape
    torch.testing.assert_close(p.reshape(-1), reference.predict_proba(_two_columns(s[:50]))[:, 1])
    assert torch.equal(ts.predict(scores[:50]), (p > 0.5).long())
    logits = ts.member_logits(scores[:50])  # native logits: their sigmoid is the prediction
    assert logits.shape == (1, *scores[:50].shape)
    torch.testing.assert_close(logits[0].sigmoid(), p)


def test_binary_labels_may_be_floats_and_ignored():
    s, y = _binary()
    kept = peg.TemperatureScaling().fit(s[:300], y[:300])
    y_float = y.double().clone()
    y_float[300:] = -100  # left out
    ts = peg.TemperatureScaling().fit(s, y_float)
    assert ts.temperature_ == pytest.approx(kept.temperature_, rel=1e-9)


@pytest.mark.parametrize("cls", [peg.IsotonicCalibration, peg.HistogramBinning,
                                 peg.SplineCalibration])  # fmt: skip
def test_the_maps_of_two_columns_work_on_binary_scores(cls):
    s, y = _binary(600)
    fitted = cls().fit(s[:400], y[:400])
    p = fitted.predict_proba(s[400:])
    assert p.shape == (200,) and bool(((p >= 0) & (p <= 1)).all())
    reference = cls().fit(_two_columns(s[:400]), y[:400])
    # the same rows as on [0, s]: the same map (the top-label spline included)
    torch.testing.assert_close(p, reference.predict_proba(_two_columns(s[400:]))[:, 1])
    nll = -(y[400:] * p.clamp(1e-6).log() + (1 - y[400:]) * (1 - p).clamp(1e-6).log()).mean()
    raw = torch.nn.functional.binary_cross_entropy_with_logits(s[400:], y[400:].double())
    assert nll < raw  # calibrating helped over-confident scores


# ---------------------------------------------------------------- multilabel
def test_multilabel_shared_ts_is_one_temperature_on_every_entry():
    s, y = _multilabel()
    ts = peg.TemperatureScaling().fit(s, y)
    rows = _two_columns(s.reshape(-1)).double().log_softmax(-1)
    expected = fit_temperature(rows, y.reshape(-1), label=None)
    assert ts.kind_.kind == "multilabel" and ts.kind_.outputs == 4
    assert ts.temperature_ == pytest.approx(expected, rel=1e-6)
    p = ts.predict_proba(s[:10])
    assert p.shape == (10, 4)
    torch.testing.assert_close(p, (s[:10] / ts.temperature_).sigmoid())
    assert torch.equal(ts.predict(s[:10]), (s[:10] > 0).long())


def test_per_label_fits_one_map_per_label():
    s, y = _multilabel()
    ts = peg.TemperatureScaling(per_label=True).fit(s, y)
    temperatures = [m.temperature_ for m in ts.label_maps_]
    for k, t in enumerate(temperatures):
        alone = peg.TemperatureScaling().fit(s[:, k], y[:, k])
        assert t == pytest.approx(alone.temperature_, rel=1e-9)
    assert temperatures == sorted(temperatures)  # the labels were scaled 0.5 to 4
    p = ts.predict_proba(s[:10])
    torch.testing.assert_close(p, (s[:10] / torch.tensor(temperatures)).sigmoid().float())


def test_per_label_leaves_each_label_s_ignored_entries_out():
    s, y = _multilabel()
    y_ignored = y.clone()
    y_ignored[200:, 1] = -100
    ts = peg.TemperatureScaling(per_label=True).fit(s, y_ignored)
    alone = peg.TemperatureScaling().fit(s[:200, 1], y[:200, 1])
    assert ts.label_maps_[1].temperature_ == pytest.approx(alone.temperature_, rel=1e-9)


# ---------------------------------------------------------------- dense
def test_dense_ts_is_ts_on_the_rows_not_ignored():
    z, y = _dense()
    ts = peg.TemperatureScaling().fit(z, y)
    rows, labels = z.movedim(1, -1).reshape(-1, 3), y.reshape(-1)
    reference = peg.TemperatureScaling().fit(rows[labels != -100], labels[labels != -100])
    assert ts.kind_.kind == "dense" and ts.kind_.width == 3
    assert ts.temperature_ == pytest.approx(reference.temperature_, rel=1e-9)
    p = ts.predict_proba(z)
    assert p.shape == z.shape  # every position predicted, the ignored ones too
    torch.testing.assert_close(p, (z / ts.temperature_).softmax(1))
    assert ts.predict(z).shape == y.shape


def test_dense_ignore_index_is_an_argument():
    z, y = _dense()
    y255 = torch.where(y == -100, 255, y)
    ts = peg.TemperatureScaling(ignore_index=255).fit(z, y255)
    assert ts.temperature_ == pytest.approx(peg.TemperatureScaling().fit(z, y).temperature_)


def test_token_logits_with_the_classes_last():
    tokens, labels = _tokens()
    ts = peg.VectorScaling().fit(tokens, labels)
    assert ts.kind_.class_dim == -1
    assert ts.predict_proba(tokens).shape == tokens.shape
    square = torch.randn(3, 4, 4, generator=_g(9))
    with pytest.raises(ValueError, match="class_dim: logits"):
        peg.TemperatureScaling().fit(square, torch.zeros(3, 4, dtype=torch.long))
    settled = peg.TemperatureScaling(class_dim=-1).fit(square, torch.arange(4).repeat(3, 1))
    assert settled.kind_.class_dim == -1


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """A language model's logits `[B, T, V]` and labels `[B, T]` (some -100)."""
    z, y = _dense(b=4, c=7, h=9, w=1)
    return z[..., 0].movedim(1, -1), y[..., 0]


# ---------------------------------------------------------------- through a model
class _Head(nn.Module):
    """A model returning its inputs reshaped: `[B, *shape]` outputs of any kind."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).reshape(len(x), *self.shape)


@pytest.mark.parametrize(
    ("shape", "data"),
    [
        ((), lambda: _binary()),
        ((1,), lambda: (_binary()[0][:, None], _binary()[1])),
        ((4,), lambda: _multilabel()),
        ((3, 5, 4), lambda: _dense()),
        ((9, 7), lambda: _tokens()),
    ],
    ids=["[B]", "[B, 1]", "[B, K]", "[B, C, H, W]", "[B, T, V]"],
)  # fmt: skip
def test_fit_through_a_model_and_a_loader_is_the_fit_on_its_logits(shape, data):
    logits, y = data()
    model = _Head(shape).eval()
    loader = DataLoader(TensorDataset(logits.reshape(len(logits), -1), y), batch_size=64)
    ts = peg.TemperatureScaling().fit(model, loader)
    on_logits = peg.TemperatureScaling().fit(logits, y)
    assert ts.kind_ == on_logits.kind_
    assert ts.temperature_ == pytest.approx(on_logits.temperature_, rel=1e-6)
    p = ts.predict_proba(loader)
    torch.testing.assert_close(p, on_logits.predict_proba(logits), rtol=1e-5, atol=1e-6)
    assert torch.cat(list(ts.iter_member_logits(loader)), 1).shape == (1, *logits.shape)


# ---------------------------------------------------------------- save, load, export
KINDS: dict[str, Callable[[], tuple[peg.TemperatureScaling, torch.Tensor]]] = {
    "binary": lambda: (peg.IsotonicCalibration().fit(*_binary()), _binary()[0][:20]),
    "multilabel": lambda: (peg.SplineCalibration().fit(*_multilabel()), _multilabel()[0][:20]),
    "per label": lambda: (
        peg.TemperatureScaling(per_label=True).fit(*_multilabel()),
        _multilabel()[0][:20],
    ),
    "isotonic per label": lambda: (
        peg.IsotonicCalibration(per_label=True).fit(*_multilabel()),
        _multilabel()[0][:20],
    ),
    "dense": lambda: (peg.DirichletCalibration().fit(*_dense()), _dense()[0][:2]),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_save_and_load_keep_the_kind(kind, tmp_path):
    fitted, x = KINDS[kind]()
    back = peg.load(fitted.save(tmp_path / "map.peg"))
    assert back.kind_ == fitted.kind_ and back.per_label == fitted.per_label
    torch.testing.assert_close(back.predict_proba(x), fitted.predict_proba(x))


def test_save_and_load_through_a_model(tmp_path):
    s, y = _binary()
    model = _Head(()).eval()
    fitted = peg.TemperatureScaling().fit(model, (s[:, None], y))
    back = peg.load(fitted.save(tmp_path / "map.peg"), _Head(()))
    assert back.kind_.kind == "binary"
    torch.testing.assert_close(back.predict_proba(s[:5, None]), fitted.predict_proba(s[:5, None]))


@pytest.mark.parametrize("kind", list(KINDS))
def test_to_module_maps_native_logits_to_native_probabilities(kind):
    fitted, x = KINDS[kind]()
    module = fitted.to_module()
    torch.testing.assert_close(module(x), fitted.predict_proba(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="logits: this was fitted on"):
        module(torch.zeros(3, 2, 2, 2, 2, 2))


def test_the_binary_module_exports_with_a_dynamic_batch():
    fitted = peg.TemperatureScaling().fit(*_binary())
    module = fitted.to_module()
    batch = torch.export.Dim("batch", min=2)
    program = torch.export.export(module, (torch.randn(8),), dynamic_shapes=({0: batch},))
    x = _binary()[0][:30]
    torch.testing.assert_close(program.module()(x), fitted.predict_proba(x))


# ---------------------------------------------------------------- the registry of kinds
def test_each_map_declares_its_kinds():
    assert peg.TemperatureScaling.kinds == ("multiclass", "binary", "multilabel", "dense")
    for cls in (peg.VectorScaling, peg.MatrixScaling, peg.DirichletCalibration):
        assert set(cls.kinds) == {"multiclass", "dense"}
    for cls in (peg.IsotonicCalibration, peg.HistogramBinning, peg.SplineCalibration):
        assert set(cls.kinds) == {"multiclass", "binary", "multilabel"}
    assert peg.TemperatureScaling in calibrators("dense")
    assert peg.VectorScaling not in calibrators("binary")


def test_multiclass_fits_are_unchanged():
    z, y = torch.randn(200, 3, generator=_g(7)) * 3, torch.randint(0, 3, (200,), generator=_g(8))
    ts = peg.TemperatureScaling().fit(z, y)
    assert ts.kind_.kind == "multiclass" and ts.n_classes_ == 3
    assert "kind" not in ts.meta_  # a multiclass map's meta and archive as before
    rows = z.double().log_softmax(-1)
    assert ts.temperature_ == pytest.approx(fit_temperature(rows, y, label=None), rel=1e-9)


def _estimate_binary() -> object:
    return peg.PerformanceEstimator().fit(*_binary())


def _monitor_binary() -> object:
    z, y = torch.randn(300, 3, generator=_g(11)), torch.randint(0, 3, (300,), generator=_g(12))
    z[torch.arange(300), y] += 2.0
    estimator = peg.PerformanceEstimator("atc-mc").fit(z, y)
    return peg.Monitor(estimator, chunk_size=50).run([_binary()[0][:60]]).close()


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    ("calibrators", "a map given a kind it does not declare",
     lambda: peg.VectorScaling().fit(*_binary()), ValueError,
     r"val: VectorScaling does not take binary input \(binary scores \[N\] or \[N, 1\] \(one "
     r"logit per row\)\); it takes multiclass, dense. The maps that take binary input "
     r"\(calibrators\('binary'\)\): \['TemperatureScaling', "),
    ("calibrators", "per_label on binary scores",
     lambda: peg.TemperatureScaling(per_label=True).fit(*_binary()), ValueError,
     r"per_label: fits one map per label of a multilabel head .* got binary scores"),
    ("calibrators", "binary scores with labels other than 0/1",
     lambda: peg.TemperatureScaling().fit(_binary()[0], _binary()[1] + 1), ValueError,
     r"val labels: expected binary labels, 0 or 1 \(the negative or the positive class\), or "
     r"ignore_index -100; got 2"),
    ("calibrators", "[N, 1] scores with labels 0..2",
     lambda: peg.TemperatureScaling().fit(_binary()[0][:, None], torch.arange(400) % 3),
     ValueError, r"val labels: expected binary labels, 0 or 1"),
    ("calibrators", "a binary map given multiclass logits",
     lambda: peg.TemperatureScaling().fit(*_binary()).predict_proba(torch.zeros(5, 3)),
     ValueError, r"X: this was fitted on binary scores \[N\] or \[N, 1\] \(one logit per row\), "
     r"got logits of shape \(5, 3\)"),
    ("calibrators", "unknown task", lambda: peg.TemperatureScaling(task="regression"), ValueError,
     r"task: expected one of \['auto', 'multiclass', 'binary', 'multilabel'\]"),
    ("calibrators", "ignore_index not an integer", lambda: peg.TemperatureScaling(ignore_index=0.5),
     ValueError, r"ignore_index: expected an integer"),
    ("calibrators", "class_dim not 1 or -1", lambda: peg.TemperatureScaling(class_dim=2),
     ValueError, r"class_dim: expected one of \[None, 1, -1\], got 2"),
    ("calibrators", "one label of a per-label head of one class",
     lambda: peg.TemperatureScaling(per_label=True).fit(
         _multilabel()[0], _multilabel()[1] * torch.tensor([1, 0, 1, 1])), ValueError,
     r"val labels \(label 1\): every label is 0 \(one class only\)"),
    ("calibrators", "label-free estimation of binary scores", _estimate_binary, ValueError,
     r"val: PerformanceEstimator takes multiclass logits \[N, C\] with labels \[N\], got binary "
     r"scores"),
    ("calibrators", "label-free estimation of multilabel logits",
     lambda: peg.PerformanceEstimator().fit(*_multilabel()), ValueError,
     r"val: PerformanceEstimator takes multiclass logits .* got multilabel logits \[N, 4\]"),
    ("calibrators", "the Monitor given binary scores", _monitor_binary, ValueError,
     r"batch: expected floating-point logits \[N, 3\] .* got shape \(60,\)"),
]  # fmt: skip

test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


def test_numpy_in_numpy_out():
    s, y = _binary()
    ts = peg.TemperatureScaling().fit(s.numpy(), y.numpy())
    p = ts.predict_proba(s[:5].numpy())
    assert isinstance(p, np.ndarray) and p.shape == (5,)
