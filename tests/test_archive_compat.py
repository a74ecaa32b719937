"""Archives written by peg 0.1 keep loading: recipes rebuild with today's option names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import peg
from peg import archive

from conftest import mlp

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "archives-0.1"


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
