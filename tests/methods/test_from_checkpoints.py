"""SWA, SWAG and Deep Ensembles from the user's own training: `from_checkpoints` equals `fit` fed
the same snapshots, files of either kind are read (torch's weights-only only), a checkpoint that
is not the model's is refused naming its index, and the archives load back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import peg
from bad_inputs import raises_test
from peg.train import Recipe

from conftest import BNNet, mlp

RECIPE = Recipe(epochs=6, lr=0.05, schedule="swa", swa_start=2, swa_lr=0.02, batch_size=32)


class _Snapshots:
    """Callback: the state dicts `fit` collects (after each epoch past swa_start)."""

    def __init__(self, swa_start: int) -> None:
        self.swa_start, self.states = swa_start, []

    def __call__(self, epoch: int, model: nn.Module) -> None:
        if epoch > self.swa_start:
            self.states.append({k: v.detach().clone() for k, v in model.state_dict().items()})


def _trained(cls, factory, data, **kw):
    snapshots = _Snapshots(RECIPE.swa_start)
    fitted = cls(recipe=RECIPE, seed=0, **kw).fit(factory, data, callbacks=[snapshots])
    return fitted, snapshots.states


@pytest.mark.parametrize("factory", [lambda: mlp(1), BNNet], ids=["mlp", "batchnorm"])
def test_swa_from_checkpoints_equals_the_trained_path(moons_data, factory):
    trained, states = _trained(peg.SWA, factory, moons_data["train"])
    assert len(states) == RECIPE.epochs - RECIPE.swa_start
    model = factory()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    made = peg.SWA.from_checkpoints(model, states, bn_data=moons_data["train"])
    got = made.swa_model_.state_dict()
    for k, v in trained.swa_model_.state_dict().items():  # BatchNorm statistics too
        torch.testing.assert_close(got[k], v, msg=k)
    X = moons_data["test"][0]
    torch.testing.assert_close(made.member_logits(X), trained.member_logits(X))
    assert made.collected == len(states) and made.meta_["collected"] == len(states)
    assert made.meta_["from"] == "checkpoints" and "recipe" not in made.meta_
    for k, v in model.state_dict().items():  # the user's model is never modified: no
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)  # arithmetic, the same bits


@pytest.mark.parametrize("factory", [lambda: mlp(1), BNNet], ids=["mlp", "batchnorm"])
def test_swag_from_checkpoints_equals_the_trained_path(moons_data, factory):
    kw = {"max_num_models": 3, "n_members": 3}
    trained, states = _trained(peg.SWAG, factory, moons_data["train"], **kw)
    made = peg.SWAG.from_checkpoints(factory(), states, bn_data=moons_data["train"], **kw)
    torch.testing.assert_close(made.mean_, trained.mean_)
    torch.testing.assert_close(made.var_, trained.var_)
    torch.testing.assert_close(made.deviations_, trained.deviations_)
    X = moons_data["test"][0]  # same seed: the same samples, BatchNorm refreshed on the same data
    torch.testing.assert_close(made.member_logits(X), trained.member_logits(X))
    assert made.meta_["deviations"] == 3 and made.meta_["bn"] == "refresh"


def test_swag_moments_are_those_of_the_snapshots_given(moons_data):
    """Fewer snapshots than max_num_models: K is the number given (the low-rank term is scaled
    by K - 1, not max_num_models - 1), var the snapshots' variance (not a standard deviation)."""
    _, states = _trained(peg.SWA, lambda: mlp(1), moons_data["train"])
    states = states[:3]
    swag = peg.SWAG.from_checkpoints(mlp(5), states, max_num_models=20, n_members=2)
    W = torch.stack([torch.cat([s[k].flatten() for k in s]) for s in states])  # [3, P]
    torch.testing.assert_close(swag.mean_, W.mean(0))
    torch.testing.assert_close(swag.var_, W.var(0, unbiased=False), atol=1e-6, rtol=1e-4)
    running = W.cumsum(0) / torch.arange(1, 4).unsqueeze(1)
    torch.testing.assert_close(swag.deviations_, W - running)
    assert swag.deviations_.shape[0] == 3 == swag.collected


