"""Saving and loading: safetensors + JSON, atomic, clear errors for foreign or damaged files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import peg
from peg.archive import ArchiveError

from conftest import BNNet, mlp


def test_round_trip_gives_identical_predictions(tmp_path, overfit_mlp, moons_data):
    p = peg.PEG(size=4, batch_size=32, eta="search").fit(overfit_mlp, moons_data["val"])
    path = tmp_path / "peg15"
    p.save(str(path))
    assert path.is_file() and not list(tmp_path.glob(".*tmp"))
    loaded = peg.load(path, mlp(5))
    X = moons_data["test"][0]
    assert torch.equal(loaded.member_logits(X), p.member_logits(X))
    assert loaded.meta["method"] == "PEG" and loaded.meta["eta"] == p.eta_
    assert loaded.meta["seed"] == 0 and loaded.meta["batch_size"] == 32
    assert not any(b"pickle" in line for line in path.read_bytes().splitlines()[:1])


def test_round_trip_with_batchnorm(tmp_path, bn_net):
    X, y = torch.randn(200, 2), torch.randint(0, 3, (200,))
    p = peg.PEG(size=3, batch_size=32, eta=0.2, bn="refresh").fit(bn_net, (X, y), bn_data=X)
    p.save(tmp_path / "bn")
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
        fitted = peg.PEP(size=6, seed=2).fit(overfit_mlp, val)
    else:
        variant = "unbiased" if method == "peg-unbiased" else "vanilla"
        fitted = peg.PEG(size=6, batch_size=32, seed=2, variant=variant).fit(overfit_mlp, val)
    recipe = fitted.save(str(tmp_path / "recipe"), materialize=False)
    full = fitted.save(str(tmp_path / "full"))
    base = peg.Ensemble.from_models([overfit_mlp]).save(str(tmp_path / "base"))
    size = Path(recipe).stat().st_size
    assert size < Path(full).stat().st_size
    assert size < Path(base).stat().st_size + 4096  # the base weights + a JSON recipe
    loaded = peg.load(recipe, mlp(9), val=val)
    X = moons_data["test"][0]
    torch.testing.assert_close(loaded.member_logits(X), fitted.member_logits(X))
    assert "recipe" not in loaded.meta and loaded.meta["method"] == fitted.ensemble().meta["method"]


def test_a_recipe_refuses_other_data_and_needs_val(overfit_mlp, moons_data, tmp_path):
    fitted = peg.PEG(size=3, batch_size=32, eta=0.1, seed=2).fit(overfit_mlp, moons_data["val"])
    path = fitted.save(str(tmp_path / "recipe"), materialize=False)
    with pytest.raises(ArchiveError, match="val: .* recipe"):
        peg.load(path, mlp(9))
    X, y = moons_data["val"]
    with pytest.raises(ArchiveError, match="not the validation data"):
        peg.load(path, mlp(9), val=(X[:-1], y[:-1]))


def test_a_recipe_detects_members_that_no_longer_match(
    overfit_mlp, moons_data, tmp_path, monkeypatch
):
    fitted = peg.PEG(size=3, batch_size=32, eta=0.1, seed=2).fit(overfit_mlp, moons_data["val"])
    path = fitted.save(str(tmp_path / "recipe"), materialize=False)
    from peg.methods import peg as peg_module

    original = peg_module.cross_entropy
    changed = lambda o, y: 2 * original(o, y)  # noqa: E731  # "the code changed"
    monkeypatch.setattr(peg_module, "cross_entropy", changed)
    with pytest.raises(ArchiveError, match="differ from the ones saved"):
        peg.load(path, mlp(9), val=moons_data["val"])


def test_ensembles_a_recipe_cannot_express_are_saved_whole(overfit_mlp, moons_data, tmp_path):
    fitted = peg.PEG(size=2, batch_size=32, eta=0.1, params=lambda n, p: True).fit(
        overfit_mlp, moons_data["val"]
    )
    with pytest.warns(UserWarning, match="cannot be stored as a recipe"):
        path = fitted.save(str(tmp_path / "x"), materialize=False)
    assert len(peg.load(path, mlp(9))) == 2
