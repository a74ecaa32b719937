"""Saving and loading: safetensors + JSON, atomic, clear errors for foreign or damaged files."""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import peg
import peg.archive
from peg.archive import ArchiveError

from conftest import BNNet, mlp


def test_round_trip_gives_identical_predictions(tmp_path, overfit_mlp, moons_data):
    """materialize=True stores the members: `peg.load(path, model)` needs no data (issue 2)."""
    p = peg.PEG(n_members=4, grad_batch_size=32, eta="search").fit(overfit_mlp, moons_data["val"])
    path = tmp_path / "peg15"
    p.save(str(path), materialize=True)
    assert path.is_file() and not list(tmp_path.glob(".*tmp"))
    loaded = peg.load(path, mlp(5))
    X = moons_data["test"][0]
    assert torch.equal(loaded.member_logits(X), p.member_logits(X))
    assert "recipe" not in loaded.meta
    # val is not needed by an archive of members, and ignored if given (even other data)
    again = peg.load(path, mlp(5), val=(X[:7], torch.zeros(7, dtype=torch.long)))
    assert torch.equal(again.member_logits(X), p.member_logits(X))
    assert loaded.meta["method"] == "PEG" and loaded.meta["eta"] == p.eta_
    assert loaded.meta["seed"] == 0 and loaded.meta["grad_batch_size"] == 32
    assert not any(b"pickle" in line for line in path.read_bytes().splitlines()[:1])


def test_round_trip_with_batchnorm(tmp_path, bn_net):
    X, y = torch.randn(200, 2), torch.randint(0, 3, (200,))
    p = peg.PEG(n_members=3, grad_batch_size=32, eta=0.2, bn="refresh").fit(
        bn_net, (X, y), bn_data=X
    )
    p.save(tmp_path / "bn", materialize=True)
    loaded = peg.load(tmp_path / "bn", BNNet())
    assert torch.equal(loaded.member_logits(X), p.member_logits(X))


def test_not_an_archive(tmp_path):
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"\x80\x04\x95 this is a pickle, not an archive")
    with pytest.raises(peg.ArchiveError, match="not a peg archive"):
        peg.load(bad, mlp(0))
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(peg.ArchiveError, match="no 'peg' JSON header"):
        peg.load(tmp_path / "plain.safetensors", mlp(0))
    with pytest.raises(FileNotFoundError, match="no peg archive"):
        peg.load(tmp_path / "missing", mlp(0))


def test_truncated_archive(tmp_path):
    path = tmp_path / "ens"
    peg.Ensemble.from_models([mlp(0), mlp(1)]).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(peg.ArchiveError, match="truncated|damaged|not a peg archive"):
        peg.load(path, mlp(0))


def test_wrong_architecture(tmp_path):
    path = tmp_path / "ens"
    peg.Ensemble.from_models([mlp(0), mlp(1)]).save(path)
    with pytest.raises(peg.ArchiveError, match="does not match"):
        peg.load(path, mlp(0, hidden=21))


def test_header_is_json_with_format_version(tmp_path):
    from safetensors import safe_open

    path = tmp_path / "ens"
    peg.Ensemble.from_models([mlp(0)], meta={"method": "custom", "seed": 3}).save(path)
    with safe_open(str(path), "pt") as f:
        header = json.loads(f.metadata()["peg"])
    assert header["format"] == "peg-ensemble" and header["format_version"] == 1
    assert header["meta"] == {"method": "custom", "seed": 3}


