"""`to_module()`: every calibrator's fitted map as a frozen `nn.Module` from logits `[N, C]` to
probabilities `[N, C]`, within 1e-5 of `predict_proba` at batch sizes other than the exported
one, run eagerly, through `torch.export.export` and in ONNX Runtime (`torch.onnx.export`, a
dynamic batch dimension); `predict_proba` refuses `torch.jit.trace` instead of baking a batch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.methods.calibration._export import interpolate

C = 5
SIZES = (1, 3, 97)  # exported at 8 rows

CALIBRATORS: dict[str, Callable[[], object]] = {
    "TS": peg.TemperatureScaling,
    "Vector scaling": peg.VectorScaling,
    "Matrix scaling": lambda: peg.MatrixScaling(reg_lambda=0.0, reg_mu=0.0),
    "Dirichlet": peg.DirichletCalibration,
    "Hist. binning": lambda: peg.HistogramBinning(n_bins=8, strategy="quantile"),
    "Isotonic": peg.IsotonicCalibration,
    "Spline": peg.SplineCalibration,
    "Ensemble TS": peg.EnsembleTemperatureScaling,
    "Order-preserving": peg.OrderPreservingScaling,
}


def saved(n: int, seed: int, scale: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    return torch.randn(n, C, generator=g) * scale + 3 * nn.functional.one_hot(y, C), y


def fitted(name: str) -> object:
    return CALIBRATORS[name]().fit(*saved(400, 0))


def test_predict_proba_refuses_to_be_traced():
    """A trace of 4 rows gave 512 rows back for 1,000 (the batch slices baked in): refused,
    pointing to to_module(), whose trace is right at any batch size."""
    ts = fitted("TS")
    X = saved(1000, 1)[0]
    with pytest.raises(RuntimeError, match=r"predict_proba: cannot be traced .* to_module\(\)"):
        torch.jit.trace(lambda x: ts.predict_proba(x), X[:4])
    traced = torch.jit.trace(ts.to_module(), X[:4])
    torch.testing.assert_close(traced(X), ts.predict_proba(X), atol=1e-5, rtol=0)


def test_the_module_is_frozen_and_its_map_is_its_buffers():
    calibrator = peg.MatrixScaling(reg_lambda=0.0, reg_mu=0.0).fit(*saved(400, 0))
    module = calibrator.to_module()
    assert list(module.parameters()) == [] and not module.training
    assert {n for n, _ in module.named_buffers()} == {"weights", "bias"}
    reloaded = type(module)(calibrator.scores_, torch.zeros(C, C), torch.zeros(C))
    reloaded.load_state_dict(module.state_dict())  # the map is its state dict
    X = saved(10, 1)[0]
    torch.testing.assert_close(reloaded(X), module(X))


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_the_exported_map_is_predict_proba(name, tmp_path):
    """Eager, `torch.export.export` and ONNX Runtime, at batch sizes other than the exported
    one and on logits beyond the validation range (saturated rows, new extremes)."""
    calibrator = fitted(name)
    module = calibrator.to_module()
    X = torch.cat([saved(90, 1, scale=6.0)[0], torch.tensor([[40.0, -40, 0, 1, 2]] * 7)])
    expected = calibrator.predict_proba(X)
    torch.testing.assert_close(module(X), expected, atol=1e-5, rtol=0)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(module, (X[:8],), dynamic_shapes={"logits": {0: batch}})
    assert "grad" not in str(program.graph)  # no grad-mode switch became a node
    onnx_program = torch.onnx.export(program, f=tmp_path / "map.onnx", verbose=False)
    assert onnx_program is not None
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "map.onnx"))
    for n in SIZES:
        torch.testing.assert_close(program.module()(X[:n]), expected[:n], atol=1e-5, rtol=0)
        (out,) = session.run(None, {session.get_inputs()[0].name: X[:n].numpy()})
        np.testing.assert_allclose(out, expected[:n].numpy(), atol=1e-5, rtol=0)


def test_a_module_exports_to_onnx_directly(tmp_path):
    """The user's one call: `torch.onnx.export(module, ...)` with a dynamic batch."""
    ts = fitted("TS")
    X = saved(20, 1)[0]
    batch = torch.export.Dim("batch", min=1)
    torch.onnx.export(ts.to_module(), (X[:8],), tmp_path / "ts.onnx",
                      dynamic_shapes={"logits": {0: batch}}, verbose=False)  # fmt: skip
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "ts.onnx"))
    (out,) = session.run(None, {session.get_inputs()[0].name: X.numpy()})
    np.testing.assert_allclose(out, ts.predict_proba(X.numpy()), atol=1e-5, rtol=0)


