"""The method registry of the applications: one place that maps a method key to how the method
is built and fitted, in the style of laplace-torch's registries. Every application that
chooses a method by name (the bench runner, the UCI runner, the paper tables, the demo, the
diversity study) goes through it::

    site = Site(seed=0, base=lambda: model, val=(X_val, y_val))
    ens = build("peg", site, n_members=15)          # PEG(seed=0, ...).fit(model, val)
    configure("pep", site, {"sigma": -1})            # ValueError, before anything is trained

A `Site` holds what a builder may draw on where it is built (the seed, the trained base, the
validation and training data, a fresh model and the application's way of training it, the
task's loss, checkpoints of a trajectory); an application fills in what it has, and a builder
that needs something its site lacks says so. Each entry is a `Builder` subclass registered
under its key with `@register(key)`: constructing it checks the options and trains nothing,
its `fit(site)` returns the fitted predictor (an nn.Module, an Ensemble or a fitted method).

Keys (in registration order): "base" (the site's base itself); the calibrators, post-hoc on
the base, each under its own key (`Calibrator.registry`: `Calibration` builders made from it,
one registered later found by `entry` too); post-hoc methods on the base: "peg", "pep",
"mc-dropout", "random-subspace", "dropout-subspace"; methods that train a model of their own
with the site's recipe (`Builder.trains`): "packed", "emp", "ecmp"; "laplace" (laplace-torch's
Laplace approximation around the base, on the site's training data when it has them);
"mc-dropout-trained" (trains); "swag" (SWAG moments collected from the base on the training
data); samplers fitted to a trajectory's checkpoints: "diagonal-gaussian", "low-rank-gaussian".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any, ClassVar, TypeVar

from peg.apps.site import Site  # re-exported: builders and applications take it from here
from peg.ensemble import Ensemble
from peg.layers import emp_loss, patch
from peg.methods import (
    PEG,
    PEP,
    SWAG,
    DiagonalGaussian,
    DropoutSubspace,
    Laplace,
    LowRankGaussian,
    MCDropout,
    MCPatched,
    PackedEnsemble,
    RandomSubspace,
)
from peg.methods.calibration._calibrator import Calibrator, calibrators
from peg.methods.laplace.laplace import require_laplace
from peg.methods.perturbation._scale_search import ScaleSearch
from peg.methods.trained.swag import has_batchnorm
from peg.models._packed import Packing
from peg.utils.registry import Registry

__all__ = ["REGISTRY", "Builder", "Site", "build", "check_all", "configure", "entry", "register"]


class Builder:
    """One registered method, configured: `__init__` checks the options (trains nothing),
    `fit(site)` returns the fitted predictor."""

    key: ClassVar[str] = ""
    trains: ClassVar[bool] = False  # trains a model of its own: never uses the site's base

    def __init__(self, site: Site, options: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def fit(self, site: Site) -> Any:
        raise NotImplementedError


REGISTRY: Registry[type[Builder]] = Registry("method")
# keys registered by an application module that builds through the registry (imported when named)
ELSEWHERE = {"auto-select": "peg.apps.select"}
B = TypeVar("B", bound=type[Builder])


def register(key: str) -> Callable[[B], B]:
    """Class decorator: register a `Builder` subclass under `key` (each key once)."""

    def add(cls: B) -> B:
        REGISTRY.add(key, cls)  # another class under `key` is refused, naming both
        cls.key = key
        return cls

    return add


def entry(key: str) -> type[Builder]:
    """The builder registered under `key`, or of the calibrator of that key (one registered
    after this import too); a ValueError naming the known keys otherwise."""
    if key in Calibrator.registry:  # the live registry: a map defined since this import too
        return calibration(Calibrator.registry[key])
    if key not in REGISTRY and key in ELSEWHERE:
        importlib.import_module(ELSEWHERE[key])
    if key in REGISTRY:
        return REGISTRY[key]
    known = [*REGISTRY, *(k for k in Calibrator.registry if k not in REGISTRY), *ELSEWHERE]
    raise ValueError(f"method: unknown {key!r}; known: {known}")


def configure(key: str, site: Site, options: Mapping[str, Any] | None = None) -> Builder:
    """The method `key` with `options`, checked (TypeError / ValueError) but not fitted."""
    return entry(key)(site, dict(options or {}))


def check_all(methods: Iterable[tuple[str, str, Mapping[str, Any]]], site: Site) -> None:
    """Configure every `(name, key, options)` once, so that bad options fail before anything
    is fitted or trained: a ValueError naming `methods[i] (name)`."""
    for i, (name, key, options) in enumerate(methods):
        try:
            configure(key, site, options)
        except (TypeError, ValueError) as e:
            raise ValueError(f"methods[{i}] ({name}): {e}") from None


def build(key: str, site: Site, /, **options: Any) -> Any:
    """The fitted predictor of method `key` with `options`, built on `site`."""
    return configure(key, site, options).fit(site)


SCALES = (
    ("eta_", "eta"),
    ("sigma_", "sigma"),
    ("temperature_", "T"),
    ("prior_precision_", "prior_precision"),
)


def scales(fitted: Any) -> dict[str, float]:
    """The scale a fitted method chose, by its short name: PEG's η, PEP's σ, temperature T,
    Laplace's prior precision."""
    return {label: float(getattr(fitted, a)) for a, label in SCALES if hasattr(fitted, a)}


