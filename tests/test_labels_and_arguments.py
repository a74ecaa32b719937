"""Labels and arguments that were silently trusted or answered misleadingly (issue 40, defects
11, 12 and 14): bool labels refused wherever labels are read (they can only say class 0 or 1),
a negative label said as such, `set_params` refusing a moved argument as the constructor does,
NumPy scalars taken as the numbers they are."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import peg
from bad_inputs import _mlp, _val, raises_test


def _bool_labels(n: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    X, y = _val(n)  # three classes; as bool, class 2 would silently become class 1
    return X, y > 0


def _negative_label() -> tuple[torch.Tensor, torch.Tensor]:
    X, y = _val(120)
    y = y.clone()
    y[5] = -1
    return X, y


BOOL = r"expected integer class indices, got bool labels \(they can only say class 0 or 1\)"

ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    ("TemperatureScaling", "bool labels (3 classes)",
     lambda: peg.TemperatureScaling().fit(_mlp(), _bool_labels()),
     ValueError, "val labels: " + BOOL),
    ("calibrators", "Dirichlet: bool labels (3 classes)",
     lambda: peg.DirichletCalibration().fit(_mlp(), _bool_labels()),
     ValueError, "val labels: " + BOOL),
    ("PEG", "bool labels (3 classes)",
     lambda: peg.PEG(n_members=2, eta=0.1, progress=False).fit(_mlp(), _bool_labels()),
     ValueError, "val: " + BOOL),
    ("PEG", "bool labels in a loader",
     lambda: peg.PEG(n_members=2, eta=0.1, progress=False).fit(
         _mlp(), DataLoader(TensorDataset(*_bool_labels()), batch_size=64)),
     ValueError, BOOL),
    ("evaluate", "bool labels (3 classes)",
     lambda: peg.evaluate(_mlp(), *_bool_labels()),
     ValueError, "y: " + BOOL),
    ("evaluate", "bool labels in a loader",
     lambda: peg.evaluate(_mlp(), DataLoader(TensorDataset(*_bool_labels()), batch_size=64)),
     ValueError, "X: " + BOOL),
    ("metrics", "bool labels",
     lambda: peg.metrics.nll(torch.randn(1, 4, 3), torch.tensor([True, False, True, True])),
     ValueError, "y: " + BOOL),
    ("TemperatureScaling", "a negative label (checked before the forwards)",
     lambda: peg.TemperatureScaling().fit(_mlp(), _negative_label()),
     ValueError, r"val labels: expected class indices >= 0, got min -1$"),
    ("PEG", "set_params of an option moved to the scale search",
     lambda: peg.PEG().set_params(eta_holdout=0.3),
     TypeError, r"eta_holdout: now an option of the scale search; pass "
                r"search=peg\.ScaleSearch\(holdout=\.\.\.\)"),
    ("PEP", "set_params of bracket (moved to the scale search)",
     lambda: peg.PEP().set_params(bracket=(0.1, 1.0)),
     TypeError, r"bracket: now an option of the scale search; pass search=peg\.ScaleSearch\("
                r"grid=\.\.\.\)"),
]  # fmt: skip
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


def test_set_params_and_the_constructor_refuse_a_moved_argument_alike():
    for make in (lambda: peg.PEG(eta_holdout=0.3), lambda: peg.PEG().set_params(eta_holdout=0.3)):
        with pytest.raises(TypeError) as e:
            make()
        assert str(e.value).startswith("eta_holdout: now an option of the scale search")
    method = peg.PEG(eta=0.2)
    with pytest.raises(TypeError):
        method.set_params(eta=0.3, eta_holdout=0.3)
    assert method.eta == 0.2  # nothing changed
    with pytest.raises(ValueError, match=r"unknown argument\(s\) \['foo'\]; valid: \["):
        method.set_params(foo=1)  # an unknown name still lists the valid ones


@pytest.mark.parametrize(
    "eta", [np.float32(0.1), np.float64(0.1), [np.float32(0.05), np.float64(0.1)]]
)
def test_numpy_scalars_are_numbers(eta):
    fitted = peg.PEG(n_members=2, eta=eta, progress=False).fit(_mlp(), _val(300))
    assert fitted.eta is eta  # stored as given
    assert fitted.eta_ == pytest.approx(0.1 if not isinstance(eta, list) else fitted.eta_)
    assert isinstance(fitted.eta_, float)
    peg.PEP(sigma=np.float32(0.01))
    peg.ScaleSearch(holdout=np.float32(0.3))
    with pytest.raises(ValueError, match="eta: expected a number > 0"):
        peg.PEG(eta=np.bool_(True))