def test_label_shift_exports_too():
    (X, y), (Xt, _) = saved(400, 0), saved(200, 1)
    shift = peg.LabelShift().fit(X, y, target=Xt)
    torch.testing.assert_close(shift.to_module()(Xt), shift.predict_proba(Xt), atol=1e-5, rtol=0)


def test_a_map_fitted_on_an_ensemble_takes_its_log_mean_prediction():
    X, y = saved(400, 0)
    ensemble = peg.Ensemble.from_models([nn.Linear(C, C), nn.Linear(C, C)])
    vector = peg.VectorScaling().fit(ensemble, (X, y))
    log_mean = peg.metrics.ensemble_log_probs(ensemble.member_logits(X))
    module = vector.to_module()
    torch.testing.assert_close(module(log_mean.float()), vector.predict_proba(X), atol=1e-5, rtol=0)


def test_interpolate_is_numpys():
    g = torch.Generator().manual_seed(0)
    xs = torch.rand(3, 6, generator=g, dtype=torch.float64).sort(-1).values
    ys = torch.rand(3, 6, generator=g, dtype=torch.float64)
    x = torch.cat([torch.rand(50, 3, generator=g, dtype=torch.float64) * 1.4 - 0.2, xs.T])
    expected = np.stack([np.interp(x[:, c], xs[c], ys[c]) for c in range(3)], 1)
    np.testing.assert_allclose(interpolate(x, xs, ys).numpy(), expected, atol=1e-12)


def test_an_unfitted_calibrator_or_a_conformal_predictor_has_no_module():
    with pytest.raises(peg.NotFittedError, match="before exporting"):
        peg.TemperatureScaling().to_module()
    sets = peg.ConformalClassifier().fit(*saved(400, 0))
    with pytest.raises(TypeError, match="to_module: ConformalClassifier has no exported form"):
        sets.to_module()


def _onnx_session(module: nn.Module, X: torch.Tensor, path, dynamo: bool):
    """An ONNX Runtime session of `module` exported at `X` with a dynamic batch, through the
    dynamo exporter (`torch.export`, needs onnxscript) or the TorchScript one."""
    import onnxruntime

    if dynamo:
        batch = torch.export.Dim("batch", min=1)
        torch.onnx.export(module, (X,), path, dynamo=True, verbose=False,
                          dynamic_shapes={"logits": {0: batch}})  # fmt: skip
    else:
        torch.onnx.export(module, (X,), path, dynamo=False, input_names=["logits"],
                          dynamic_axes={"logits": {0: "batch"}})  # fmt: skip
    return onnxruntime.InferenceSession(str(path))


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_the_module_refuses_logits_of_another_class_count_eager_and_traced(name):
    """A TS map fitted on 5 classes mapped 3 columns, vector scaling turned 1 column into 5;
    the traced graph keeps the check (a reshape to C columns)."""
    module = fitted(name).to_module()
    X = saved(20, 1)[0]
    traced = torch.jit.trace(module, X[:8])
    for width in (1, 3, 7):
        with pytest.raises(ValueError, match=rf"on {C} classes, got logits with {width} col"):
            module(X[:, :1].expand(-1, width))
        with pytest.raises(RuntimeError):
            traced(X[:, :1].expand(-1, width).contiguous())
    torch.testing.assert_close(traced(X), module(X))


