"""Training loops: recipes, the SWA schedule, seeding, callbacks, checkpoint and resume."""

from __future__ import annotations

import pytest
import torch

from peg.train import Recipe, instantiate, swa_lr_factor, train

from conftest import BNNet, mlp


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_training_lowers_the_loss_and_records_history(moons_data):
    model, history = train(mlp(0), moons_data["train"], Recipe(epochs=8, lr=0.1, batch_size=32))
    assert [h["epoch"] for h in history] == list(range(1, 9))
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    assert not model.training


def test_same_seed_same_model_other_seed_other_model(moons_data):
    r = Recipe(epochs=2, batch_size=32)
    a, _ = train(BNNet(), moons_data["train"], r, seed=1)
    torch.manual_seed(0)
    b, _ = train(instantiate(BNNet(), 0), moons_data["train"], r, seed=1)
    c, _ = train(instantiate(BNNet(), 0), moons_data["train"], r, seed=2)
    assert _same_weights(a, b)
    assert not _same_weights(a, c)


def test_training_leaves_the_callers_global_rng_alone(moons_data):
    net = BNNet()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    train(net, moons_data["train"], Recipe(epochs=1, batch_size=64))
    assert torch.equal(torch.rand(3), expected)


def test_swa_schedule_is_constant_then_linear_then_constant():
    r = Recipe(epochs=20, lr=0.1, schedule="swa", swa_start=10, swa_lr=0.01)
    factors = [swa_lr_factor(e, r) for e in range(10)]
    assert factors[:6] == [1.0] * 6  # t <= 0.5
    assert factors[6] == pytest.approx(1 - 0.9 * 0.1 / 0.4)
    assert factors[9] == pytest.approx(0.1)  # t = 0.9: reached swa_lr / lr
    assert swa_lr_factor(10, r) == pytest.approx(0.1)


def test_swa_schedule_rates_as_used(moons_data):
    r = Recipe(epochs=8, lr=0.1, schedule="swa", swa_start=4, swa_lr=0.02, batch_size=64)
    _, history = train(mlp(0), moons_data["train"], r)
    lrs = [h["lr"] for h in history]
    assert lrs[:3] == pytest.approx([0.1, 0.1, 0.1])  # epochs 0..2: t <= 0.5
    assert lrs[3] == pytest.approx(0.1 - 0.08 * (0.75 - 0.5) / 0.4)
    assert lrs[4:] == pytest.approx([0.02] * 4)  # SWALR holds the SWA rate


def test_callbacks_run_after_every_epoch(moons_data):
    seen = []
    train(mlp(0), moons_data["train"], Recipe(epochs=3), callbacks=[lambda e, m: seen.append(e)])
    assert seen == [1, 2, 3]


class _Stop(Exception):
    pass


class _Counter:
    """A stateful callback: its state must survive a resume."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.total = torch.zeros(())
        self.stop_at = stop_at

    def __call__(self, epoch: int, model: torch.nn.Module) -> None:
        self.total += sum(p.sum() for p in model.parameters()).detach()
        if epoch == self.stop_at:
            raise _Stop

    def state_dict(self):
        return {"total": self.total}

    def load_state_dict(self, state):
        self.total = state["total"].clone()


@pytest.mark.parametrize("schedule", ["cosine", "swa"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resume_gives_the_uninterrupted_result(moons_data, tmp_path, schedule, optimizer):
    recipe = Recipe(
        epochs=5, lr=0.02, optimizer=optimizer, schedule=schedule, swa_start=2, swa_lr=0.005
    )
    ref_counter = _Counter()
    ref, ref_hist = train(
        instantiate(BNNet, 3), moons_data["train"], recipe, seed=4, callbacks=[ref_counter]
    )
    ckpt = tmp_path / "run.safetensors"
    with pytest.raises(_Stop):
        train(
            instantiate(BNNet, 3),
            moons_data["train"],
            recipe,
            seed=4,
            callbacks=[_Counter(stop_at=3)],
            checkpoint=ckpt,
        )
    assert ckpt.exists()
    counter = _Counter()
    resumed, hist = train(
        instantiate(BNNet, 3),
        moons_data["train"],
        recipe,
        seed=4,
        callbacks=[counter],
        checkpoint=ckpt,
    )
    assert _same_weights(ref, resumed)
    assert hist == ref_hist
    assert torch.equal(counter.total, ref_counter.total)


def test_a_checkpoint_of_another_run_is_refused(moons_data, tmp_path):
    ckpt = tmp_path / "run.safetensors"
    train(mlp(0), moons_data["train"], Recipe(epochs=1), checkpoint=ckpt)
    with pytest.raises(ValueError, match="another run"):
        train(mlp(0), moons_data["train"], Recipe(epochs=2), checkpoint=ckpt)


def test_a_foreign_file_is_not_read_as_a_checkpoint(moons_data, tmp_path):
    ckpt = tmp_path / "run.safetensors"
    ckpt.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="not a readable peg checkpoint"):
        train(mlp(0), moons_data["train"], Recipe(epochs=1), checkpoint=ckpt)


def test_instantiate_reinitialises_copies_without_touching_the_original():
    original = mlp(0)
    before = {k: v.clone() for k, v in original.state_dict().items()}
    a, b = instantiate(original, 1, reinit=True), instantiate(original, 2, reinit=True)
    assert not _same_weights(a, b)
    assert _same_weights(instantiate(original, 1, reinit=True), a)
    assert all(torch.equal(before[k], v) for k, v in original.state_dict().items())
    assert _same_weights(instantiate(original, 5), original)  # no reinit: a plain copy
    # a factory that seeds itself gives the same model whatever seed instantiate uses
    assert _same_weights(instantiate(lambda: mlp(7), 3), instantiate(lambda: mlp(7), 9))


def test_instantiate_rejects_what_is_not_a_model():
    with pytest.raises(TypeError, match="model"):
        instantiate(42, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="factory must return"):
        instantiate(lambda: "a string", 0)  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"epochs": 0}, "epochs"),
        ({"lr": -1.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"schedule": "step"}, "schedule"),
        ({"schedule": "swa"}, "swa_start"),
        ({"swa_start": 11, "epochs": 10}, "past the last epoch"),
        ({"swa_start": 2, "swa_lr": 0.0}, "swa_lr"),
        ({"momentum": -0.1}, "momentum"),
    ],
)
def test_bad_recipes_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        Recipe(**fields)


def test_unknown_recipe_fields_are_refused(moons_data):
    with pytest.raises(TypeError, match="unknown field"):
        train(mlp(0), moons_data["train"], epochs=1, learning_rate=0.1)


def test_training_needs_labels():
    with pytest.raises(ValueError, match="labels"):
        train(mlp(0), torch.randn(10, 2), Recipe(epochs=1))


def test_augmented_training_is_reproducible_and_differs_from_plain(tmp_path):
    torch.manual_seed(0)
    X, y = torch.rand(64, 3, 8, 8), torch.randint(0, 3, (64,))

    def net():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 3))

    r = Recipe(epochs=2, batch_size=16, augment=True)
    a, _ = train(instantiate(net, 0), (X, y), r, seed=1)
    b, _ = train(instantiate(net, 0), (X, y), r, seed=1)
    c, _ = train(instantiate(net, 0), (X, y), r.replace(augment=False), seed=1)
    assert _same_weights(a, b)
    assert not _same_weights(a, c)
    with pytest.raises(ValueError, match="augment"):
        Recipe(augment="yes")
