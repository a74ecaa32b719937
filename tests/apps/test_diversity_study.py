"""`peg diversity` (peg.apps.diversity): its configuration, the command line, and the whole
study on a tiny configuration: every figure and its JSON, the table, cached trajectories."""

from __future__ import annotations

import json

import pytest

import peg.analysis.trajectories as trajectories_module
from peg.apps import cli, presets
from peg.apps.diversity import study as dr

FIGURES = (
    "cosine_similarity",
    "disagreement",
    "tsne",
    "diversity_accuracy",
    "ensemble_size",
    "radial_landscape",
)


def _no_training(*args, **kwargs):
    raise AssertionError("train() was called: the cached trajectory should have been reused")


# ---------------------------------------------------------------- configuration
def test_config_file_matches_the_built_in_defaults():
    spec = presets.find("diversity")
    assert spec == presets.folder() / "diversity.yaml"
    assert dr.load_config(spec) == dr.DiversityConfig()
    assert dr.load_config("diversity") == dr.DiversityConfig()  # a preset by its name
    assert dr.load_config(spec, quick=True) == dr.load_config(None, quick=True)


def test_config_errors_name_the_setting(tmp_path):
    with pytest.raises(ValueError, match="trajectories"):
        dr.DiversityConfig(trajectories=1)
    with pytest.raises(ValueError, match="ensemble_size"):
        dr.DiversityConfig(trajectories=3, ensemble_size=4)
    bad = tmp_path / "bad.yaml"
    bad.write_text("trajectoris: 3\n")
    with pytest.raises(ValueError, match="trajectoris"):
        dr.load_config(bad)


def test_cli_diversity_passes_the_quick_config(monkeypatch, tmp_path):
    seen = {}

    def fake_run(config, out, cache, progress, command, overwrite):
        seen.update(config=config, out=out, cache=cache, command=command, overwrite=overwrite)

    monkeypatch.setattr(dr, "run", fake_run)
    assert cli.main(["diversity", "--quick", "--out", str(tmp_path)]) == 0
    assert seen["config"] == dr.load_config(None, quick=True)
    assert seen["out"] == str(tmp_path) and seen["command"].startswith("peg diversity")
    assert seen["overwrite"] is False


# ---------------------------------------------------------------- the whole pipeline
TINY = dr.DiversityConfig(
    data="digits",
    train={"epochs": 3, "lr": 0.01, "optimizer": "adam", "weight_decay": 0.0,
           "schedule": "constant", "batch_size": 64},
    trajectories=3,
    train_points=300,
    val_points=150,
    test_points=120,
    samples=3,
    ensemble_size=2,
    tsne_samples=2,
    tsne_points=40,
    iterates=3,
    pca_rank=2,
    swag_epochs=2,
    score_points=None,
    grid=4,
    landscape_points=60,
    threads=1,
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("diversity")
    said: list[str] = []
    result = dr.run(TINY, root / "out", root / "cache", progress=False, say=said.append)
    return root, result, said


def test_pipeline_writes_every_figure_and_its_json(tiny_run):
    root, result, said = tiny_run
    out = root / "out"
    for stem in FIGURES:
        assert (out / f"{stem}.png").stat().st_size > 1000
        assert json.loads((out / f"{stem}.json").read_text())
    table = result["table"]
    assert set(table) == {
        "independent inits", "PEG", "PEP", "SWAG-Diag", "MC dropout", "random subspace",
        "dropout subspace", "diagonal Gaussian", "PCA Gaussian",
    }  # fmt: skip
    for name, row in table.items():
        assert 0 <= row["disagreement"] <= 1 and 0 <= row["accuracy"] <= 1, name
    assert table["MC dropout"].get("cosine_similarity") is None  # one set of weights
    assert "| independent inits |" in "\n".join(said)
    assert json.loads((out / "results.json").read_text())["data"] == "digits"
    assert (out / "results.md").read_text().count("\n|") >= 10
    tsne = json.loads((out / "tsne.json").read_text())
    assert len(tsne["points"]) == len(tsne["kind"]) == len(tsne["trajectory"])


def test_pipeline_reuses_cached_trajectories(tiny_run, monkeypatch):
    root, first, _ = tiny_run
    monkeypatch.setattr(trajectories_module, "train", _no_training)
    said: list[str] = []
    again = dr.run(TINY, root / "again", root / "cache", progress=False, say=said.append)
    assert all(again["from_cache"].values())
    assert sum("loaded from cache" in s for s in said) == TINY.trajectories
    assert again["table"]["independent inits"] == first["table"]["independent inits"]
    assert all((root / "again" / f"{stem}.png").stat().st_size > 0 for stem in FIGURES)
