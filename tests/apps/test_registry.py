"""What the applications share: the method registry (`peg.apps.registry`), the subsampling
helper (`peg.apps.data`) and the results writer (`peg.apps.results`)."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import peg
from peg.apps import registry
from peg.apps.bench import names, spec, uci
from peg.apps.data import subsample
from peg.apps.diversity.config import DiversityConfig
from peg.apps.diversity.methods import columns
from peg.apps.registry import Site, build, configure, register, scales
from peg.apps.results import to_json, write_json, write_results
from peg.ensemble import Ensemble

from conftest import mlp, moons

APPS = Path(peg.__file__).resolve().parent / "apps"


@pytest.fixture(scope="module")
def site() -> Site:
    X, y = moons(200, 0)
    net = mlp(0)
    net.eval()
    return Site(seed=0, progress=False, base=lambda: net, val=moons(100, 1), train=(X, y))


# ---------------------------------------------------------------- the registry
def test_every_key_the_applications_name_is_registered():
    assert set(spec.METHODS) <= set(registry.REGISTRY)
    assert {m.method for m in uci.SPECS} <= set(registry.REGISTRY)
    assert list(registry.REGISTRY)[: len(spec.METHODS)] == list(spec.METHODS)
    assert all(cls.key == key for key, cls in registry.REGISTRY.items())


def test_an_unknown_key_names_the_known_ones(site):
    with pytest.raises(ValueError, match=r"unknown 'bayes'.*'peg'"):
        build("bayes", site)


@pytest.mark.parametrize(
    ("key", "options", "match"),
    [
        ("peg", {"eta": -1.0}, "eta"),
        ("pep", {"colour": 1}, "colour"),
        ("packed", {"alpha": 2, "num_estimators": 0}, "num_estimators"),
        ("emp", {"colour": 1}, "unknown option"),
        ("base", {"n_members": 3}, "no options"),
        ("mc-dropout-trained", {"n_members": 0}, "n_members"),
    ],
)
def test_configure_checks_the_options_and_trains_nothing(key, options, match):
    def refuse():
        raise AssertionError("configure touched the base")

    with pytest.raises((TypeError, ValueError), match=match):
        configure(key, Site(base=refuse), options)


def test_post_hoc_methods_take_the_sites_seed_and_score_points(site):
    made = configure("peg", Site(seed=7, score_points=50), {"n_members": 3})
    assert (made.unfitted.seed, made.unfitted.search.max_points) == (7, 50)
    given = configure(
        "pep", Site(seed=7, score_points=50), {"search": {"max_points": None}, "seed": 1}
    )
    assert (given.unfitted.seed, given.unfitted.search.max_points) == (1, None)
    golden = configure("pep", Site(score_points=50), {"search": "golden"}).unfitted.search
    assert (golden.method, golden.max_points) == ("golden", 50)
    from peg.apps.bench.paper import PAPER  # the paper's grid, scored on the gradient points

    paper = configure("peg", Site(score_points=50), PAPER).unfitted
    assert (paper.eta, paper.search.holdout, paper.search.max_points) == (PAPER["eta"], 0.0, 50)


def test_build_fits_on_the_sites_base_and_validation_data(site):
    base = build("base", site)
    assert base is site.base()
    ts = build("temperature", site)
    pep = build("pep", site, n_members=3, sigma=1e-3)
    assert scales(ts) == {"T": float(ts.temperature_)}
    assert scales(pep) == {"sigma": 1e-3}
    assert scales(base) == {}
    assert pep.member_logits(site.val[0]).shape == (3, 100, 2)
    assert isinstance(build("mc-dropout", site, n_members=2, insert=0.2), peg.MCDropout)


def test_single_model_methods_refuse_an_ensemble(site):
    ensemble = Ensemble.from_models([mlp(0), mlp(1)])
    with pytest.raises(ValueError, match="mc-dropout: needs a single model"):
        build("mc-dropout", Site(base=lambda: ensemble), n_members=2, insert=0.2)


def test_laplace_fits_on_the_training_data_where_the_site_has_them(site):
    pytest.importorskip("laplace")
    fitted = build("laplace", site)  # the bench's site: training data (200 points)
    assert isinstance(fitted, peg.Laplace) and fitted.meta_["data_points"] == 200
    assert scales(fitted) == {"prior_precision": fitted.prior_precision_}
    compare_site = Site(base=site.base, val=site.val)  # peg.compare's: validation data only
    assert build("laplace", compare_site).meta_["data_points"] == 100
    grid = build("laplace", site, prior_optimization="gridsearch", link_approx="bridge")
    assert grid.meta_["data_points"] == 200 and grid.meta_["prior_optimization"] == "gridsearch"
    assert names.denoted("Laplace") == ("laplace", "single", {})
    mc = names.denoted("Laplace-MC-8")
    assert mc == ("laplace", "single", {"link_approx": "mc", "n_members": 8})
    assert len(build(mc[0], site, **mc[2])) == 8
    with pytest.raises(ValueError, match="laplace: needs a single model"):
        build("laplace", Site(base=lambda: Ensemble.from_models([mlp(0), mlp(1)]), val=site.val))


def test_a_builder_names_what_its_site_lacks(site):
    with pytest.raises(ValueError, match="model: the method needs a model"):
        build("packed", site, alpha=2, num_estimators=2)
    with pytest.raises(ValueError, match="iterates"):
        build("diagonal-gaussian", site, n_members=2)


def test_methods_that_train_their_own_model_use_the_sites_recipe(site):
    trained = []

    def fit_model(net: nn.Module, loss) -> nn.Module:
        trained.append(type(net).__name__)
        assert loss is site.packed_loss
        return net.eval()

    own = Site(
        seed=0, model=lambda **kw: peg.models.MLP(2, 2, hidden=(8,), **kw), fit_model=fit_model
    )
    packed = build("packed", own, alpha=2, num_estimators=2, gamma=1)
    assert trained == ["MLP"] and len(packed) == 2
    assert registry.entry("packed").trains and not registry.entry("peg").trains


def test_a_new_method_is_one_registered_class(site):
    @register("test-identity")
    class Identity(registry.Builder):
        def __init__(self, site, options):
            self.options = dict(options)

        def fit(self, site):
            return site.base()

    try:
        assert build("test-identity", site) is site.base()
        with pytest.raises(ValueError, match=r"'test-identity' is registered already \(Identity\)"):
            register("test-identity")(type("Other", (Identity,), {}))
    finally:
        registry.REGISTRY.remove("test-identity")


def _method_names() -> set[str]:
    """Registry keys and the names the applications show: the papers' table names, the UCI
    columns, the diversity study's columns."""
    table = {p for p, _ in names.TABLE_NAMES if re.fullmatch(r"[\w -]+", p)}
    study = set(columns(DiversityConfig(), mlp(0), 100, 5, {}))
    return set(registry.REGISTRY) | table | set(uci.METHODS) | study


