"""Early stopping (`Recipe(patience=...)` with `train(val=...)`, `EarlyStopping`): the run stops
once the validation NLL stops improving, returns the best epoch's weights, and resumes from its
checkpoint to the uninterrupted result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from peg.methods import DeepEnsemble
from peg.train import EarlyStopping, Recipe, train

from conftest import mlp, moons

# 40 noisy points, a wide MLP, Adam without weight decay: the validation loss soon rises
RECIPE = Recipe(epochs=60, lr=0.05, optimizer="adam", weight_decay=0.0, batch_size=8,
                schedule="constant", patience=3)  # fmt: skip


@pytest.fixture(scope="module")
def data():
    return {"train": moons(40, 0, noise=0.4), "val": moons(300, 1, noise=0.4)}


def _nll(model, val):
    with torch.no_grad():
        return float(F.cross_entropy(model(val[0]), val[1]))


def _same(a, b):
    return all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_stops_when_the_validation_loss_rises_and_keeps_the_best_weights(data):
    model, history = train(mlp(0, hidden=64), data["train"], RECIPE, seed=1, val=data["val"])
    losses = [h["val_nll"] for h in history]
    best = min(range(len(losses)), key=losses.__getitem__)
    assert len(history) < RECIPE.epochs  # stopped early
    assert len(history) == best + 1 + RECIPE.patience  # `patience` epochs without improvement
    assert _nll(model, data["val"]) == pytest.approx(losses[best], rel=1e-5)
    assert _nll(model, data["val"]) < losses[-1]  # the best weights, not the last


def test_resumes_from_its_checkpoint_to_the_uninterrupted_result(data, tmp_path):
    ref, ref_history = train(mlp(0, hidden=64), data["train"], RECIPE, seed=1, val=data["val"])

    class Interrupt(Exception):
        pass

    def interrupt(epoch, model):
        if epoch == 4:
            raise Interrupt

    ckpt = tmp_path / "run.safetensors"
    with pytest.raises(Interrupt):
        train(mlp(0, hidden=64), data["train"], RECIPE, seed=1, val=data["val"],
              callbacks=[interrupt], checkpoint=ckpt)  # fmt: skip
    resumed, history = train(
        mlp(0, hidden=64), data["train"], RECIPE, seed=1, val=data["val"], checkpoint=ckpt
    )
    assert history == ref_history
    assert _same(resumed, ref)
    # a finished (stopped) run read again from its checkpoint trains no further
    again, history = train(
        mlp(5, hidden=64), data["train"], RECIPE, seed=1, val=data["val"], checkpoint=ckpt
    )
    assert history == ref_history
    assert _same(again, ref)


def test_deep_ensemble_members_each_stop_on_their_own(data, tmp_path):
    ens = DeepEnsemble(n_members=2, recipe=RECIPE, seed=0, checkpoint_dir=tmp_path).fit(
        lambda: mlp(0, hidden=64), data["train"], val_data=data["val"]
    )
    assert all(len(h) < RECIPE.epochs and "val_nll" in h[0] for h in ens.histories_)
    again = DeepEnsemble(n_members=2, recipe=RECIPE, seed=0, checkpoint_dir=tmp_path).fit(
        lambda: mlp(0, hidden=64), data["train"], val_data=data["val"]
    )
    assert again.histories_ == ens.histories_


def test_a_callback_stops_a_run_without_the_recipe_field(data):
    stopper = EarlyStopping(data["val"], patience=2)
    recipe = RECIPE.replace(patience=None)
    model, history = train(mlp(0, hidden=64), data["train"], recipe, seed=1, callbacks=[stopper])
    assert stopper.stop and len(history) == stopper.stopped_epoch < recipe.epochs
    assert _nll(model, data["val"]) == pytest.approx(stopper.best, rel=1e-5)


def test_patience_needs_validation_data_and_validation_data_needs_patience(data):
    with pytest.raises(ValueError, match="val: recipe.patience"):
        train(mlp(0), data["train"], RECIPE)
    with pytest.raises(ValueError, match="val: given without recipe.patience"):
        train(mlp(0), data["train"], RECIPE.replace(patience=None), val=data["val"])
    with pytest.raises(ValueError, match="patience"):
        Recipe(patience=0)
