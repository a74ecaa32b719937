"""When weighted conformal prediction refuses or warns of its covariate-shift weights (issue 40,
defects 12 and 15): refused only where the weights are unbounded (the domains separate, or an
effective sample size below 1/α − 1), warned of below the wider cut-offs, the cut-offs options;
a heavy but bounded shift restores coverage; each refusal says its cause; an empty or NaN
`target` and NaN features are errors naming the argument."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import peg
from bad_inputs import raises_test

ALPHA = 0.1


def _linear(w: list[list[float]]) -> nn.Module:
    net = nn.Linear(len(w[0]), len(w))
    with torch.no_grad():
        net.weight.copy_(torch.tensor(w))
        net.bias.zero_()
    return net.eval()


# the class is the sign of x₁; the labels flip more often as x₀ grows (p(y | x) is the same in
# both domains: a covariate shift), so the target, shifted by 1.7 SD along x₀, has noisier labels
SIGN = _linear([[0.0, 3.0], [0.0, -3.0]])


def _draw(n: int, shift: float, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 2, generator=g)
    x[:, 0] += shift
    pred = (x[:, 1] < 0).long()
    flip = torch.rand(n, generator=g) < torch.sigmoid(3 * (x[:, 0] - 2.0))
    return x, torch.where(flip, 1 - pred, pred)


def _coverage(cp: peg.ConformalClassifier, test: tuple[torch.Tensor, torch.Tensor]) -> float:
    sets = cp.predict_set(test[0])
    return float(sets[torch.arange(len(test[1])), test[1]].float().mean())


def test_a_heavy_bounded_shift_is_fitted_with_a_warning_and_coverage_is_restored():
    """Issue 40's defect 15: two features, n = 1000, a shift of 1.7 SD (domain AUROC ≈ 0.88).
    The n / 20 cut-off refused 4 of these 20 draws (effective sample sizes 20-160); now every
    one is fitted, with a heavy-weights warning where the size is below n / 5, and the weighted
    sets cover ≈ 0.9 on average where split conformal covers ≈ 0.57."""
    weighted, split, aurocs, sizes = [], [], [], []
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        cal, target, test = _draw(1000, 0.0, g), _draw(1000, 1.7, g)[0], _draw(2000, 1.7, g)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cp = peg.ConformalClassifier(alpha=ALPHA, shift="covariate", features="inputs")
            cp.fit(SIGN, cal, target=target)
        heavy = [w for w in caught if "heavy weights" in str(w.message)]
        assert bool(heavy) == (cp.n_eff_ < 0.2 * 1000), (seed, cp.n_eff_)
        weighted.append(_coverage(cp, test))
        split.append(_coverage(peg.ConformalClassifier(alpha=ALPHA).fit(SIGN, cal), test))
        aurocs.append(cp.domain_auroc_)
        sizes.append(cp.n_eff_)
    assert 0.86 < np.mean(aurocs) < 0.91
    assert min(sizes) < 1000 / 20  # the old cut-off would have refused these
    assert 0.88 < np.mean(weighted) < 0.93, np.mean(weighted)
    assert np.mean(split) < 0.65, np.mean(split)


def _noise(seed: int = 3, n: int = 90) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """No shift at all: calibration and target from the same N(0, I₃₂), 90 points each."""
    g = torch.Generator().manual_seed(seed)
    X, y = torch.randn(n, 32, generator=g), torch.randint(0, 3, (n,), generator=g)
    return (X, y), torch.randn(n, 32, generator=g)


NOISE_MODEL = _linear(torch.randn(3, 32, generator=torch.Generator().manual_seed(0)).tolist())


def test_a_refusal_with_no_shift_says_the_weights_are_noise_not_separation():
    """Issue 40's defect 12: at AUROC 0.46 and an effective sample size of 2.5 of 90, the
    refusal said "the domain classifier separates calibration and target points"."""
    cal, target = _noise()
    cp = peg.ConformalClassifier(shift="covariate", features="inputs")
    with pytest.raises(ValueError) as e:
        cp.fit(NOISE_MODEL, cal, target=target)
    message = str(e.value)
    assert "separates" not in message
    assert "effective sample size 2.5 of 90, below 1/alpha - 1 = 9" in message
    assert "does not tell the domains apart (out-of-fold AUROC 0.46" in message
    assert "features='logits'" in message


def test_the_cut_offs_are_options():
    cal, target = _noise()
    model = NOISE_MODEL
    # min_ess=2 accepts what 1/α − 1 refused, with a warning saying why the weights are heavy
    with pytest.warns(UserWarning, match="very heavy weights.*does not tell the domains apart"):
        peg.ConformalClassifier(shift="covariate", features="inputs", min_ess=2).fit(
            model, cal, target=target
        )
    # warn_ess=0: no warning; max_auroc below the draw's AUROC: refused as separating
    g = torch.Generator().manual_seed(0)
    cal2, target2 = _draw(1000, 0.0, g), _draw(1000, 1.7, g)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        peg.ConformalClassifier(shift="covariate", features="inputs", warn_ess=0).fit(
            SIGN, cal2, target=target2
        )
    with pytest.raises(ValueError, match=r"separates.*>= max_auroc=0\.8"):
        peg.ConformalClassifier(shift="covariate", features="inputs", max_auroc=0.8).fit(
            SIGN, cal2, target=target2
        )
    # the regressor takes the same options
    reg = peg.ConformalRegressor(shift="covariate", max_auroc=0.9, min_ess=5, warn_ess=0.1)
    assert reg.get_params()["min_ess"] == 5


def _nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[0, 0] = float("nan")
    return t


_CAL, _TARGET = _draw(200, 0.0, torch.Generator().manual_seed(1)), torch.randn(100, 2)
_covariate = peg.ConformalClassifier(shift="covariate", features="inputs")
_GAUSS = nn.Linear(2, 2)  # a Gaussian-head regressor: (mean, log variance)

ERROR_CASES = [
    ("conformal under shift", "an empty target",
     lambda: _covariate.fit(SIGN, _CAL, target=_TARGET[:0]),
     ValueError, r"target: no inputs \(shape \(0, 2\)\)"),
    ("conformal under shift", "an empty target loader",
     lambda: _covariate.fit(
         SIGN, _CAL, target=torch.utils.data.DataLoader(_TARGET[:0], batch_size=10)),
     ValueError, r"target: no inputs \(0 samples\)"),
    ("conformal under shift", "a NaN in the target",
     lambda: _covariate.fit(SIGN, _CAL, target=_nan(_TARGET)),
     ValueError, r"target: the inputs contain NaN or inf \(1 of 100 samples\)"),
    ("conformal under shift", "label shift: a NaN in the target",
     lambda: peg.ConformalClassifier(shift="label").fit(SIGN, _CAL, target=_nan(_TARGET)),
     ValueError, r"target: the inputs contain NaN or inf"),
    ("conformal under shift", "regression: a NaN in the target",
     lambda: peg.ConformalRegressor(shift="covariate", features="inputs").fit(
         _GAUSS, (_CAL[0], _CAL[1].double()), target=_nan(_TARGET)),
     ValueError, r"target: the inputs contain NaN or inf"),
    ("conformal under shift", "no shift, 90 points in 32 features (noise weights)",
     lambda: peg.ConformalClassifier(shift="covariate", features="inputs").fit(
         NOISE_MODEL, *_noise()[:1], target=_noise()[1]),
     ValueError, r"target: the weights concentrate .* does not tell the domains apart"),
    ("conformal under shift", "max_auroc of 0.5",
     lambda: peg.ConformalClassifier(max_auroc=0.5),
     ValueError, r"max_auroc: expected an AUROC in \(0\.5, 1\]"),
    ("conformal under shift", "a negative min_ess",
     lambda: peg.ConformalClassifier(min_ess=-1),
     ValueError, r"min_ess: expected a finite number >= 0"),
    ("conformal under shift", "warn_ess above 1",
     lambda: peg.ConformalRegressor(warn_ess=2),
     ValueError, r"warn_ess: expected a fraction of the calibration points in \[0, 1\]"),
]  # fmt: skip
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