def test_failed_write_keeps_the_previous_archive(tmp_path, monkeypatch):
    path = tmp_path / "ens"
    peg.Ensemble.from_models([mlp(0), mlp(1)]).save(path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        peg.Ensemble.from_models([mlp(2), mlp(3)]).save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ens"]


@pytest.mark.parametrize("method", ["peg", "pep", "peg-unbiased"])
def test_a_recipe_is_small_and_rebuilds_the_same_members(overfit_mlp, moons_data, tmp_path, method):
    val = moons_data["val"]
    if method == "pep":
        fitted = peg.PEP(n_members=6, seed=2).fit(overfit_mlp, val)
    else:
        variant = "unbiased" if method == "peg-unbiased" else "vanilla"
        fitted = peg.PEG(n_members=6, grad_batch_size=32, seed=2, variant=variant).fit(
            overfit_mlp, val
        )
    recipe = fitted.save(str(tmp_path / "recipe"))  # the default: base weights + recipe
    full = fitted.save(str(tmp_path / "full"), materialize=True)
    base = peg.Ensemble.from_models([overfit_mlp]).save(str(tmp_path / "base"))
    size = Path(recipe).stat().st_size
    assert size < Path(full).stat().st_size
    assert size < Path(base).stat().st_size + 4096  # the base weights + a JSON recipe
    loaded = peg.load(recipe, mlp(9), val=val)
    X = moons_data["test"][0]
    torch.testing.assert_close(loaded.member_logits(X), fitted.member_logits(X))
    assert "recipe" not in loaded.meta and loaded.meta["method"] == fitted.ensemble().meta["method"]
    assert len(peg.load(full, mlp(9), val=val)) == 6  # members stored: val is not used
    with pytest.raises(ArchiveError, match="recipe"):
        peg.load(recipe, mlp(9))


def _wide_mlp(seed: int = 0) -> nn.Module:
    """A small MLP whose weights (67k float32) dwarf the archive's JSON header."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(2, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
    ).eval()


@pytest.mark.parametrize("method", ["PEG", "PEP"])
def test_a_15_member_recipe_is_at_most_1_05_times_the_base_model(moons_data, tmp_path, method):
    """Issue 7: the default archive of PEG-15 / PEP-15 ≤ 1.05 × the base model's safetensors."""
    from safetensors.torch import save_file

    base = _wide_mlp()
    val = moons_data["val"]
    kwargs = {"batch_size": 32} if method == "PEG" else {}
    fitted = getattr(peg, method)(n_members=15, seed=1, progress=False, **kwargs).fit(base, val)
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, tmp_path / "base")
    recipe = fitted.save(str(tmp_path / "recipe"))
    full = fitted.save(str(tmp_path / "full"), materialize=True)
    base_size = (tmp_path / "base").stat().st_size
    assert Path(recipe).stat().st_size <= 1.05 * base_size
    assert Path(full).stat().st_size > 14 * base_size  # members (unperturbed tensors shared)
    header = peg.archive.read_header(recipe)
    assert header["members"] == 1 and header["meta"]["recipe"]["members"] == 15
    loaded = peg.load(recipe, _wide_mlp(5), val=val)
    X = moons_data["test"][0]
    assert len(loaded) == 15
    torch.testing.assert_close(loaded.member_logits(X), fitted.member_logits(X))


def test_a_recipe_refuses_other_data_and_needs_val(overfit_mlp, moons_data, tmp_path):
    fitted = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, seed=2).fit(
        overfit_mlp, moons_data["val"]
    )
    path = fitted.save(str(tmp_path / "recipe"))
    with pytest.raises(ArchiveError, match="val: .* recipe") as error:
        peg.load(path, mlp(9))
    message = str(error.value)
    assert "PEG-3 recipe" in message and "600 validation points" in message
    assert "materialize=True" in message and "val=" in message
    X, y = moons_data["val"]
    with pytest.raises(ArchiveError, match="not the validation data"):
        peg.load(path, mlp(9), val=(X[:-1], y[:-1]))
    with pytest.raises(ArchiveError, match="not the validation data"):
        peg.load(path, mlp(9), val=(X.flip(0), y.flip(0)))  # the same points, in another order
    pep = peg.PEP(n_members=2, sigma=0.01).fit(overfit_mlp, moons_data["val"])
    with pytest.raises(ArchiveError, match="PEP-2 recipe"):
        peg.load(pep.save(str(tmp_path / "pep")), mlp(9))


