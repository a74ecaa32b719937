"""The method contract (`peg.methods.base.Method`, scikit-learn's estimator protocol), checked
on every method class: arguments stored as given (`get_params`, `set_params`, `clone`), a repr
of the non-default ones, keyword-only constructors, `fit` returning self, `NotFittedError`
before `fit`, `meta_`, and one name, `n_members`, for the member count.

To cover another class, add a `Case` to `CASES`: the class, constructor arguments (not all
defaults, so the repr shows some), a quick fit on tiny data, and an invalid value of one argument.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError as SklearnNotFitted
from sklearn.utils.validation import check_is_fitted
from torch import nn

import peg
from peg.errors import InvalidParameterError, NotFittedError
from peg.layers import patch
from peg.methods.base import Method, Params, is_fitted
from peg.methods.calibration._calibrator import Calibrator
from peg.models import MLP
from peg.subspace import DiagonalGaussian, DropoutSubspace, LowRankGaussian, RandomSubspace
from peg.train import Recipe

from conftest import mlp, moons

X, y = moons(64, 0)
SGD = Recipe(epochs=1, batch_size=32)
SWA_RECIPE = Recipe(epochs=2, batch_size=32, schedule="swa", swa_start=0, swa_lr=0.01)
# names the member count must not go by (it is `n_members` everywhere)
OTHER_NAMES = {"size", "samples", "num_estimators", "num_samples", "n_samples", "members"}


def _tiny() -> nn.Module:
    return mlp(0, hidden=4)


def _patched() -> nn.Module:
    return patch(mlp(0, hidden=4), k=2, mode="emp", layers="input+output", seed=0)


def _packed() -> nn.Module:
    torch.manual_seed(0)
    return MLP(2, 2, hidden=(8,), packed=(2, 2, 1))


def _scorer() -> nn.Module:
    """A binary scorer: one logit per row, `[N, 1]` (the maps that take binary scores only)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))


def _iterates() -> list[nn.Module]:
    return [mlp(s, hidden=4) for s in range(3)]


@dataclass(frozen=True)
class Case:
    cls: type[Method]
    kwargs: dict[str, Any]
    fit: Callable[[Any], Any]  # fits an unfitted instance on tiny data; returns fit's result
    invalid: tuple[str, Any]  # an argument and a value the constructor refuses (ValueError)
    needs: str | None = None  # an optional package fit needs (the case is skipped without it)
    model: Callable[[], nn.Module] = _tiny  # what `fit` fits on (and `peg.load` reads back onto)
    proba: tuple[int, ...] = (len(X), 2)  # the shape of `predict_proba(X)`

    @property
    def id(self) -> str:
        return self.cls.__name__


