"""What the framework integrations share (`peg.integrations._common`), without a framework."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peg
from peg.integrations._common import Gathered, check_calibrator, fit_calibration, gather, rows


def test_gathered_batches_join_in_order_without_the_ignored_rows():
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(n, 4, generator=g), torch.randint(0, 4, (n,), generator=g)) for n in (5, 3, 7)
    ]
    batches[1][1][0] = -100
    gathered = Gathered("val")
    for z, y in batches:
        gathered.add(z.double(), y.int())
    z, y = gathered.result()
    keep = torch.cat([b[1] for b in batches]) != -100
    torch.testing.assert_close(z, torch.cat([b[0] for b in batches])[keep])
    torch.testing.assert_close(y, torch.cat([b[1] for b in batches])[keep].long())
    assert z.dtype == torch.float32 and y.dtype == torch.int64
    assert gathered.logits == [] and gathered.labels == []  # freed as they were copied


def test_token_rows_are_flattened():
    z, y = rows(torch.zeros(2, 3, 5), torch.tensor([[1, 2, -100], [0, -100, -100]]), "x")
    assert z.shape == (3, 5) and y.tolist() == [1, 2, 0]


@pytest.mark.parametrize(
    ("logits", "labels", "match"),
    [
        (torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), "argmax"),
        (torch.zeros(4, 3), torch.zeros(5, dtype=torch.long), r"labels of shape \(4,\)"),
        (torch.zeros(4, 3), torch.zeros(4), "integer labels"),
    ],
)
def test_bad_rows_are_one_clear_error(logits, labels, match):
    with pytest.raises(ValueError, match=match):
        rows(logits, labels, "val")


def test_batches_of_different_class_counts_are_refused():
    gathered = Gathered("val")
    gathered.add(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="batch 1 has 4 classes"):
        gathered.add(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))


def test_gather_runs_the_model_in_eval_mode_and_restores_it():
    model = nn.Sequential(nn.Linear(2, 3), nn.Dropout(0.9)).train()
    X, y = torch.randn(40, 2), torch.randint(0, 3, (40,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=16)
    z, labels = gather(model, loader, None, None, "val")
    assert model.training
    with torch.no_grad():
        torch.testing.assert_close(z, model.eval()(X))  # no dropout: eval mode
    torch.testing.assert_close(labels, y)


def test_the_users_calibrator_is_copied_not_fitted():
    mine = peg.TemperatureScaling(max_iter=20)
    y = torch.randint(0, 3, (100,))
    z = 3 * nn.functional.one_hot(y, 3) + torch.randn(100, 3)  # informative: T inside its bounds
    fit = fit_calibration(mine, 0.2, z, y)
    assert not hasattr(mine, "temperature_") and fit.calibrator.max_iter == 20
    assert fit.calibrator.temperature_ > 0 and fit.conformal.alpha == 0.2
    names = {f"c/{m}_{w}" for m in ("accuracy", "nll", "ece", "brier") for w in ("before", "after")}
    assert set(fit.metrics("c/")) == names
    with pytest.raises(TypeError, match="calibrator"):
        check_calibrator(peg.LabelShift(), "calibrator")


def test_a_fit_on_few_rows_warns_with_the_count():
    y = torch.tensor([0, 1, 2])
    z = 3 * nn.functional.one_hot(y, 3).float()
    with pytest.warns(UserWarning, match="fitted on 3 labelled rows, fewer than 50"):
        fit_calibration("TS", None, z, y)