def test_checkpoint_files_of_either_kind_are_read(moons_data, tmp_path):
    _, states = _trained(peg.SWA, lambda: mlp(1), moons_data["train"])
    paths = []
    for i, state in enumerate(states):
        if i % 2:
            paths.append(tmp_path / f"epoch{i}.safetensors")
            save_file(state, paths[-1])
        else:
            paths.append(tmp_path / f"epoch{i}.pt")
            torch.save(state, paths[-1])
    from_files = peg.SWAG.from_checkpoints(mlp(3), [str(p) for p in paths], n_members=2)
    from_dicts = peg.SWAG.from_checkpoints(mlp(3), states, n_members=2)
    torch.testing.assert_close(from_files.mean_, from_dicts.mean_)
    torch.testing.assert_close(from_files.deviations_, from_dicts.deviations_)


def test_archives_round_trip(moons_data, tmp_path):
    _, states = _trained(peg.SWA, lambda: mlp(1), moons_data["train"])
    X = moons_data["test"][0]
    for name, fitted in [
        ("swa", peg.SWA.from_checkpoints(mlp(2), states)),
        ("swag", peg.SWAG.from_checkpoints(mlp(2), states, n_members=3, diag=True)),
        ("de", peg.DeepEnsemble.from_checkpoints(mlp(2), states[:3])),
    ]:
        path = fitted.save(str(tmp_path / f"{name}.safetensors"))
        loaded = peg.load(path, mlp(9))
        torch.testing.assert_close(loaded.member_logits(X), fitted.member_logits(X))
        assert loaded.meta["method"] == fitted.meta_["method"]


def test_deep_ensemble_from_models_and_from_checkpoints(moons_data):
    models = [mlp(i) for i in range(3)]
    ensemble = peg.DeepEnsemble.from_models(models)
    X = moons_data["test"][0]
    with torch.no_grad():
        expected = torch.stack([m(X) for m in models])
    torch.testing.assert_close(ensemble.member_logits(X), expected)
    assert len(ensemble) == 3 == ensemble.n_members and ensemble.meta_["from"] == "models"
    saved = peg.DeepEnsemble.from_checkpoints(mlp(7), [m.state_dict() for m in models])
    torch.testing.assert_close(saved.member_logits(X), expected)
    torch.testing.assert_close(saved.predict_proba(X), ensemble.predict_proba(X))


def test_swa_of_a_batchnorm_model_without_bn_data_warns(moons_data):
    _, states = _trained(peg.SWA, BNNet, moons_data["train"])
    with pytest.warns(UserWarning, match="bn_data"):
        swag = peg.SWAG.from_checkpoints(BNNet(), states, n_members=2)
    assert swag.meta_["bn"] == "eval"  # nothing to refresh the samples' statistics on
    torch.testing.assert_close(
        swag.swa_model_.state_dict()["body.1.running_mean"], states[-1]["body.1.running_mean"]
    )


# ------------------------------------------------------------------------------ bad input
def _states(n: int = 3) -> list[dict[str, torch.Tensor]]:
    return [mlp(i).state_dict() for i in range(n)]


def _edited(i: int, edit: Callable[[dict[str, torch.Tensor]], None]) -> list[dict]:
    states = [dict(s) for s in _states()]
    edit(states[i])
    return states


def _reshaped(state: dict[str, torch.Tensor]) -> None:
    state["2.weight"] = torch.zeros(3, 20)


def _prefixed(state: dict[str, torch.Tensor]) -> None:
    for k in list(state):
        state["model." + k] = state.pop(k)


def _nan(state: dict[str, torch.Tensor]) -> None:
    state["0.bias"] = torch.full_like(state["0.bias"], float("nan"))


def _int8(state: dict[str, torch.Tensor]) -> None:
    state["0.weight"] = state["0.weight"].mul(100).to(torch.int8)


