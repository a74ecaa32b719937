"""What PEG/PEP's fit no longer spends (issue 38): a deep copy of the model per scale searched,
and PEP's search scoring twice the points PEG's does (docs/performance.md, the fit's profile)."""

from __future__ import annotations

import pytest
import torch

import peg
from peg.ensemble import Ensemble


def test_search_ensembles_share_one_owned_skeleton(overfit_mlp, moons_data, monkeypatch):
    skeletons: list[int] = []
    sharing = Ensemble._sharing.__func__  # type: ignore[attr-defined]

    def spy(cls, skeleton, *args, **kwargs):
        skeletons.append(id(skeleton))
        return sharing(cls, skeleton, *args, **kwargs)

    monkeypatch.setattr(Ensemble, "_sharing", classmethod(spy))
    p = peg.PEG(n_members=4, seed=0).fit(overfit_mlp, moons_data["val"])
    # the bases' logits and every scale scored, on one copy: none the caller's, none handed out
    assert len(skeletons) == 1 + len(p.search_) and len(set(skeletons)) == 1
    assert skeletons[0] not in (id(overfit_mlp), id(p.ensemble_.skeleton))
    assert p.ensemble_.skeleton is not p.ensemble_at(p.eta_).skeleton  # handed out: copies


def test_shared_skeleton_search_chooses_as_copies_do(overfit_mlp, moons_data, monkeypatch):
    fitted = peg.PEG(n_members=4, seed=0).fit(overfit_mlp, moons_data["val"])
    monkeypatch.setattr(
        Ensemble,
        "_sharing",
        classmethod(
            lambda cls, skeleton, stacked=None, shared=None, states=None: (
                cls.from_state_dicts(skeleton, states)
                if states is not None
                else cls(skeleton, stacked, shared)
            )
        ),
    )
    copied = peg.PEG(n_members=4, seed=0).fit(overfit_mlp, moons_data["val"])
    # the shared skeleton's loop swaps tensors into it (functional_call), the copies run member
    # modules: the same scores and choice up to float32 rounding
    assert fitted.search_ == pytest.approx(copied.search_)
    assert fitted.eta_ == pytest.approx(copied.eta_)
    X = moons_data["test"][0]
    torch.testing.assert_close(fitted.member_logits(X), copied.member_logits(X))


def test_pep_scores_the_points_peg_holds_out(overfit_mlp, moons_data):
    val = moons_data["val"]  # 600 points
    pep = peg.PEP(n_members=4, seed=0).fit(overfit_mlp, val)
    peg_ = peg.PEG(n_members=4, seed=0).fit(overfit_mlp, val)
    scoring = pep.meta_["validation_points"]["scoring"]
    assert scoring == peg_.meta_["validation_points"]["scoring"] == 300
    assert set(pep.search_points_.values()) == {300}
    every = peg.PEP(n_members=4, seed=0, search=peg.ScaleSearch(holdout=0)).fit(overfit_mlp, val)
    assert every.meta_["validation_points"]["scoring"] == 600  # the former default, kept
    given = peg.PEP(n_members=4, sigma=0.01).fit(overfit_mlp, val)  # σ given: nothing capped
    assert given.meta_["validation_points"]["scoring"] == 600
