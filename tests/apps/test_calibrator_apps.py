"""The calibrators beside temperature scaling in the applications: registry keys, `peg bench`
table names (on the single model, or on an earlier column with `base:`), the Fashion-MNIST
preset's columns, `peg.compare` by name."""

from __future__ import annotations

import json
import math

import pytest

import peg
from peg.apps.bench import runner
from peg.apps.bench.spec import find_spec, load_specs, parse_spec
from peg.apps.compare import compare, method
from peg.apps.registry import Site, build, configure

from conftest import mlp, moons, run_bench

KEYS = {
    "vector-scaling": peg.VectorScaling,
    "matrix-scaling": peg.MatrixScaling,
    "dirichlet": peg.DirichletCalibration,
    "histogram-binning": peg.HistogramBinning,
    "isotonic": peg.IsotonicCalibration,
    "spline": peg.SplineCalibration,
    "ensemble-temperature": peg.EnsembleTemperatureScaling,
    "order-preserving": peg.OrderPreservingScaling,
}
NAMES = {
    "Vector-scaled": "vector-scaling",
    "Matrix-scaled": "matrix-scaling",
    "Dirichlet": "dirichlet",
    "Hist-binned": "histogram-binning",
    "Isotonic": "isotonic",
    "Spline": "spline",
    "Ensemble-TS": "ensemble-temperature",
    "Order-preserving": "order-preserving",
}
SPEC = {
    "name": "tiny-calibrators",
    "data": "digits",
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"epochs": 3, "lr": 0.05, "batch_size": 64},
    "seeds": [0],
    "train_points": 300,
    "score_points": None,
    "methods": ["Single", "Temp-scaled", *NAMES,
                {"name": "Dirichlet on TS", "method": "dirichlet", "base": "Temp-scaled"}],
}  # fmt: skip



@pytest.mark.parametrize(("key", "cls"), list(KEYS.items()))
def test_each_calibrator_is_a_post_hoc_registry_method(key, cls):
    net = mlp(0).eval()
    site = Site(seed=3, base=lambda: net, val=moons(200, 1))
    fitted = build(key, site)
    assert type(fitted) is cls and fitted.predictor_ is net
    with pytest.raises(TypeError, match="seed"):  # not seeded: it has nothing random
        configure(key, site, {"seed": 1})


def test_the_table_names_denote_the_calibrators_on_the_single_model_or_an_earlier_column():
    spec = parse_spec(SPEC)
    by_name = {m.name: m for m in spec.methods}
    for name, key in NAMES.items():
        assert (by_name[name].method, by_name[name].base) == (key, "single")
    on_ts = by_name["Dirichlet on TS"]
    assert (on_ts.method, on_ts.base) == ("dirichlet", "Temp-scaled")


def test_a_bad_option_fails_before_anything_is_trained():
    bad = {**SPEC, "methods": ["Single", {"name": "Hist-binned", "n_bins": 0}]}
    with pytest.raises(ValueError, match="n_bins"):
        runner.check_methods(parse_spec(bad))


def test_a_bench_run_scores_every_calibrator_column(tmp_path):
    spec = parse_spec(SPEC)
    run_bench(spec, tmp_path)
    saved = json.loads((tmp_path / "tiny-calibrators" / "results.json").read_text())
    test = saved["datasets"]["test"]
    assert list(test) == [m.name for m in spec.methods]
    for name in [*NAMES, "Dirichlet on TS"]:
        assert math.isfinite(test[name]["nll"]["mean"]), name
    assert test["Vector-scaled"]["nll"]["mean"] < test["Single"]["nll"]["mean"]


def test_the_fashion_mnist_preset_has_the_five_columns_after_temp_scaled():
    (spec,) = load_specs(find_spec("fashion-mnist"))
    names = [m.name for m in spec.methods]
    at = names.index("Temp-scaled")
    assert names[at + 1 : at + 6] == list(NAMES)[:5]  # the three newer maps are not in it
    runner.check_methods(spec)


def test_peg_compare_fits_them_by_name_and_on_an_earlier_method():
    val, test = moons(300, 1), moons(200, 2)
    methods = ["Dirichlet", "Isotonic", method("Vector scaling on TS", "vector-scaling", on="TS")]
    done = compare(mlp(0).eval(), val, test, methods, say=None)
    rows = [r["method"] for r in done.table]
    assert rows == ["Dirichlet", "Isotonic", "TS", "Vector scaling on TS"]
    assert done.predictors["Vector scaling on TS"].predictor_ is done.predictors["TS"]
    assert all(math.isfinite(r["nll"]) for r in done.table)