# ---------------------------------------------------------------- the base itself
@register("base")
class Base(Builder):
    """The site's base as it is (Single, SWA, SWAG, DeepEns-N: whatever the base is)."""

    def __init__(self, site: Site, options: Mapping[str, Any]) -> None:
        if options:
            raise ValueError(f"a base takes no options, got {dict(options)}")

    def fit(self, site: Site) -> Any:
        return site.need("base")()


# ---------------------------------------------------------------- post-hoc, on the base
class PostHoc(Builder):
    """`method(seed=, progress=, **options).fit(base, val)`."""

    method: ClassVar[type]
    seeded: ClassVar[bool] = True  # takes seed= and progress= (the site's, unless given)
    scored: ClassVar[bool] = False  # takes search= (its max_points by default the site's)
    single: ClassVar[bool] = False  # needs a single model as base, not an Ensemble

    def __init__(self, site: Site, options: Mapping[str, Any]) -> None:
        o = dict(options)
        if self.scored:
            o["search"] = scale_search(o.get("search", {}), site.score_points)
        if self.seeded:
            o = {"seed": site.seed, "progress": site.progress} | o
        self.unfitted = self.method(**o)

    def fit(self, site: Site) -> Any:
        return self.unfitted.fit(self.base(site), site.val)

    def base(self, site: Site) -> Any:
        """The site's base, checked to be a single model where the method needs one."""
        base = site.need("base")()
        if self.single and isinstance(base, Ensemble):
            raise ValueError(
                f"{self.key}: needs a single model as base, got an ensemble of {len(base)}"
            )
        return base


def scale_search(given: Any, score_points: int | None) -> ScaleSearch:
    """PEG/PEP's `search` option of a spec: a ScaleSearch, a search method's name or a mapping
    of ScaleSearch's options (`{holdout: 0}`), scoring at most the site's `score_points` unless
    it says otherwise."""
    if isinstance(given, ScaleSearch):
        return given
    options = {"method": given} if isinstance(given, str) else dict(given)
    return ScaleSearch(**{"max_points": score_points, **options})


# ---------------------------------------------------------------- the calibrators, post-hoc
class Calibration(PostHoc):
    """A registered calibrator (`Calibrator.registry`): `method(**options).fit(base, val)`."""

    seeded = False


@cache
def calibration(cls: type) -> type[Builder]:
    """The builder of calibrator `cls`, under its key (made once per class)."""
    return type(f"{cls.__name__}Builder", (Calibration,), {"method": cls, "key": cls.method})


for _cls in calibrators():  # under their keys, in the registry's listed order
    REGISTRY.add(_cls.method, calibration(_cls))


@register("peg")
class PEGBuilder(PostHoc):
    method = PEG
    scored = True


@register("pep")
class PEPBuilder(PostHoc):
    method = PEP
    scored = True


@register("mc-dropout")
class MCDropoutBuilder(PostHoc):
    method = MCDropout
    single = True


@register("random-subspace")
class RandomSubspaceBuilder(PostHoc):
    method = RandomSubspace
    single = True


@register("dropout-subspace")
class DropoutSubspaceBuilder(PostHoc):
    method = DropoutSubspace
    single = True


