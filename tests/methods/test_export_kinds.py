"""The maps that take a kind (`calibrators(kind)`: every binary one, two of the others), fitted
on binary scores, a multilabel head (a shared map and one per label) or dense logits:
`to_module()` exported to ONNX with a dynamic batch runs in ONNX Runtime within 1e-5 of
`predict_proba`, in the input's shape, at batch sizes other than the exported one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peg.methods.calibration._calibrator import calibrators

pytest.importorskip("onnxruntime")


def _binary(n: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, generator=g) * 2
    return z * 2 + 0.5, (torch.rand(n, generator=g) < torch.sigmoid(z)).long()


def _multilabel(n: int = 200, k: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(n, k, generator=g) * 2
    return z * 2, (torch.rand(n, k, generator=g) < torch.sigmoid(z)).long()


def _dense(b: int = 12, c: int = 3, s: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    z = torch.randn(b, c, s, s, generator=g) * 2
    y = torch.multinomial(z.movedim(1, -1).reshape(-1, c).softmax(-1), 1, generator=g)
    return z * 2, y.reshape(b, s, s)


DATA = {"binary": _binary, "multilabel": _multilabel, "dense": _dense}
# every binary map; on the other kinds the first and the last map (ONNX exports are slow)
CASES = [("binary", cls, False) for cls in calibrators("binary")]
CASES += [
    (k, cls, False)
    for k in ("multilabel", "dense")
    for cls in calibrators(k)[:: len(calibrators(k)) - 1]
]
CASES += [("multilabel", calibrators("multilabel")[-2], True)]  # one map per label


def _session(module, x, path):
    import onnxruntime

    batch = torch.export.Dim("batch", min=1)
    torch.onnx.export(module, (x,), path, dynamo=True, verbose=False,
                      dynamic_shapes=({0: batch},))  # fmt: skip
    return onnxruntime.InferenceSession(str(path))


@pytest.mark.parametrize(("kind", "cls", "per_label"), CASES,
                         ids=[f"{k}-{c.__name__}-{p}" for k, c, p in CASES])  # fmt: skip
def test_each_kinds_map_runs_in_onnx_runtime(kind, cls, per_label, tmp_path):
    logits, y = DATA[kind]()
    fitted = cls(per_label=per_label).fit(logits, y)
    assert fitted.kind_.kind == kind
    module = fitted.to_module()
    x = logits * 1.5  # beyond the validation range too
    expected = fitted.predict_proba(x)
    torch.testing.assert_close(module(x), expected, atol=1e-5, rtol=0)
    session = _session(module, x[:8], tmp_path / "map.onnx")
    for n in (1, 3, len(x)):
        (out,) = session.run(None, {session.get_inputs()[0].name: x[:n].numpy()})
        assert out.shape == tuple(x[:n].shape)
        np.testing.assert_allclose(out, expected[:n].numpy(), atol=1e-5, rtol=0)