def _complex_model() -> nn.Module:
    return nn.Linear(3, 2, dtype=torch.complex64)


def _complex_nan() -> list[dict[str, torch.Tensor]]:
    state = dict(_complex_model().state_dict())
    state["bias"] = torch.full_like(state["bias"], complex(float("nan"), 0.0))
    return [state]


RAN: list[str] = []


def _record(what: str) -> None:
    RAN.append(what)


class _RunsCode:
    """Unpickled by a plain pickle, it runs `_record` (what a malicious file would do)."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_record, ("ran",))


def _write_pickle(tmp: Path) -> str:
    path = tmp / "pickled.pt"
    torch.save({"0.weight": _RunsCode()}, path)
    return str(path)


def _write(tmp: Path, name: str, text: str) -> str:
    (tmp / name).write_text(text)
    return str(tmp / name)


ERROR_CASES = [
    (
        "SWA",
        "from_checkpoints: a checkpoint of another shape",
        lambda: peg.SWA.from_checkpoints(mlp(0), _edited(1, _reshaped)),
        ValueError,
        r"checkpoints\[1\]: entry '2.weight' has shape \(3, 20\), the model's \(2, 20\)",
    ),
    (
        "SWA",
        "from_checkpoints: names with a prefix",
        lambda: peg.SWA.from_checkpoints(mlp(0), _edited(2, _prefixed)),
        ValueError,
        r"checkpoints\[2\]: its entries are not the model's.*prefix 'model\.'",
    ),
    (
        "SWA",
        "from_checkpoints: a whole training checkpoint",
        lambda: peg.SWA.from_checkpoints(mlp(0), [{"model": _states(1)[0], "epoch": 3}]),
        ValueError,
        r"checkpoints\[0\]: holds nested entries \['model'\].*checkpoint\['model'\]",
    ),
    (
        "SWA",
        "from_checkpoints: NaN weights",
        lambda: peg.SWA.from_checkpoints(mlp(0), _edited(0, _nan)),
        FloatingPointError,
        r"checkpoints\[0\]: entry '0.bias' holds NaN",
    ),
    (
        "SWA",
        "from_checkpoints: NaN in a complex entry",
        lambda: peg.SWA.from_checkpoints(_complex_model(), _complex_nan()),
        FloatingPointError,
        r"checkpoints\[0\]: entry 'bias' holds NaN",
    ),
    (
        "SWA",
        "from_checkpoints: an int8 entry for a float model",
        lambda: peg.SWA.from_checkpoints(mlp(0), _edited(1, _int8)),
        ValueError,
        r"checkpoints\[1\]: entry '0.weight' is torch.int8, the model's torch.float32",
    ),
    (
        "SWA",
        "from_checkpoints: one state dict, not a list",
        lambda: peg.SWA.from_checkpoints(mlp(0), _states(1)[0]),
        TypeError,
        "checkpoints: expected a list",
    ),
    (
        "SWA",
        "from_checkpoints: a training argument",
        lambda: peg.SWA.from_checkpoints(mlp(0), _states(), recipe=Recipe()),
        ValueError,
        "recipe: SWA.from_checkpoints trains nothing",
    ),
    (
        "SWA",
        "from_checkpoints: model not a module",
        lambda: peg.SWA.from_checkpoints(lambda: mlp(0), _states()),
        TypeError,
        "model: expected the nn.Module",
    ),
    (
        "SWAG",
        "from_checkpoints: one checkpoint",
        lambda: peg.SWAG.from_checkpoints(mlp(0), _states(1)),
        ValueError,
        r"checkpoints: SWAG \(a variance\) needs at least 2, got 1",
    ),
    (
        "DeepEnsemble",
        "from_models: models of two architectures",
        lambda: peg.DeepEnsemble.from_models([mlp(0), mlp(1, hidden=5)]),
        ValueError,
        "models",
    ),
    (
        "DeepEnsemble",
        "from_models: n_members disagrees",
        lambda: peg.DeepEnsemble.from_models([mlp(0), mlp(1)], n_members=3),
        ValueError,
        "n_members: 3, but 2 members were given",
    ),
]

FILE_ERROR_CASES = [
    (
        "SWA",
        "from_checkpoints: a pickle beyond weights",
        lambda tmp: peg.SWA.from_checkpoints(mlp(0), [_write_pickle(tmp)]),
        ValueError,
        r"checkpoints\[0\]: .* not a PyTorch checkpoint: it holds a pickled [\w.]*_record, code",
    ),
    (
        "SWA",
        "from_checkpoints: a text file named .pt",
        lambda tmp: peg.SWA.from_checkpoints(mlp(0), [_write(tmp, "w.pt", "hello world\n")]),
        ValueError,
        r"checkpoints\[0\]: .*w.pt is not a PyTorch checkpoint",
    ),
    (
        "SWA",
        "from_checkpoints: a file of another kind",
        lambda tmp: peg.SWA.from_checkpoints(mlp(0), [_write(tmp, "w.pkl", "x")]),
        ValueError,
        r"checkpoints\[0\]: w.pkl is neither a .safetensors file nor a torch weights file",
    ),
    (
        "SWA",
        "from_checkpoints: a damaged safetensors file",
        lambda tmp: peg.SWA.from_checkpoints(mlp(0), [_write(tmp, "w.safetensors", "x")]),
        ValueError,
        r"checkpoints\[0\]: .* is not a readable safetensors file",
    ),
    (
        "SWA",
        "from_checkpoints: a missing file",
        lambda tmp: peg.SWA.from_checkpoints(mlp(0), [str(tmp / "absent.pt")]),
        ValueError,
        r"checkpoints\[0\]: .* is not a file",
    ),
]

test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)


def test_nothing_runs_from_a_refused_file(tmp_path):
    """The file is refused by torch's weights-only loader, its code never run."""
    path = _write_pickle(tmp_path)
    RAN.clear()
    with pytest.raises(ValueError, match="nothing in the file ran") as refused:
        peg.SWA.from_checkpoints(mlp(0), [path])
    assert RAN == []
    # the blocked global named; torch's advice to retry with weights_only=False never relayed
    assert "_record" in str(refused.value) and "weights_only=False" not in str(refused.value)
    assert "`weights_only` set to `False`" not in str(refused.value)
    torch.load(path, weights_only=False)  # what a plain unpickling would have done
    assert RAN == ["ran"]