CASES = [
    Case(
        peg.PEG,
        {"n_members": 3, "grad_batch_size": 16, "eta": 0.1, "seed": 1, "progress": False},
        lambda m: m.fit(_tiny().eval(), (X, y)),
        ("grad_batch_size", 0),
    ),
    Case(
        peg.PEP,
        {
            "n_members": 3,
            "sigma": [0.01, 0.1],
            "search": peg.ScaleSearch(grid=[1e-3, 1e-2]),
            "progress": False,
        },
        lambda m: m.fit(_tiny().eval(), (X, y)),
        ("search", "exhaustive"),
    ),
    Case(
        peg.DeepEnsemble,
        {"n_members": 2, "recipe": SGD, "seed": 1, "progress": False},
        lambda m: m.fit(_tiny, (X, y)),
        ("n_members", 0),
    ),
    Case(
        peg.SWA,
        {"recipe": SWA_RECIPE, "batch_size": 32, "progress": False},
        lambda m: m.fit(_tiny, (X, y)),
        ("batch_size", 0),
    ),
    Case(
        peg.SWAG,
        {"recipe": SWA_RECIPE, "n_members": 2, "diag": True, "progress": False},
        lambda m: m.fit(_tiny, (X, y)),
        ("n_members", 0),
    ),
    Case(
        peg.MCDropout,
        {"n_members": 3, "insert": 0.2, "seed": 2},
        lambda m: m.fit(_tiny(), X),
        ("insert", 1.5),
    ),
    Case(peg.MCPatched, {"n_members": 3, "seed": 1}, lambda m: m.fit(_patched()), ("seed", 0.5)),
    Case(peg.PackedEnsemble, {"batch_size": 16}, lambda m: m.fit(_packed()), ("batch_size", 0)),
    Case(
        RandomSubspace,
        {"n_members": 2, "radius": 0.05, "progress": False},
        lambda m: m.fit(_tiny()),
        ("radius", 0),
    ),
    Case(
        DropoutSubspace,
        {"n_members": 2, "keep": 0.5, "progress": False},
        lambda m: m.fit(_tiny()),
        ("keep", (0.9, 0.1)),
    ),
    Case(
        DiagonalGaussian,
        {"n_members": 2, "scale": 0.5, "progress": False},
        lambda m: m.fit(_iterates()),
        ("scale", -1.0),
    ),
    Case(
        LowRankGaussian,
        {"n_members": 2, "rank": 1, "progress": False},
        lambda m: m.fit(_iterates()),
        ("rank", 0),
    ),
    Case(
        peg.TemperatureScaling,
        {"max_iter": 5, "batch_size": 32},
        lambda m: m.fit(_tiny(), (X, y)),
        ("max_iter", 0),
    ),
    Case(
        peg.Laplace,
        {"link_approx": "mc", "n_members": 3, "seed": 1, "batch_size": 32},
        lambda m: m.fit(_tiny(), (X, y)),
        ("link_approx", "logit"),
        needs="laplace",
    ),
    Case(
        peg.VectorScaling,
        {"scores": "log_probs", "max_iter": 20},
        lambda m: m.fit(_tiny(), (X, y)),
        ("scores", "probs"),
    ),
    Case(
        peg.MatrixScaling,
        {"reg_lambda": 0.1, "reg_mu": 0.1, "batch_size": 32},
        lambda m: m.fit(_tiny(), (X, y)),
        ("reg_lambda", -1.0),
    ),
    Case(
        peg.DirichletCalibration,
        {"reg_lambda": 1.0, "l2": 0.01},
        lambda m: m.fit(_tiny(), (X, y)),
        ("reg_mu", float("nan")),
    ),
    Case(
        peg.HistogramBinning,
        {"n_bins": 5, "strategy": "quantile"},
        lambda m: m.fit(_tiny(), (X, y)),
        ("n_bins", 0),
    ),
    Case(
        peg.IsotonicCalibration,
        {"floor": 1e-4, "batch_size": 16},
        lambda m: m.fit(_tiny(), (X, y)),
        ("floor", 1.0),
    ),
    Case(
        peg.SplineCalibration,
        {"n_knots": 4, "floor": 1e-4},
        lambda m: m.fit(_tiny(), (X, y)),
        ("n_knots", 1),
    ),
    Case(
        peg.EnsembleTemperatureScaling,
        {"max_iter": 50, "batch_size": 16},
        lambda m: m.fit(_tiny(), (X, y)),
        ("tol", 0.0),
    ),
    Case(
        peg.OrderPreservingScaling,
        {"n_knots": 4, "reg": 0.1, "scores": "log_probs"},
        lambda m: m.fit(_tiny(), (X, y)),
        ("reg", -1.0),
    ),
]
# the maps of binary scores (and multi-label heads): fitted on a one-logit scorer, P(y = 1) [N, 1]
CASES += [
    Case(cls, kwargs, lambda m: m.fit(_scorer(), (X, y)), invalid, model=_scorer, proba=(len(X), 1))
    for cls, kwargs, invalid in [
        (peg.PlattScaling, {"smoothed_targets": False, "max_iter": 50}, ("max_iter", 0)),
        (peg.BetaCalibration, {"batch_size": 16}, ("batch_size", 0)),
        (peg.VennAbers, {"batch_size": 16}, ("batch_size", 0)),
    ]
]
CASES += [
    Case(
        peg.ConformalClassifier,
        {"alpha": 0.2, "score": "raps", "randomized": True, "seed": 3},
        lambda m: m.fit(_tiny(), (X, y)),
        ("alpha", 1.0),
    ),
    Case(
        peg.ConformalRegressor,
        {"alpha": 0.2, "score": "absolute", "batch_size": 16},
        lambda m: m.fit(_tiny(), (X, X[:, 0])),  # a Gaussian head: (mean, log-variance)
        ("score", "quantile"),
    ),
    Case(
        peg.LabelShift,
        {"calibrate": "ts", "tol": 1e-5, "batch_size": 16},
        lambda m: m.fit(_tiny(), (X, y), target=X[:40]),
        ("method", "ml"),
    ),
]
IDS = [case.id for case in CASES]
# classes with the argument protocol but not the predictor protocol: the argument tests only
ARGUMENT_CASES = [
    *CASES,
    Case(
        peg.OODDetector,
        {"score": "knn", "k": 5, "batch_size": 32},
        lambda m: m.fit(_tiny(), (X, y)),
        ("k", 0),
    ),
    Case(
        peg.AutoSelect,
        {"candidates": ["TS"], "cv": 2, "progress": False},
        lambda m: m.fit(_tiny(), (X, y)),
        ("cv", 1),
    ),
    Case(
        peg.PerformanceEstimator,
        {"method": "atc-mc", "confidence": 0.8, "transport_points": 50},
        lambda m: m.fit(_tiny(), (X, y)),
        ("confidence", 1.5),
    ),
]
SRC = Path(peg.__file__).parent


