"""Saving and loading: safetensors + JSON, atomic, clear errors for foreign or damaged files."""

from __future__ import annotations

import json
import os

import pytest
import torch

import peg

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