@pytest.mark.parametrize("text", ["hello world\n", "", "0123456789", '{"a": 1}', "PK\x03\x04x"])
def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path, text):
    """A text file named .pt gave a raw KeyError or IndexError."""
    path = _write(tmp_path, "weights.pt", text)
    with pytest.raises(ValueError, match=r"weights.pt is not a PyTorch checkpoint") as refused:
        peg.DeepEnsemble.from_checkpoints(mlp(0), [path, path])
    assert "weights_only=False" not in str(refused.value)


def test_the_same_checkpoint_twice_warns(tmp_path):
    """Three times the same checkpoint passed silently: a degenerate SWAG or ensemble."""
    states = _states(2)
    path = tmp_path / "a.safetensors"
    save_file(states[0], str(path))
    with pytest.warns(UserWarning, match=r"checkpoints\[2\]: the same weights as checkpoints\[0\]"):
        peg.SWAG.from_checkpoints(mlp(0), [states[0], states[1], str(path)], n_members=2)
    with pytest.warns(UserWarning, match="identical checkpoints") as said:
        peg.DeepEnsemble.from_checkpoints(mlp(0), [states[1]] * 3)
    assert len(said) == 2 and said[0].filename == __file__  # said where it was called


def test_checkpoints_of_another_precision_are_read():
    """float16 entries for a float32 model: the same kind of numbers, cast without a word."""
    half = [{k: v.half() for k, v in s.items()} for s in _states(2)]
    swa = peg.SWA.from_checkpoints(mlp(0), half)
    assert swa.swa_model_.state_dict()["0.weight"].dtype == torch.float32
