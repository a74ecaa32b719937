"""`peg.LabelShift` against a direct NumPy implementation of EM (Saerens et al. 2002) and BBSE
(Lipton et al. 2018) on a constructed problem whose priors are known: three Gaussian classes
in 2-D, the model their exact Bayes posterior under the source priors."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import peg
from bad_inputs import raises_test

MEANS = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
SOURCE = np.array([1 / 3, 1 / 3, 1 / 3])
TARGET = np.array([0.6, 0.3, 0.1])


def _sample(priors: np.ndarray, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    y = rng.choice(len(priors), size=n, p=priors)
    x = MEANS[y] + rng.standard_normal((n, 2))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def _bayes() -> nn.Module:
    """logit_c = μ_c·x − |μ_c|²/2 + log p_s(c): the exact posterior under the source priors."""
    model = nn.Linear(2, 3)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(MEANS, dtype=torch.float32))
        bias = -0.5 * (MEANS**2).sum(1) + np.log(SOURCE)
        model.bias.copy_(torch.tensor(bias, dtype=torch.float32))
    return model.eval()


def _probs(x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return _bayes()(x).double().softmax(-1).numpy()


def _numpy_em(p: np.ndarray, source: np.ndarray, tol: float = 1e-8) -> np.ndarray:
    q = source.copy()
    for _ in range(1000):
        post = p * q / source
        post /= post.sum(1, keepdims=True)
        new = post.mean(0)
        if np.abs(new - q).max() < tol:
            return new
        q = new
    return q


def _numpy_bbse(p_val: np.ndarray, y_val: np.ndarray, p_target: np.ndarray) -> np.ndarray:
    c = len(SOURCE)
    joint = np.zeros((c, c))
    np.add.at(joint, (p_val.argmax(1), y_val), 1.0 / len(y_val))
    mu = np.bincount(p_target.argmax(1), minlength=c) / len(p_target)
    source = np.bincount(y_val, minlength=c) / len(y_val)
    q = np.clip(np.linalg.solve(joint, mu), 0, None) * source
    return q / q.sum()


VAL = _sample(SOURCE, 3000, 0)
X_T, Y_T = _sample(TARGET, 3000, 1)


def test_em_matches_numpy_and_finds_the_priors():
    shift = peg.LabelShift(calibrate=None).fit(_bayes(), VAL, target=X_T)
    source = np.bincount(VAL[1].numpy(), minlength=3) / len(VAL[1])
    expected = _numpy_em(_probs(X_T), source)
    np.testing.assert_allclose(shift.priors_.numpy(), expected, atol=1e-7)
    np.testing.assert_allclose(shift.source_priors_.numpy(), source)
    assert shift.converged_ and shift.n_iter_ > 1 and shift.priors_se_ is None
    assert np.abs(shift.priors_.numpy() - TARGET).max() < 0.03  # known priors, 3000 points


def test_bbse_matches_numpy_with_a_standard_error():
    shift = peg.LabelShift(method="bbse", calibrate=None).fit(_bayes(), VAL, target=X_T)
    expected = _numpy_bbse(_probs(VAL[0]), VAL[1].numpy(), _probs(X_T))
    np.testing.assert_allclose(shift.priors_.numpy(), expected, atol=1e-10)
    se = shift.priors_se_.numpy()
    assert se.shape == (3,) and (se > 0).all() and (se < 0.05).all()
    assert (np.abs(shift.priors_.numpy() - TARGET) < 4 * se + 1e-3).all()


def test_the_standard_error_covers_across_resamples():
    """The delta-method interval ±1.96 se holds the true prior in most of 40 resamples."""
    hits, total = 0, 0
    for seed in range(40):
        val = _sample(SOURCE, 600, 100 + seed)
        target, _ = _sample(TARGET, 600, 200 + seed)
        shift = peg.LabelShift(method="bbse", calibrate=None).fit(_bayes(), val, target=target)
        inside = np.abs(shift.priors_.numpy() - TARGET) <= 1.96 * shift.priors_se_.numpy()
        hits, total = hits + int(inside.sum()), total + 3
    assert hits / total > 0.85


def test_adapted_probabilities_are_the_reweighted_posterior():
    shift = peg.LabelShift(calibrate=None).fit(_bayes(), VAL, target=X_T)
    w = shift.priors_.numpy() / shift.source_priors_.numpy()
    p = _probs(X_T[:50]) * w
    expected = p / p.sum(1, keepdims=True)
    got = shift.predict_proba(X_T[:50]).double().numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    logits = shift.member_logits(X_T[:50])
    assert logits.shape == (1, 50, 3)
    torch.testing.assert_close(logits[0].softmax(-1), shift.predict_proba(X_T[:50]))
    nll_before = -np.log(_probs(X_T)[np.arange(len(Y_T)), Y_T.numpy()]).mean()
    adapted = shift.predict_proba(X_T).double().numpy()
    nll_after = -np.log(adapted[np.arange(len(Y_T)), Y_T.numpy()]).mean()
    assert nll_after < nll_before


def test_bcts_calibrates_a_miscalibrated_model_before_em():
    """A model whose logits are half what they should be and biased per class: EM on its raw
    or temperature-scaled probabilities is far off, after BCTS on val it finds the priors (the
    bias terms are what Alexandari et al. 2020 found to matter)."""
    model = _bayes()
    with torch.no_grad():
        model.weight.mul_(0.5)
        model.bias.mul_(0.5).add_(torch.tensor([1.0, 0.0, -1.0]))
    errors = {}
    for calibrate in (None, "ts", "bcts"):
        shift = peg.LabelShift(calibrate=calibrate).fit(model, VAL, target=X_T)
        errors[calibrate] = np.abs(shift.priors_.numpy() - TARGET).sum()
    assert abs(shift.temperature_ - 0.5) < 0.05
    assert errors["bcts"] < 0.08 and errors[None] > 0.5 and errors["ts"] > 0.5


def test_streams_a_loader_as_the_tensor(tmp_path):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X_T), batch_size=128)
    a = peg.LabelShift(calibrate="ts").fit(_bayes(), VAL, target=X_T)
    b = peg.LabelShift(calibrate="ts").fit(_bayes(), VAL, target=loader)
    torch.testing.assert_close(a.priors_, b.priors_)
    assert b.n_target_ == len(X_T)


def test_save_load_with_a_calibrator_underneath(tmp_path):
    ts = peg.TemperatureScaling().fit(_bayes(), VAL)
    shift = peg.LabelShift(method="bbse").fit(ts, VAL, target=X_T)
    path = shift.save(str(tmp_path / "shift"))
    loaded = peg.load(path, _bayes())
    assert isinstance(loaded, peg.LabelShift)
    assert isinstance(loaded.predictor_, peg.TemperatureScaling)
    torch.testing.assert_close(loaded.priors_, shift.priors_)
    torch.testing.assert_close(loaded.priors_se_, shift.priors_se_)
    torch.testing.assert_close(loaded.member_logits(X_T[:20]), shift.member_logits(X_T[:20]))
    assert loaded.meta_ == shift.meta_ and shift.meta_["method"] == "label_shift"


def _fit(**kwargs) -> object:
    args = {"val": VAL, "target": X_T} | kwargs
    return peg.LabelShift().fit(_bayes(), args["val"], target=args["target"])


ERROR_CASES = [
    ("LabelShift", "unknown method", lambda: peg.LabelShift(method="ml"), ValueError, "method"),
    (
        "LabelShift",
        "unknown calibrate",
        lambda: peg.LabelShift(calibrate="dirichlet"),
        ValueError,
        "calibrate",
    ),
    ("LabelShift", "tol <= 0", lambda: peg.LabelShift(tol=0), ValueError, "tol"),
    (
        "LabelShift",
        "target with other features",
        lambda: _fit(target=torch.zeros(50, 3)),
        ValueError,
        r"target: expected inputs of shape \[N, 2\]",
    ),
    (
        "LabelShift",
        "target too small",
        lambda: _fit(target=X_T[:5]),
        ValueError,
        "target: 5 points are too few",
    ),
    (
        "LabelShift",
        "no target",
        lambda: _fit(target=None),
        ValueError,
        "target: label-shift adaptation needs unlabelled target inputs",
    ),
    (
        "LabelShift",
        "a class missing from val",
        lambda: _fit(val=(VAL[0][:20], torch.zeros(20, dtype=torch.long))),
        ValueError,
        "val: no validation point",
    ),
]
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


def test_a_model_on_the_gpu_with_data_on_the_cpu(gpu):
    for method in ("em", "bbse"):
        on_gpu = peg.LabelShift(method=method).fit(_bayes().to(gpu), VAL, target=X_T)
        on_cpu = peg.LabelShift(method=method).fit(_bayes(), VAL, target=X_T)
        priors = on_gpu.priors_.to("cpu")
        torch.testing.assert_close(priors, on_cpu.priors_, atol=1e-4, rtol=0)
        probs = on_gpu.predict_proba(X_T[:20])
        assert probs.device == gpu
        expected = on_cpu.predict_proba(X_T[:20])
        torch.testing.assert_close(probs.to("cpu"), expected, atol=1e-4, rtol=0)


def test_evaluate_reads_the_adapted_predictor():
    shift = peg.LabelShift().fit(_bayes(), VAL, target=X_T)
    before, after = peg.evaluate(_bayes(), X_T, Y_T), peg.evaluate(shift, X_T, Y_T)
    assert after["nll"] < before["nll"] and after["error"] <= before["error"]
