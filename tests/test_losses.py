"""peg.losses (every training loss, one Gaussian NLL formula) and peg._params (flat vectors)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from peg import losses
from peg._params import entry_views, flatten_state, parameter_vector, unflatten_state
from peg.metrics import regression


def test_the_old_homes_re_export_the_losses() -> None:
    from peg.layers import emp_loss
    from peg.layers.patching import emp_loss as emp_loss_2
    from peg.methods.packed import packed_gaussian_nll, packed_loss
    from peg.models.gaussian import gaussian_nll_loss

    assert emp_loss is emp_loss_2  # defined with the patch regulariser it adds
    assert packed_loss is losses.packed_loss
    assert packed_gaussian_nll is losses.packed_gaussian_nll
    assert gaussian_nll_loss is losses.gaussian_nll_loss


def test_cross_entropy_per_point() -> None:
    logits, y = torch.randn(7, 3), torch.randint(0, 3, (7,))
    out = losses.cross_entropy_per_point(logits, y)
    assert out.shape == (7,)
    torch.testing.assert_close(out.mean(), nn.functional.cross_entropy(logits, y))


def test_the_gaussian_nlls_are_one_formula() -> None:
    g = torch.Generator().manual_seed(0)
    out = torch.randn(50, 2, generator=g, dtype=torch.float64)
    y = torch.randn(50, generator=g, dtype=torch.float64)
    mean, log_var = out[:, 0], out[:, 1]
    direct = 0.5 * (math.log(2 * math.pi) + log_var + (y - mean) ** 2 / log_var.exp())
    per_point = losses.gaussian_nll_per_point(out, y)
    assert per_point.shape == (50,)
    torch.testing.assert_close(per_point, direct)
    torch.testing.assert_close(losses.gaussian_nll_loss(out, y), direct.mean())
    var = log_var.exp()
    assert regression.gaussian_nll(mean, var, y) == pytest.approx(float(direct.mean()), rel=1e-12)
    # the metric is the elementwise formula itself, bit for bit
    nll = losses.gaussian_nll_elementwise(mean, var.log(), y, var=var)
    assert regression.gaussian_nll(mean, var, y) == float(nll.mean())


def test_the_per_point_constant_leaves_the_gradient_unchanged() -> None:
    out = torch.randn(64, 2, requires_grad=True)
    y = torch.randn(64)
    (a,) = torch.autograd.grad(losses.gaussian_nll_per_point(out, y).mean(), out)
    mean, log_var = out[:, 0], out[:, 1]
    no_constant = 0.5 * (log_var + (y - mean) ** 2 / log_var.exp())
    (b,) = torch.autograd.grad(no_constant.mean(), out)
    assert torch.equal(a, b)


def test_flat_vectors_round_trip_and_views_write_through() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    names = [n for n, _ in net.named_parameters()]
    state = net.state_dict()
    flat = flatten_state(state, names)
    assert torch.equal(flat, parameter_vector(net))
    back = unflatten_state(flat * 2, state, names)
    assert all(torch.equal(back[n], 2 * state[n]) for n in names)
    assert back["1.running_mean"] is state["1.running_mean"]  # entries not named: kept
    assert flatten_state(state, ["1.num_batches_tracked"], dtype=torch.float64).dtype == (
        torch.float64
    )

    rows = torch.zeros(3, len(flat))
    views = entry_views(rows, [state[n].shape for n in names])
    assert [tuple(v.shape) for v in views] == [(3, *state[n].shape) for n in names]
    views[0].fill_(1.0)
    assert rows[:, : state[names[0]].numel()].eq(1).all() and rows.sum() == 3 * 12
    with pytest.raises(ValueError, match="flat: expected"):
        entry_views(rows[:, :-1], [state[n].shape for n in names])
    with pytest.raises(ValueError, match="vector: expected"):
        unflatten_state(flat[:-1], state, names)