# ---------------------------------------------------------------- a model of their own
@register("packed")
class Packed(Builder):
    """Packed-Ensembles: the site's model built packed (`alpha`, `num_estimators`, `gamma`),
    trained with the site's recipe on its packed loss."""

    trains = True

    def __init__(self, site: Site, options: Mapping[str, Any]) -> None:
        self.packing = Packing(**options)  # checks alpha, num_estimators, gamma

    def fit(self, site: Site) -> Any:
        net = site.need("model")(packed=self.packing)
        return PackedEnsemble().fit(site.need("fit_model")(net, site.packed_loss))


class Patched(Builder):
    """Ensemble Model Patching: the site's model patched with `k` components (default 5) on
    `layers` (default: its BatchNorms, else its input and output layers), trained with the
    site's recipe on the site's loss plus `weight` (default 1 / training points) × the Eq. (6)
    regulariser (`shared`: also on the layers that are not patched), then `n_members` MC
    samples (default 20)."""

    trains = True
    mode: ClassVar[str]
    OPTIONS: ClassVar[tuple[str, ...]] = ("k", "n_members", "layers", "weight", "shared")

    def __init__(self, site: Site, options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; known: {', '.join(self.OPTIONS)}")
        self.options = dict(options)

    def fit(self, site: Site) -> Any:
        o = self.options
        net = site.need("model")()
        layers = o.get("layers", "bn" if has_batchnorm(net) else "input+output")
        patch(net, k=o.get("k", 5), mode=self.mode, layers=layers, seed=site.seed)
        weight = o["weight"] if "weight" in o else 1.0 / len(site.need("train")[0])
        loss = emp_loss(net, weight, shared=o.get("shared", False), base=site.loss)
        site.need("fit_model")(net, loss)
        return MCPatched(n_members=o.get("n_members", 20), seed=site.seed).fit(net)


@register("emp")
class EMP(Patched):
    mode = "emp"


@register("ecmp")
class ECMP(Patched):
    mode = "ecmp"


# ---------------------------------------------------------------- post-hoc, on the training data
@register("laplace")
class LaplaceBuilder(PostHoc):
    """`peg.Laplace` (laplace-torch; default: last-layer KFAC, marglik prior, GLM probit) around
    a single model. Its Hessian is taken over the site's training data when the site has them
    (`peg bench`), else over its validation data (`peg.compare`, which has no other);
    `prior_optimization="gridsearch"` searches the prior on the validation data. laplace-torch
    is imported when the method is configured, so a missing install fails before any training.
    """

    method = Laplace
    single = True

    def __init__(self, site: Site, options: Mapping[str, Any]) -> None:
        super().__init__(site, options)
        require_laplace()

    def fit(self, site: Site) -> Any:
        gridsearch = self.unfitted.prior_optimization == "gridsearch"
        val = site.need("val") if gridsearch or site.train is None else None
        return self.unfitted.fit(self.base(site), val, train_data=site.train)


@register("mc-dropout-trained")
class TrainedDropout(Builder):
    """MC dropout on a model trained with dropout: the site's model built with `dropout=p`,
    trained with the site's recipe on its loss, then `MCDropout(**options)` samples."""

    trains = True

    def __init__(self, site: Site, options: Mapping[str, Any]) -> None:
        o = dict(options)
        self.p = o.pop("p", 0.1)
        self.sampler = MCDropout(**({"seed": site.seed, "progress": site.progress} | o))

    def fit(self, site: Site) -> Any:
        net = site.need("model")(dropout=self.p)
        return self.sampler.fit(site.need("fit_model")(net, site.loss))


# ---------------------------------------------------------------- around a trajectory
@register("swag")
class SWAGBuilder(PostHoc):
    """SWAG (`diag=True`: SWAG-Diag) collected from the base on the site's training data with
    `recipe` (its SWA phase)."""

    method = SWAG

    def fit(self, site: Site) -> Any:
        return self.unfitted.fit(site.need("base")(), site.need("train"))


class IterateGaussian(PostHoc):
    """A Gaussian fitted to the site's `iterates` (one trajectory's last checkpoints)."""

    def fit(self, site: Site) -> Any:
        return self.unfitted.fit(site.need("iterates"), skeleton=site.skeleton)


@register("diagonal-gaussian")
class DiagonalGaussianBuilder(IterateGaussian):
    method = DiagonalGaussian


@register("low-rank-gaussian")
class LowRankGaussianBuilder(IterateGaussian):
    method = LowRankGaussian