def _method_name_tests(path: Path, names: set[str]) -> list[str]:
    """`x == "peg"`, `x in ("packed", "emp")`, `x.startswith("PEG")`: a method chosen by name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                consts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                values = {c.value for c in consts if isinstance(c, ast.Constant)}
                if values and values <= names:  # ("name", "method", "base"): a spec's fields
                    found.append(f"{path.name}:{node.lineno}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and any(
                n.startswith(node.args[0].value) or n.endswith(node.args[0].value) for n in names
            )
        ):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_application_chooses_a_method_by_an_if_chain():
    names = _method_names()
    assert {"peg", "packed", "Single", "PEG-10", "MC dropout"} <= names
    found = [hit for p in APPS.rglob("*.py") for hit in _method_name_tests(p, names)]
    assert not found


# ---------------------------------------------------------------- subsampling
def test_subsample_keeps_the_permutation_order_unless_sorted():
    X, y = torch.arange(10.0), torch.arange(10)
    first = torch.randperm(10, generator=torch.Generator().manual_seed(3))[:4]
    Xs, ys = subsample(X, y, 4, 3)
    assert torch.equal(ys, first) and torch.equal(Xs, first.float())
    assert torch.equal(subsample(X, y, 4, 3, sort=True)[1], first.sort().values)
    assert subsample(X, y, None, 3)[1] is y and subsample(X, y, 10, 3)[1] is y
    assert subsample(X, None, 4, 3)[1] is None


# ---------------------------------------------------------------- the results writer
def test_results_writer_formats_as_the_applications_always_did(tmp_path):
    results = {"a": 1.5, "b": [1, 2], "nan": math.nan}
    assert to_json(results) == json.dumps(results, indent=2) + "\n"
    assert (
        to_json({"p": tmp_path}, default=str) == json.dumps({"p": str(tmp_path)}, indent=2) + "\n"
    )
    strict = to_json({"t": torch.tensor([1.0, math.inf]), 3: math.nan}, indent=1, strict=True)
    assert json.loads(strict) == {"t": [1.0, None], "3": None}
    js, md = write_results(tmp_path / "run", results, "# table\n", stem="x")
    assert (js.name, md.name) == ("x.json", "x.md")
    assert js.read_text() == to_json(results) and md.read_text() == "# table\n"
    assert write_json(tmp_path / "y.json", [1]).read_text() == "[\n  1\n]\n"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["x.json", "x.md"]  # no temps
