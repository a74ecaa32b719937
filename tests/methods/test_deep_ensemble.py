"""Deep Ensembles: independent members, reproducible, resumable member by member."""

from __future__ import annotations

import pytest
import torch

import peg
from peg.methods.trained.deep_ensemble import member_seed
from peg.train import Recipe

from conftest import BNNet, mlp

RECIPE = Recipe(epochs=3, lr=0.05, batch_size=32)


def _stacked_equal(a: peg.Ensemble, b: peg.Ensemble) -> bool:
    return len(a) == len(b) and all(
        torch.equal(a.member_state(i)[k], b.member_state(i)[k])
        for i in range(len(a))
        for k in a.member_state(i)
    )


def test_members_are_different_trained_models(moons_data):
    recipe = RECIPE.replace(epochs=10, lr=0.1)
    de = peg.DeepEnsemble(n_members=3, recipe=recipe, seed=0).fit(mlp, moons_data["train"])
    X = moons_data["test"][0]
    logits = de.member_logits(X)
    assert logits.shape == (3, len(X), 2)
    assert not torch.equal(logits[0], logits[1])
    torch.testing.assert_close(de.predict_proba(X).sum(-1), torch.ones(len(X)))
    assert len(set(de.seeds_)) == 3
    acc = (de.predict(X) == moons_data["test"][1]).float().mean()
    assert acc > 0.85


def test_same_seed_same_members_and_member_i_does_not_depend_on_size(moons_data):
    a = peg.DeepEnsemble(n_members=2, recipe=RECIPE, seed=4).fit(mlp(0), moons_data["train"])
    b = peg.DeepEnsemble(n_members=3, recipe=RECIPE, seed=4).fit(mlp(0), moons_data["train"])
    for i in range(2):
        assert all(
            torch.equal(v, b.ensemble().member_state(i)[k])
            for k, v in a.ensemble().member_state(i).items()
        )
    assert member_seed(4, 0) != member_seed(5, 0)


def test_reinit_false_starts_every_member_from_the_given_weights(moons_data):
    recipe = RECIPE.replace(epochs=1)
    base = mlp(0)
    de = peg.DeepEnsemble(n_members=2, recipe=recipe, reinit=False).fit(base, moons_data["train"])
    # same start, different data order: close to each other but not equal
    s0, s1 = (de.ensemble().member_state(i) for i in range(2))
    assert not torch.equal(s0["0.weight"], s1["0.weight"])


class _Interrupt(Exception):
    pass


def test_an_interrupted_run_resumes_at_the_next_member(moons_data, tmp_path):
    recipe = RECIPE.replace(epochs=2)
    ref = peg.DeepEnsemble(n_members=3, recipe=recipe, seed=1).fit(BNNet, moons_data["train"])
    calls = []

    def failing_factory():
        calls.append(1)
        if len(calls) == 3:
            raise _Interrupt  # dies while starting the third member
        return BNNet()

    with pytest.raises(_Interrupt):
        peg.DeepEnsemble(n_members=3, recipe=recipe, seed=1, checkpoint_dir=tmp_path).fit(
            failing_factory, moons_data["train"]
        )
    assert sorted(p.name for p in tmp_path.glob("member-*")) == [
        "member-0.safetensors",
        "member-1.safetensors",
    ]
    trained = []

    def counting_factory():
        trained.append(1)
        return BNNet()

    resumed = peg.DeepEnsemble(n_members=3, recipe=recipe, seed=1, checkpoint_dir=tmp_path).fit(
        counting_factory, moons_data["train"]
    )
    assert _stacked_equal(ref.ensemble(), resumed.ensemble())
    assert resumed.histories_ == ref.histories_
    # members 0 and 1 were loaded, not retrained (the factory only supplies their skeleton)
    assert len(list(tmp_path.glob("member-*.partial.safetensors"))) == 0


def test_a_member_file_from_another_run_is_refused(moons_data, tmp_path):
    peg.DeepEnsemble(n_members=1, recipe=RECIPE, seed=1, checkpoint_dir=tmp_path).fit(
        mlp, moons_data["train"]
    )
    with pytest.raises(ValueError, match="another run"):
        peg.DeepEnsemble(n_members=1, recipe=RECIPE, seed=2, checkpoint_dir=tmp_path).fit(
            mlp, moons_data["train"]
        )


def test_peg_on_a_deep_ensemble_gives_q_times_r_members(moons_data):
    de = peg.DeepEnsemble(n_members=3, recipe=RECIPE).fit(mlp, moons_data["train"])
    p = peg.PEG(n_members=5, grad_batch_size=32, eta=0.05).fit(de, moons_data["val"])
    assert len(p) == 15


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n_members": 0}, "n_members"), ({"recipe": {"epochs": 3}}, "recipe")],
)
def test_bad_deep_ensemble_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        peg.DeepEnsemble(**kwargs)


def test_training_data_without_labels_is_refused():
    with pytest.raises(ValueError, match="labels"):
        peg.DeepEnsemble(n_members=1, recipe=RECIPE).fit(mlp, torch.randn(10, 2))


def test_a_saved_deep_ensemble_loads_without_data(moons_data, tmp_path):
    """Its meta["recipe"] is the training Recipe, not a PEG/PEP build recipe: no val needed."""
    de = peg.DeepEnsemble(n_members=2, recipe=RECIPE, progress=False).fit(mlp, moons_data["train"])
    loaded = peg.load(de.save(str(tmp_path / "de.peg")), mlp())
    assert _stacked_equal(loaded, de.ensemble()) and loaded.meta == de.meta_
    assert de.meta_["n_members"] == 2 and de.meta_["recipe"] == RECIPE.to_dict()
