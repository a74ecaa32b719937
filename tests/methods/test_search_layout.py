"""PEG/PEP's fit runs a contiguous CNN's CPU passes channels-last (issue 49): the faster
kernels there, the same members up to rounding, the model and the fitted ensemble as given."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peg
from peg._params import runs_channels_last
from peg.methods.perturbation import _gradients
from peg.models import SmallCNN

CL = torch.channels_last


def _images(n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 12, 12, generator=g), torch.randint(0, 3, (n,), generator=g)


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN(in_channels=1, num_classes=3, width=4).eval()


def test_which_passes_run_channels_last():
    x = torch.randn(2, 1, 12, 12)
    assert runs_channels_last(_cnn(), x)
    assert not runs_channels_last(_cnn().to(memory_format=CL), x)  # as its owner holds it
    assert not runs_channels_last(nn.Sequential(nn.Flatten(), nn.Linear(144, 3)), x)
    assert not runs_channels_last(_cnn(), x.flatten(1))
    assert not runs_channels_last(_cnn(), {"pixels": x})
    assert not runs_channels_last(_cnn(), x.long())


def test_the_search_runs_channels_last_and_the_fit_keeps_the_model_s_layout():
    model, val = _cnn(), _images()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fitted = peg.PEG(n_members=3, grad_batch_size=16, progress=False).fit(model, val)
    target = fitted.members_.search_target(val[0][:8], 8)
    assert target.inputs.is_contiguous(memory_format=CL)
    member = target.at(0.01).stacked["block.0.weight"][0]  # [8, 4, 3, 3]
    assert member.is_contiguous(memory_format=CL) and not member.is_contiguous()
    assert fitted.ensemble_.stacked["block.0.weight"][0].is_contiguous()  # the model's layout
    # the model itself: untouched (exact: its tensors are compared with their own copies, no kernel
    # recomputes them, so the bits hold on any CPU)
    for name, value in model.state_dict().items():
        assert value.is_contiguous() and torch.equal(value, before[name])


@pytest.mark.parametrize("precondition", [None, "kfac"])
def test_channels_last_gradients_are_the_contiguous_ones(monkeypatch, precondition):
    model, val = _cnn(), _images()
    options = {"n_members": 3, "grad_batch_size": 16, "eta": 0.01, "progress": False}
    fast = peg.PEG(precondition=precondition, **options).fit(model, val)
    monkeypatch.setattr(_gradients, "runs_channels_last", lambda *_: False)
    plain = peg.PEG(precondition=precondition, **options).fit(model, val)
    torch.testing.assert_close(fast.directions_[0], plain.directions_[0], rtol=1e-4, atol=1e-6)
    x = val[0][:32]
    torch.testing.assert_close(fast.predict_proba(x), plain.predict_proba(x), rtol=1e-4, atol=1e-6)


class _Viewing(nn.Module):
    """A CNN that `.view`s its activations: channels-last ones cannot be viewed so."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4 * 12 * 12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        return self.head(h.view(h.shape[0], -1))


def test_a_model_that_views_its_activations_runs_as_it_is_held():
    torch.manual_seed(0)
    model, val = _Viewing().eval(), _images()
    with pytest.raises(RuntimeError, match="view"):
        model.to(memory_format=CL)(val[0][:2].contiguous(memory_format=CL))
    model.to(memory_format=torch.contiguous_format)
    fitted = peg.PEG(n_members=3, grad_batch_size=16, progress=False).fit(model, val)
    assert fitted.eta_ > 0 and fitted.predict_proba(val[0][:4]).shape == (4, 3)
    target = fitted.members_.search_target(val[0][:8], 8)
    assert target.inputs.is_contiguous() and target.at(0.01).stacked["conv.weight"].is_contiguous()
