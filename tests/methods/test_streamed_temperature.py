"""Temperature scaling fitted on streamed batches (`_streamed.fit_temperature_streamed`): dense
outputs `[B, C, *S]` and token outputs `[B, T, V]`, ignored labels left out, equal to
`fit_temperature` on the gathered rows; the cache; the warnings at a bound; bad batches."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from bad_inputs import raises_test
from peg.methods.calibration._streamed import fit_temperature_streamed, streamed_sums
from peg.methods.calibration.temperature import fit_temperature


def _segmentation(seed: int = 0, scale: float = 3.0, sharpen: float = 0.5):
    """Logits `[6, 5, 16, 20]` and labels `[6, 16, 20]` drawn from softmax(logits · sharpen),
    a band of positions labelled -100."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(6, 5, 16, 20, generator=g) * scale
    probs = (z * sharpen).movedim(1, -1).softmax(-1).reshape(-1, 5)
    y = torch.multinomial(probs, 1, generator=g).reshape(6, 16, 20)
    y[:, :3] = -100
    return z, y


def _batches(z: torch.Tensor, y: torch.Tensor, size: int = 2) -> Callable:
    calls = []

    def batches():
        calls.append(1)
        return ((z[i : i + size], y[i : i + size]) for i in range(0, len(z), size))

    batches.calls = calls  # type: ignore[attr-defined]
    return batches


def _gathered(z: torch.Tensor, y: torch.Tensor, class_dim: int):
    rows = z.movedim(class_dim, -1).reshape(-1, z.shape[class_dim])
    labels = y.reshape(-1)
    keep = labels != -100
    return rows[keep], labels[keep]


def test_dense_fit_equals_the_gathered_fit_and_leaves_ignored_positions_out():
    z, y = _segmentation()
    exact = fit_temperature(*_gathered(z, y, 1))
    got = fit_temperature_streamed(_batches(z, y), class_dim=1, chunk=37)  # chunks cut rows
    assert got == pytest.approx(exact, rel=1e-9)
    assert got == pytest.approx(2.0, rel=0.15)  # labels drawn at T = 2
    # the ignored positions are left out: labelling them changes nothing
    other = y.clone()
    other[:, :3] = 0
    assert fit_temperature_streamed(_batches(z, other), class_dim=1) != pytest.approx(got)


def test_token_outputs_with_the_class_dimension_last():
    z, y = _segmentation(1)
    tokens, labels = z.flatten(2).transpose(1, 2), y.flatten(1)  # [B, T, V], [B, T]
    exact = fit_temperature(*_gathered(tokens, labels, -1))
    got = fit_temperature_streamed(_batches(tokens, labels, 4), class_dim=-1)
    assert got == pytest.approx(exact, rel=1e-9)
    # float32 work, float64 sums: the same optimum to float32's rounding
    single = fit_temperature_streamed(
        _batches(tokens, labels, 4), class_dim=-1, dtype=torch.float32
    )
    assert single == pytest.approx(exact, rel=1e-5)


def test_the_sums_give_the_mean_nll_and_a_zero_slope_at_the_optimum():
    z, y = _segmentation(2)
    t = fit_temperature_streamed(_batches(z, y), class_dim=1)
    sums = streamed_sums(_batches(z, y), t, class_dim=1)
    assert sums["n"] == int((y != -100).sum())
    assert sums["nll"] / sums["n"] == pytest.approx(float(F.cross_entropy(z.double() / t, y)))
    assert abs(sums["g"] / sums["n"]) < 1e-8 * math.sqrt(sums["h"] / sums["n"])
    for other in (0.9 * t, 1.1 * t):  # the optimum: the NLL is larger on both sides
        assert streamed_sums(_batches(z, y), other, class_dim=1)["nll"] > sums["nll"]


def test_a_cache_runs_the_batches_once_and_gives_the_same_temperature(tmp_path):
    z, y = _segmentation(3)
    plain, cached = _batches(z, y), _batches(z, y)
    t = fit_temperature_streamed(plain, class_dim=1)
    assert fit_temperature_streamed(cached, class_dim=1, cache=tmp_path / "c") == pytest.approx(
        t,
        rel=1e-6,  # the cache holds float32 rows, as the logits are
    )
    assert 3 < len(plain.calls) <= 10 and len(cached.calls) == 1  # one pass an evaluation
    assert len(list((tmp_path / "c").glob("*.pt"))) == 3
    temporary = _batches(z, y)
    assert fit_temperature_streamed(temporary, class_dim=1, cache=True) == pytest.approx(t)
    assert len(temporary.calls) == 1


def test_every_point_right_warns_and_stops_at_the_bound():
    z, y = _segmentation(4)
    y = torch.where(y == -100, y, z.argmax(1))
    with pytest.warns(UserWarning, match="every validation point is predicted right"):
        t = fit_temperature_streamed(_batches(z, y), class_dim=1, bounds=(0.1, 10.0))
    assert t == pytest.approx(0.1)


def test_constant_logits_warn_and_keep_the_temperature():
    z, y = _segmentation(5)
    with pytest.warns(UserWarning, match="constant logits"):
        assert fit_temperature_streamed(_batches(torch.zeros_like(z), y), class_dim=1) > 0


def test_non_finite_rows_are_left_out_as_the_gathered_fit_leaves_them():
    z, y = _segmentation(6)
    z[0, :, 5, 5] = float("nan")
    exact = fit_temperature(*_gathered(z, y, 1))
    assert fit_temperature_streamed(_batches(z, y), class_dim=1) == pytest.approx(exact)


def _one(z, y, **kw):
    return fit_temperature_streamed(lambda: [(z, y)], **kw)


ERROR_CASES = [
    (
        "TemperatureScaling",
        "streamed: labels of another shape than the positions",
        lambda: _one(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), class_dim=1),
        ValueError,
        r"expected integer labels of shape \(2, 4\)",
    ),
    (
        "TemperatureScaling",
        "streamed: a label out of range",
        lambda: _one(torch.zeros(2, 3), torch.tensor([0, 3])),
        ValueError,
        r"labels in \[0, 3\) or ignore_index=-100, got 3",
    ),
    (
        "TemperatureScaling",
        "streamed: integer logits",
        lambda: _one(torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 1])),
        ValueError,
        "expected floating-point logits with a class dimension",
    ),
]
test_bad_batches_raise_a_clear_error = raises_test(ERROR_CASES)
