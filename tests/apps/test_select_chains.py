"""A chained choice of `peg.AutoSelect` ("TS → PEG", "Dirichlet → PEG": PEG around a wrapper of
the user's model) saved with `save` loads with the user's own plain model (issue 46, item 0)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peg
from peg.apps.select import AutoSelect
from peg.archive import read_header


@pytest.mark.parametrize("base", ["TS", "Dirichlet"])
def test_a_chosen_chain_loads_with_the_users_own_plain_model(tmp_path, monkeypatch, base):
    """A chosen "TS → PEG" (PEG around `Scaled(model, T)`) or "Dirichlet → PEG" (around
    `CalibratedModel(model, C, ...)`) on a plain MLP, saved with `save`, loads with the user's
    own MLP, wrapped as it was saved (the archive records the wrapper), and predicts as before
    saving. Before: "saved from a model wrapped with peg.with_output". The wrapper given
    explicitly loads too where it is the one saved; another T is refused."""
    from peg.apps.compare import method
    from peg.apps.select import auto
    from peg.data import two_moons
    from peg.errors import ArchiveError
    from peg.methods.calibration.composed import Scaled
    from peg.models import MLP

    chain = method(f"{base} → PEG-3", "peg", on=base, n_members=3)
    choose = auto.choose  # the chain's base is a candidate too and may win: make the chain win
    monkeypatch.setattr(auto, "choose", lambda *a, **k: (choose(*a, **k)[0], chain.name))
    X, y = two_moons(600, noise=0.2, seed=0)
    torch.manual_seed(0)
    net = MLP(2, 2, hidden=16)
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(100):
        opt.zero_grad()
        nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
    val = (X, y)
    sel = AutoSelect(candidates=[chain], cv=2, max_fit_seconds=None, progress=False)
    sel.fit(net.eval(), val)
    assert sel.chosen_ == chain.name
    path = sel.save(tmp_path / "chosen.peg")
    X_test = two_moons(200, noise=0.2, seed=1)[0]
    expected = sel.predict_proba(X_test)
    loaded = peg.load(path, MLP(2, 2, hidden=16), val=val)  # the user's own, never wrapped
    torch.testing.assert_close(loaded.predict_proba(X_test), expected)
    if base == "TS":
        T = read_header(path)["meta"]["auto_select"]["scales"]["TS"]["T"]
        again = peg.load(path, Scaled(MLP(2, 2, hidden=16), T), val=val)
        torch.testing.assert_close(again.predict_proba(X_test), expected)
        with pytest.raises(ArchiveError, match="model: .* saved around Scaled"):
            peg.load(path, Scaled(MLP(2, 2, hidden=16), 2 * T), val=val)
