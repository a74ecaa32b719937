"""`peg.ScaleSearch`: the search's options as one object, nested in PEG/PEP's parameters and
recorded in their recipes."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.base import clone

import peg
from peg import archive
from peg.methods.perturbation import _recipes
from peg.methods.perturbation._recipes import searched_options

from conftest import mlp


def test_the_search_is_one_nested_parameter():
    search = peg.ScaleSearch(method="golden", criterion="brier", race=0.0)
    made = peg.PEG(n_members=3, search=search)
    params = made.get_params(deep=True)
    assert params["search"] is search
    assert (params["search__criterion"], params["search__race"]) == ("brier", 0.0)
    assert "search__race" not in made.get_params(deep=False)
    assert (
        repr(made)
        == "PEG(n_members=3, search=ScaleSearch(method='golden', criterion='brier', race=0.0))"
    )
    twin = clone(made)
    assert twin.search is not search and twin.search.get_params() == search.get_params()
    made.set_params(search__race=2.0, n_members=4)
    assert (search.race, made.n_members) == (2.0, 4)


def test_a_bad_nested_value_changes_nothing():
    search = peg.ScaleSearch()
    made = peg.PEP(search=search)
    with pytest.raises(ValueError, match="holdout"):
        made.set_params(search__holdout=1.5)
    assert search.holdout == 0.5
    with pytest.raises(ValueError, match="unknown argument"):
        made.set_params(search__grid=[1e-3], searching=1)
    short = peg.PEG(search="golden")
    with pytest.raises(ValueError, match="search__race: search is 'golden'"):
        short.set_params(search__race=1.0)


def test_every_option_has_a_check_and_the_method_name_is_a_short_form():
    names = peg.ScaleSearch._param_names()
    assert list(peg.ScaleSearch.parameter_constraints) == names
    golden = peg.ScaleSearch.of("golden")
    assert golden.get_params() == {**peg.ScaleSearch().get_params(), "method": "golden"}


def test_the_surrogate_scores_1024_points_by_default_and_every_one_with_none(
    overfit_mlp, moons_data
):
    assert peg.ScaleSearch().exact_points == 1024
    with pytest.raises(ValueError, match="exact_points"):
        peg.PEG(search=peg.ScaleSearch(exact_points=0)).fit(overfit_mlp, moons_data["val"])
    options = {"n_members": 3, "grad_batch_size": 32, "seed": 0, "progress": False}
    fits = {
        points: peg.PEG(**options, search=peg.ScaleSearch(exact_points=points)).fit(
            overfit_mlp, moons_data["val"]
        )
        for points in (None, 40)
    }
    n = fits[None].meta_["validation_points"]["scoring"]
    assert n > 40 and set(fits[None].search_points_.values()) == {n}
    assert fits[None].search_stopped_ == [] and set(fits[40].search_points_.values()) == {40}
    recipe = fits[40]._recipe_options()
    assert recipe is not None and recipe["search"]["exact_points"] == 40


def test_the_search_by_need_is_deterministic_for_a_seed(overfit_mlp, moons_data):
    """Chunks, their stopping rule and the choice repeat for a fixed seed; at most 2 scales."""
    options = {"n_members": 4, "seed": 3, "progress": False}
    for made in (peg.PEG, peg.PEP):
        fits = [
            made(**options, search=peg.ScaleSearch(first_points=64)).fit(
                overfit_mlp, moons_data["val"]
            )
            for _ in range(2)
        ]
        a, b = fits
        assert a.search_ == b.search_ and a.search_points_ == b.search_points_
        assert a.search_predicted_ == b.search_predicted_
        assert 1 <= len(a.search_) <= 2 and set(a.search_points_.values()) <= {64, 128, 256, 300}
        X = moons_data["test"][0]
        # a rerun with the same seed: the same kernels on the same shapes, so the same bits
        torch.testing.assert_close(a.member_logits(X), b.member_logits(X), rtol=0, atol=0)


def test_the_stopping_rule_is_an_option_recorded_in_a_recipe(overfit_mlp, moons_data):
    search = peg.ScaleSearch(
        first_points=50, settle_se=3.0, settle_nats=0.01, settle_regret=0.0, scorings=3
    )
    fitted = peg.PEG(n_members=3, grad_batch_size=32, seed=0, search=search)
    fitted.fit(overfit_mlp, moons_data["val"])
    recorded = fitted._recipe_options()
    assert recorded is not None and {
        k: recorded["search"][k]
        for k in ("first_points", "settle_se", "settle_nats", "settle_regret", "scorings")
    } == {
        "first_points": 50, "settle_se": 3.0, "settle_nats": 0.01, "settle_regret": 0.0,
        "scorings": 3,
    }  # fmt: skip
    for bad in (
        {"first_points": 0},
        {"settle_se": -1.0},
        {"settle_regret": -1e-3},
        {"scorings": 0},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            peg.PEG(search=peg.ScaleSearch(**bad)).fit(overfit_mlp, moons_data["val"])


@pytest.mark.parametrize("old", ["criterion", "eta_holdout", "race", "search_tol", "bracket"])
def test_an_option_that_moved_says_where(old):
    with pytest.raises(TypeError, match=rf"{old}: now an option of the scale search"):
        peg.PEP(**{old: 1})


def test_the_grid_is_where_a_search_starts(overfit_mlp, moons_data):
    grid = [1e-3, 1e-2]
    made = peg.PEP(n_members=3, search=peg.ScaleSearch(method="golden", grid=grid, race=0))
    made.fit(overfit_mlp, moons_data["val"])
    assert set(grid) <= set(made.search_)  # the golden search scores its grid first
    default = peg.PEP(n_members=3, search=peg.ScaleSearch(method="golden", race=0))
    default.fit(overfit_mlp, moons_data["val"])
    assert set(peg.PEP.default_grid) <= set(default.search_)
    assert math.isclose(peg.PEP.default_grid[1], math.sqrt(5e-4 * 5e-3))


def test_a_recipe_records_the_search_and_rebuilds_it(overfit_mlp, moons_data, tmp_path):
    search = peg.ScaleSearch(criterion="brier", holdout=0.25, max_points=200, grid=[0.01, 0.1])
    fitted = peg.PEG(n_members=4, grad_batch_size=32, search=search).fit(
        overfit_mlp, moons_data["val"]
    )
    path = fitted.save(str(tmp_path / "recipe"))
    made = archive.read_header(path)["meta"]["recipe"]
    assert made["recipe_version"] == 4
    assert made["options"]["search"] == {**search.get_params(), "grid": [0.01, 0.1]}
    rebuilt = _recipes._from_options(peg.PEG, made, None)
    assert rebuilt.search.get_params() == {**search.get_params(), "grid": [0.01, 0.1]}
    loaded = peg.load(path, mlp(9), val=moons_data["val"])  # split as the search split it
    X = moons_data["test"][0]
    torch.testing.assert_close(loaded.member_logits(X), fitted.member_logits(X))


def test_a_callable_criterion_is_saved_as_members(overfit_mlp, moons_data, tmp_path):
    def nll(logits, y):
        return peg.metrics.nll(logits, y)

    fitted = peg.PEG(n_members=2, grad_batch_size=32, eta=[0.01, 0.1])
    fitted.set_params(search=peg.ScaleSearch(criterion=nll)).fit(overfit_mlp, moons_data["val"])
    assert fitted.meta_["criterion"] == "nll"
    with pytest.warns(UserWarning, match="cannot be stored as a recipe"):
        path = fitted.save(str(tmp_path / "members"))
    assert "recipe" not in archive.read_header(path)["meta"]


def test_a_version_2_recipe_is_read_through_the_old_names():
    options = {
        "n_members": 4, "search": "golden", "criterion": "ece", "eta_holdout": 0.0,
        "max_score_points": None, "race": 0.0, "early_stop": False, "search_tol": 0.0,
    }  # fmt: skip
    search = searched_options(options)
    assert options == {"n_members": 4}
    assert peg.ScaleSearch(**search).get_params() == {
        "method": "golden", "criterion": "ece", "holdout": 0.0, "max_points": None,
        "exact_points": 1024, "first_points": 1024, "settle_se": 2.0, "settle_nats": 1e-3,
        "settle_regret": 1e-3, "scorings": 3, "unsure": "points", "race": 0.0, "early_stop": False,
        "tol": 0.0,
        "grid": None,
    }  # fmt: skip
    pep = {"bracket": [1e-3, 1e-1]}
    assert searched_options(pep) == {"grid": [1e-3, pytest.approx(1e-2), 1e-1]}


@pytest.mark.parametrize(
    ("version", "search", "match"),
    [
        (3, {"race": -1}, "race"),
        (3, "golden", "search"),
        (2, None, "grid"),
    ],
)
def test_a_malformed_recorded_search_is_an_archive_error(version, search, match):
    options = {"n_members": 2} if search is None else {"n_members": 2, "search": search}
    if version == 2:
        options["bracket"] = [1e-3]  # not a (low, high) pair
    recipe = {"recipe_version": version, "options": options, "scale_name": "sigma", "scale": 0.1}
    with pytest.raises(peg.ArchiveError, match=rf"meta\.recipe\.options\.search': .*{match}"):
        _recipes._from_options(peg.PEP, recipe, None)