@pytest.mark.parametrize("name", ["TS", "Vector scaling"])
@pytest.mark.parametrize("dynamo", [True, False])
def test_exported_graphs_refuse_logits_of_another_class_count(name, dynamo, tmp_path):
    module = fitted(name).to_module()
    X = saved(20, 1)[0]
    with pytest.raises(ValueError, match=f"fitted on {C} classes"):
        torch.export.export(module, (X[:8, :3],))  # the check runs at export too
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(module, (X[:8],), dynamic_shapes={"logits": {0: batch}})
    session = _onnx_session(module, X[:8], tmp_path / "map.onnx", dynamo)
    for width in (1, 3):
        with pytest.raises(Exception, match="1"):  # torch.export's input guard on dim 1
            program.module()(X[:, :width].contiguous())
        with pytest.raises(Exception, match="(?i)invalid|dimension|shape"):
            session.run(None, {session.get_inputs()[0].name: X[:, :width].contiguous().numpy()})


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_nonfinite_logits_are_refused_as_predict_proba_refuses_them(name):
    """+inf gave a NaN row, -inf a distribution: eagerly the module refuses both with
    predict_proba's message; a traced graph, which cannot raise on values, gives NaN rows."""
    calibrator = fitted(name)
    module = calibrator.to_module()
    X = saved(6, 1)[0]
    bad = X.clone()
    bad[1, 0], bad[3, 2], bad[4, 4] = float("inf"), float("-inf"), float("nan")
    with pytest.raises(ValueError) as expected:
        calibrator.predict_proba(bad)
    with pytest.raises(ValueError) as got:
        module(bad)
    assert str(got.value) == str(expected.value).replace("X:", "logits:", 1)
    out = torch.jit.trace(module, X)(bad)
    assert out[[1, 3, 4]].isnan().all()
    keep = [0, 2, 5]
    torch.testing.assert_close(out[keep], calibrator.predict_proba(X[keep]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_the_torchscript_onnx_exporter(name, tmp_path):
    """dynamo=False: every map exports (order-preserving's anchors precomputed), but spline
    calibration, whose logaddexp that exporter lacks: refused, pointing to dynamo=True."""
    calibrator = fitted(name)
    X = saved(30, 1, scale=6.0)[0]
    if name == "Spline":
        with pytest.raises(TypeError, match=r"dynamo=True"):
            _onnx_session(calibrator.to_module(), X[:8], tmp_path / "m.onnx", dynamo=False)
        return
    session = _onnx_session(calibrator.to_module(), X[:8], tmp_path / "m.onnx", dynamo=False)
    (out,) = session.run(None, {"logits": X.numpy()})
    np.testing.assert_allclose(out, calibrator.predict_proba(X).numpy(), atol=1e-5, rtol=0)
    bad = X[:4].clone()
    bad[0, 0] = float("inf")
    (out,) = session.run(None, {"logits": bad.numpy()})
    assert np.isnan(out[0]).all() and np.isfinite(out[1:]).all()


@pytest.mark.parametrize("name", ["Spline", "Order-preserving"])
def test_the_dynamo_onnx_exporter_takes_every_map(name, tmp_path):
    """`torch.onnx.export(..., dynamo=True)`, the documented path (onnxscript, in the export
    extra), for the two maps the TorchScript exporter could not take."""
    calibrator = fitted(name)
    X = saved(30, 1, scale=6.0)[0]
    session = _onnx_session(calibrator.to_module(), X[:8], tmp_path / "m.onnx", dynamo=True)
    (out,) = session.run(None, {session.get_inputs()[0].name: X.numpy()})
    np.testing.assert_allclose(out, calibrator.predict_proba(X).numpy(), atol=1e-5, rtol=0)
