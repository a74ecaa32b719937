"""Archives written by peg 0.1 keep loading: recipes rebuild with today's option names; maps
over saved logits written before issue 46 (no `n_classes`, no header digest, a spline's every
validation confidence, a weightless module's map marked as one over logits) load and predict as
they did."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import peg
from peg import archive
from peg.methods.conformal._split import class_scores

from conftest import mlp

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "archives-0.1"
MAPS = Path(__file__).resolve().parent / "fixtures" / "maps-5b3ef0a"


@pytest.fixture(scope="module")
def saved() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / "data.safetensors"))


@pytest.mark.parametrize(
    ("name", "logits"), [("peg-recipe", "peg"), ("pep-recipe", "pep"), ("peg-members", "peg")]
)
def test_a_0_1_archive_loads_to_the_members_it_held(saved, name, logits):
    ens = peg.load(FIXTURES / name, mlp(0), val=(saved["X"], saved["y"]))
    # rebuilt from gradients / noise: equal up to the last bits a CPU may change
    torch.testing.assert_close(ens.member_logits(saved["X_test"]), saved[logits])


def test_the_0_1_recipes_use_the_old_option_names():
    """What the map of renamed options is for: these names are no longer the constructor's."""
    options = archive.read_header(FIXTURES / "peg-recipe")["meta"]["recipe"]["options"]
    assert {"size", "batch_size", "eval_batch_size"} <= set(options)


@pytest.fixture(scope="module")
def maps() -> dict[str, torch.Tensor]:
    return load_file(str(MAPS / "data.safetensors"))


class Times5(nn.Module):
    """The weightless module `times5-ts.peg` was fitted on (its architecture's name)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 5 * x


@pytest.mark.parametrize("name", ["ts", "vector", "spline", "ets", "ops", "conformal-ts"])
def test_a_map_written_before_issue_46_loads_and_predicts_as_it_did(maps, name):
    header = archive.read_header(MAPS / f"{name}.peg")
    assert "header_sha256" not in header
    # ETS and conformal recorded C already, the others did not
    assert ("n_classes" in header["meta"]["calibration"]) == (name in ("ets", "conformal-ts"))
    loaded = peg.load(MAPS / f"{name}.peg")
    torch.testing.assert_close(loaded.predict_proba(maps["X_test"]), maps[name])
    if name == "conformal-ts":
        sets = loaded.predict_set(maps["X_test"]).to(torch.uint8)
        # written on one CPU: another's kernels round the probabilities otherwise, so a class
        # whose APS score lies within float32 rounding of q̂ may fall on either side
        scores = class_scores(maps[name], "aps")
        near = (scores - loaded.quantile_).abs() < 1e-5
        assert torch.equal(sets[~near], maps[f"{name}-sets"][~near]) and near.float().mean() < 0.05


def test_older_maps_check_the_width_their_arrays_or_entry_fix(maps):
    """No `n_classes` in a TS or spline archive: any width, as before; vector scaling's bias
    `[5]` and ETS's recorded C fix theirs."""
    assert peg.load(MAPS / "ts.peg")._fitted_classes() is None
    assert peg.load(MAPS / "ts.peg").predict_proba(torch.zeros(2, 3)).shape == (2, 3)
    for name in ("vector", "ets"):
        with pytest.raises(ValueError, match=r"X: this .* was fitted on 5 classes, got logits "
                           r"with 3 columns"):  # fmt: skip
            peg.load(MAPS / f"{name}.peg").predict_proba(torch.zeros(2, 3))


def test_a_spline_archive_with_every_validation_confidence_still_loads():
    loaded = peg.load(MAPS / "spline.peg")
    assert loaded.confidences_.shape == (300,)


def test_an_older_map_over_a_weightless_module_needs_that_module(maps):
    """Saved then as a map over logits (`"inputs": "logits"`) with architecture Times5: it acts
    on 5 × the inputs, so it loads around a Times5 only."""
    path = MAPS / "times5-ts.peg"
    assert archive.read_header(path)["meta"]["inputs"] == "logits"
    with pytest.raises(TypeError, match=r"model: .* holds a map fitted on the outputs of a "
                       r"Times5 .* pass an instance of it"):  # fmt: skip
        peg.load(path)
    with pytest.raises(peg.ArchiveError, match=r"model: .* fitted on the outputs of Times5; got "
                       r"Identity\(\), another architecture"):  # fmt: skip
        peg.load(path, nn.Identity())
    loaded = peg.load(path, Times5())
    torch.testing.assert_close(loaded.predict_proba(maps["X_test"] / 5), maps["times5-ts"])