def _parameters(cls: type) -> list[inspect.Parameter]:
    """The constructor's arguments, without self and without PEG/PEP's `**moved` (the former
    options now the search's, refused with a message saying where they went)."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return [p for p in parameters if p.kind is not p.VAR_KEYWORD]


@pytest.fixture(params=CASES, ids=IDS)
def case(request: pytest.FixtureRequest) -> Case:
    if request.param.needs is not None:
        pytest.importorskip(request.param.needs)
    return request.param


def test_every_method_class_is_covered():
    """Every public method class is a `Method` and has a case here."""
    covered = {case.cls for case in CASES}
    for name in peg.methods.__all__:
        cls = getattr(peg.methods, name)
        assert issubclass(cls, Method), name
        assert cls in covered, f"{name}: add a Case to CASES"


def test_constructor_arguments_are_keyword_only(case):
    assert all(p.kind is p.KEYWORD_ONLY for p in _parameters(case.cls)), case.id


def test_get_params_returns_the_arguments_as_given(case):
    method = case.cls(**case.kwargs)
    params = method.get_params(deep=False)
    assert list(params) == [p.name for p in _parameters(case.cls)]
    for name, value in case.kwargs.items():
        assert params[name] is value, name  # stored unchanged, never converted
    defaults = {p.name: p.default for p in _parameters(case.cls)}
    for name in set(params) - set(case.kwargs):
        assert params[name] is defaults[name], name


def _plain(method: Method) -> dict[str, object]:
    """`get_params(deep=True)` with a nested object (PEP's ScaleSearch) by its class: the
    nested parameters compare by value, the object itself is a copy."""
    return {
        k: type(v) if isinstance(v, Params) else v for k, v in method.get_params(deep=True).items()
    }


def test_clone_gives_an_equal_unfitted_method(case):
    method = case.cls(**case.kwargs)
    copied = clone(method)
    assert type(copied) is case.cls and copied is not method
    assert _plain(copied) == _plain(method)
    fitted = case.fit(case.cls(**case.kwargs))
    again = clone(fitted)  # clone takes the arguments only, never the fitted state
    assert _plain(again) == _plain(fitted)
    with pytest.raises(NotFittedError):
        _ = again.meta_


def test_repr_shows_the_non_default_arguments(case):
    assert repr(case.cls()) == f"{case.id}()"
    text = repr(case.cls(**case.kwargs))
    defaults = {p.name: p.default for p in _parameters(case.cls)}
    for name, value in case.kwargs.items():
        shown = f"{name}={value!r}" in text
        assert shown == (value is not defaults[name] and value != defaults[name]), name


def test_set_params_checks_names_and_values(case):
    method = case.cls(**case.kwargs)
    with pytest.raises(
        InvalidParameterError, match=r"unknown argument\(s\) \['bad'\]; valid: \["
    ) as error:
        method.set_params(bad=1)
    for name in method.get_params(deep=False):
        assert repr(name) in str(error.value)
    name, invalid = case.invalid
    old = method.get_params()[name]
    with pytest.raises(InvalidParameterError, match=name) as refused:
        method.set_params(**{name: invalid})
    assert method.get_params()[name] is old  # the old value is kept
    with pytest.raises(InvalidParameterError) as constructor:
        case.cls(**{**case.kwargs, name: invalid})
    assert str(refused.value) == str(constructor.value)  # the constructor's error
    assert method.set_params(**{name: old}) is method


def test_nothing_fitted_before_fit(case):
    method = case.cls(**case.kwargs)
    with pytest.raises(NotFittedError, match="fit"):
        _ = method.meta_
    assert not hasattr(method, "meta_")  # NotFittedError is an AttributeError
    with pytest.raises(NotFittedError, match="fit"):
        method.predict_proba(X)
    with pytest.raises(NotFittedError, match="fit"):
        method.member_logits(X)
    with pytest.raises(NotFittedError, match="fit"):
        len(method)


def test_fit_returns_self_with_meta(case):
    method = case.cls(**case.kwargs)
    assert case.fit(method) is method
    assert isinstance(method.meta_, dict) and method.meta_["method"]
    logits = method.member_logits(X)
    assert len(method) == logits.shape[0] and logits.shape[1] == len(X)
    assert method.predict_proba(X).shape == case.proba
    assert method.get_params() == case.cls(**case.kwargs).get_params()  # fit changes no argument


def test_the_member_count_is_n_members(case):
    params = {p.name for p in _parameters(case.cls)}
    assert not params & OTHER_NAMES, case.id
    method = case.fit(case.cls(**case.kwargs))
    assert not set(method.meta_) & OTHER_NAMES, case.id
    if "n_members" in params:
        n = case.kwargs.get("n_members", method.get_params()["n_members"])
        assert len(method) == n and method.meta_["n_members"] == n
    if case.cls is peg.PackedEnsemble:
        assert method.n_members_ == len(method) == method.meta_["n_members"] == 2


def test_fit_signatures_share_one_shape(case):
    """Post-hoc: fit(model, val=None, *, bn_data=None) (Laplace also train_data=None: the
    likelihood's points when they are not val); training-time: fit(model, train_data, *,
    bn_data=None, callbacks=()) (DeepEnsemble also val_data=None: its members are plain `train`
    runs, which stop early on it with `recipe.patience`); from iterates: fit(iterates, *,
    skeleton=None, bn_data=None).
    """
    fit = list(inspect.signature(case.cls.fit).parameters.values())[1:]
    positional = [p.name for p in fit if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword = {p.name: p.default for p in fit if p.kind is p.KEYWORD_ONLY}
    if positional[1:] == ["train_data"]:
        extra = {"val_data": None} if case.cls is peg.DeepEnsemble else {}
        assert keyword == {"bn_data": None, "callbacks": ()} | extra
    elif positional == ["iterates"]:
        assert keyword == {"skeleton": None, "bn_data": None}
    else:
        extra = {"train_data": None} if case.cls is peg.Laplace else {}
        after = (peg.LabelShift, peg.ConformalClassifier, peg.ConformalRegressor)
        extra |= {"target": None} if case.cls in after else {}
        # the maps over class labels also take `classes=` (string labels named by column)
        named = issubclass(case.cls, Calibrator) and case.cls is not peg.ConformalRegressor
        extra |= {"classes": None} if named else {}
        assert positional[1:] == ["val"] and fit[1].default is None
        assert keyword == {"bn_data": None} | extra


def test_what_save_writes_peg_load_reads_back(case, tmp_path):
    """Every method that saves is read back by the one loader, `peg.load(path, model)` (a PEG or
    PEP recipe with the validation data it was fitted on), with the same members."""
    method = case.fit(case.cls(**case.kwargs))
    if not hasattr(method, "save"):
        pytest.skip(f"{case.id} has no save")
    path = method.save(str(tmp_path / "method"))
    loaded = peg.load(path, case.model(), val=(X, y))
    torch.testing.assert_close(loaded.member_logits(X), method.member_logits(X))
    if isinstance(loaded, Method):
        assert type(loaded) is case.cls and loaded.meta_ == method.meta_


PROTOCOL = ("batch_size", "batch_fn", "progress", "autocast")


def test_the_predictor_protocol_is_one_signature(case):
    """`member_logits` / `iter_member_logits` / `predict_proba` take the protocol's arguments
    (`peg.methods.base`) on every class: `batch_size` second, the rest by keyword."""
    for verb in ("member_logits", "iter_member_logits", "predict_proba", "predict"):
        signature = inspect.signature(getattr(case.cls, verb))
        bound = signature.bind(None, X, 8, batch_fn=None, progress=False, autocast=None)
        assert bound.arguments["batch_size"] == 8, verb


def test_batch_fn_reaches_every_predictor(case):
    """A loader of another batch shape, read through `batch_fn` (the constructor's unless
    given), gives the logits of the tensors themselves."""
    method = case.cls(**case.kwargs)
    case.fit(method)
    from torch.utils.data import DataLoader

    loader = DataLoader([{"inputs": x} for x in X], batch_size=16)
    shaped = method.member_logits(loader, 16, batch_fn=lambda b: (b["inputs"], None))
    torch.testing.assert_close(shaped, method.member_logits(X, 16), atol=1e-6, rtol=0)


def test_a_property_failing_on_a_fitted_method_says_its_own_message():
    """`Method.__getattr__` (a fitted attribute asked before fit) must not hide the
    AttributeError a property raises itself: a fitted lazy PEG keeps no directions."""
    lazy = peg.PEG(n_members=2, grad_batch_size=16, eta=0.1, lazy=True).fit(_tiny().eval(), (X, y))
    with pytest.raises(AttributeError, match="a lazy ensemble keeps no directions_"):
        lazy.directions_  # noqa: B018
    with pytest.raises(NotFittedError, match="call fit"):
        peg.PEG().eta_  # noqa: B018


def _protocol_classes() -> list[type[Params]]:
    """Every class of peg's with the argument protocol (`Params`): methods, calibrators, the
    detectors, AutoSelect, and argument objects such as a search's."""
    for module in pkgutil.walk_packages(peg.methods.__path__, "peg.methods."):
        importlib.import_module(module.name)
    importlib.import_module("peg.detectors")
    importlib.import_module("peg.apps.select.auto")
    found, todo = [], [Params]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("peg.") and sub not in found:
                found.append(sub)
    return found


def test_every_argument_has_a_check():
    """One mechanism checks arguments: every constructor argument of every class has its entry
    in the class's `parameter_constraints` (checks between arguments: its `parameter_rules`)."""
    classes = _protocol_classes()
    assert {case.cls for case in ARGUMENT_CASES} <= set(classes)
    for cls in classes:
        missing = [n for n in cls._param_names() if n not in cls.parameter_constraints]
        assert not missing, f"{cls.__name__}: no check in parameter_constraints for {missing}"


def test_only_params_defines_check_params():
    """No class writes its own `_check_params`: `Params._check_params` runs the table and the
    rules for every class."""
    defined = [
        p.relative_to(SRC).as_posix()
        for p in sorted(SRC.rglob("*.py"))
        for line in p.read_text(encoding="utf-8").splitlines()
        if line.strip().startswith("def _check_params(")
    ]
    assert defined == ["methods/_arguments.py"], defined


@pytest.mark.parametrize("case", ARGUMENT_CASES, ids=[c.id for c in ARGUMENT_CASES])
def test_fit_checks_an_argument_set_directly(case):
    """An argument set on the object after construction (not through `set_params`) is checked
    by `fit` before any work: the table's error, raised from `_check_params`."""
    if case.needs is not None:
        pytest.importorskip(case.needs)
    name, invalid = case.invalid
    method = case.cls(**case.kwargs)
    setattr(method, name, invalid)
    with pytest.raises(InvalidParameterError, match=name) as error:
        case.fit(method)
    frames = [frame.name for frame in traceback.extract_tb(error.value.__traceback__)]
    assert "_check_params" in frames, frames
    assert frames.index("_check_params") == frames.index("fit") + 1, frames  # by fit itself


# (class, a valid constructor, arguments set directly that break a rule between arguments,
#  regex): `parameter_rules` run at fit as the table does
ONE_EPOCH = Recipe(epochs=1, schedule="swa", swa_start=0, swa_lr=0.01)
RULES = [
    (peg.ConformalClassifier, {}, {"randomized": True}, "randomized: LAC has no randomised"),
    (peg.ConformalClassifier, {"shift": "covariate"}, {"class_conditional": True}, "one weighting"),
    (peg.SWA, {"recipe": SWA_RECIPE}, {"recipe": SGD}, "recipe: SWA needs swa_start"),
    (peg.SWAG, {"recipe": SWA_RECIPE}, {"recipe": ONE_EPOCH}, "low-rank term needs at least 2"),
    (peg.Laplace, {}, {"pred_type": "nn"}, "link_approx: pred_type='nn' samples networks"),
]


@pytest.mark.parametrize("cls, kwargs, broken, message", RULES, ids=[r[-1] for r in RULES])
def test_fit_checks_the_rules_between_arguments(cls, kwargs, broken, message):
    method = cls(**kwargs)
    method.__dict__.update(broken)
    with pytest.raises(InvalidParameterError, match=message):
        method.fit(_tiny(), (X, y))


@pytest.mark.parametrize("case", ARGUMENT_CASES, ids=[c.id for c in ARGUMENT_CASES])
def test_fitted_is_one_question(case):
    """Unfitted before `fit`, fitted after, asked one way: the attribute `fit` sets last
    (`fitted_attribute`), which scikit-learn's `check_is_fitted` and `is_fitted` read."""
    if case.needs is not None:
        pytest.importorskip(case.needs)
    method = case.cls(**case.kwargs)
    assert not is_fitted(method)
    with pytest.raises(SklearnNotFitted):
        check_is_fitted(method)
    with pytest.raises(NotFittedError, match=rf"^{case.id}: call fit\(\.\.\.\) before saving$"):
        method._check_fitted("saving")
    case.fit(method)
    check_is_fitted(method)
    assert is_fitted(method) and case.cls.fitted_attribute in vars(method)
    assert not is_fitted(case.cls) and not is_fitted(_tiny())


def test_a_lazy_peg_is_fitted():
    lazy = peg.PEG(n_members=2, grad_batch_size=16, eta=0.1, lazy=True).fit(_tiny().eval(), (X, y))
    check_is_fitted(lazy)