def test_no_val_fails_before_reading_the_members(overfit_mlp, moons_data, tmp_path, monkeypatch):
    fitted = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1).fit(overfit_mlp, moons_data["val"])
    path = fitted.save(str(tmp_path / "recipe"))
    from peg import loading

    def no_work(*args, **kwargs):
        raise AssertionError("rebuilt without val")

    monkeypatch.setattr(peg.PEG, "from_recipe", no_work)
    monkeypatch.setattr(loading, "Ensemble", no_work)
    with pytest.raises(ArchiveError, match="recipe"):
        peg.load(path, mlp(9))


def test_a_recipe_detects_members_that_no_longer_match(
    overfit_mlp, moons_data, tmp_path, monkeypatch
):
    fitted = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, seed=2).fit(
        overfit_mlp, moons_data["val"]
    )
    path = fitted.save(str(tmp_path / "recipe"))
    from peg.methods.perturbation import _gradients

    original = _gradients.cross_entropy_per_point
    changed = lambda o, y: 2 * original(o, y)  # noqa: E731  # "the code changed"
    monkeypatch.setattr(_gradients, "cross_entropy_per_point", changed)
    with pytest.raises(ArchiveError, match="differ from the ones saved"):
        peg.load(path, mlp(9), val=moons_data["val"])


@pytest.mark.parametrize(
    "options",
    [
        {"params": lambda n, p: True},
        {"search": peg.ScaleSearch(criterion=lambda logits, y: 0.0), "eta": [0.1, 0.2]},
        {"loss": lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction="none")},
        {"variant": "unbiased", "momentum": "given"},
    ],
    ids=["callable params", "callable criterion", "callable loss", "momentum buffers"],
)
def test_ensembles_a_recipe_cannot_express_are_saved_whole(
    overfit_mlp, moons_data, tmp_path, options
):
    if options.get("momentum") == "given":
        options = {
            **options,
            "momentum": {n: torch.zeros_like(p) for n, p in overfit_mlp.named_parameters()},
        }
    options = {"eta": 0.1, **options}
    fitted = peg.PEG(n_members=2, grad_batch_size=32, **options).fit(overfit_mlp, moons_data["val"])
    with pytest.warns(UserWarning, match="cannot be stored as a recipe"):
        path = fitted.save(str(tmp_path / "x"))  # the default asks for a recipe
    assert len(peg.load(path, mlp(9))) == 2
    assert "recipe" not in peg.archive.read_header(path)["meta"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted.save(str(tmp_path / "y"), materialize=True)  # asked for members: no warning


def test_bn_refresh_is_saved_whole(bn_net, tmp_path):
    X, y = torch.randn(200, 2), torch.randint(0, 3, (200,))
    p = peg.PEG(n_members=2, grad_batch_size=32, eta=0.2, bn="refresh").fit(
        bn_net, (X, y), bn_data=X
    )
    with pytest.warns(UserWarning, match="cannot be stored as a recipe"):
        path = p.save(str(tmp_path / "bn"))
    assert torch.equal(peg.load(path, BNNet()).member_logits(X), p.member_logits(X))


def test_materialize_must_be_a_bool(overfit_mlp, moons_data, tmp_path):
    fitted = peg.PEG(n_members=2, grad_batch_size=32, eta=0.1).fit(overfit_mlp, moons_data["val"])
    with pytest.raises(TypeError, match="materialize"):
        fitted.save(str(tmp_path / "x"), materialize="yes")
    assert not (tmp_path / "x").exists()


class _Payload:
    """Unpickling this would create a marker file: the code an untrusted pickle can run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_planted_torch_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "payload-ran"
    archive = tmp_path / "ensemble.peg"
    torch.save({"state": _Payload(marker)}, archive)  # what a malicious .pt "archive" looks like
    with pytest.raises(peg.ArchiveError, match="not a peg archive"):
        peg.load(archive, mlp(0))
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):  # weights_only refuses it too
        torch.load(archive, weights_only=True)
    assert not marker.exists()
    torch.load(archive, weights_only=False)  # only to show the payload works: never in peg
    assert marker.exists()
