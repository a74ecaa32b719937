"""The methods `peg.compare` fits: named `MethodSpec`s (the bench's: a registry key, options and
a base), where the base is "model" (the user's model) or the name of an earlier method, whose
fitted predictor the method is then fitted on ("PEG + TS": temperature scaling of the PEG
ensemble; "TS → PEG": PEG around the temperature-scaled model).

Named methods (`CATALOGUE`), written as strings; `method(name, key, on=..., **options)` defines
any other (e.g. `method("PEG-30", "peg", n_members=30)`)::

    Model           the model as it is (the reference row)
    TS              temperature scaling                     temperature
    PEP             PEP, σ searched                         pep
    PEG             PEG, η searched                         peg
    PEG + TS        temperature scaling of PEG's ensemble   temperature on PEG
    MC dropout      15 dropout samples (model with dropout) mc-dropout
    Last-layer PEG  PEG on the last layer only              peg, params="last_layer"
    PEG (ascent)    PEG, θ + η∇L (Algorithm 1 literally)     peg, direction="ascent"
    TS → PEG        PEG around the temperature-scaled model peg on TS
    Laplace         last-layer KFAC Laplace, marglik prior, laplace (laplace-torch,
                    GLM probit predictive                   the `laplace` extra)
    Vector scaling  Guo et al.'s vector scaling             vector-scaling
    Matrix scaling  Guo et al.'s matrix scaling             matrix-scaling
    Dirichlet       Dirichlet calibration (ODIR)            dirichlet
    Hist. binning   histogram binning, one-vs-rest          histogram-binning
    Isotonic        isotonic regression, one-vs-rest        isotonic
    Spline          spline calibration, top label (Gupta)   spline
    Ensemble TS     TS, uncalibrated and uniform mixed      ensemble-temperature
    Order-preserving one monotone map of every logit (DIAG) order-preserving
    PEG (kfac)      PEG, K-FAC-preconditioned steps         peg, precondition="kfac"
    PEG (diag)      PEG, diagonal-Fisher-preconditioned     peg, precondition="diag"
    Last-layer PEG (kfac)   the same on the last layer      peg, params="last_layer", ...
    Last-layer PEG + TS     TS of last-layer PEG            temperature on Last-layer PEG
    PEG → Matrix scaling    matrix scaling of PEG           matrix-scaling on PEG
    PEG → Dirichlet         Dirichlet calibration of PEG    dirichlet on PEG
    PEG → Vector scaling    vector scaling of PEG           vector-scaling on PEG
    Dirichlet → PEG PEG around the model with its Dirichlet peg on Dirichlet
                    map as last layer (`peg.methods.calibration.composed`)
    Matrix scaling → PEG    the same with matrix scaling    peg on Matrix scaling
    Dirichlet → last-layer PEG  PEG of the Dirichlet map    peg on Dirichlet, params=
                    alone                                   "last_layer"

Laplace and the calibrators after it are not in the default list: name them in `methods=`.
For a model without parameters (saved logits: `compare(logits, labels, test)` or
`nn.Identity()`) the defaults are "Model" and the maps of logits (`LOGIT_METHODS`, as
`AutoSelect`'s candidates there), and a method that changes or samples weights is left out
(`skipped`), never a failed row.
Laplace is fitted on the validation data here (compare has no training data); the defaults do
not depend on what is installed, and laplace-torch is optional.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from peg.apps import registry
from peg.apps.bench.spec import MethodSpec
from peg.apps.chain import AS_IS, Scaled, as_base
from peg.apps.compare.faults import NO_WEIGHTS, precheck
from peg.methods._predictors import stateless
from peg.methods.dropout import dropout_modules

MODEL = "model"  # the base of a method fitted on the user's model itself

CATALOGUE: dict[str, MethodSpec] = {
    m.name: m
    for m in (
        MethodSpec("Model", "base", MODEL),
        MethodSpec("TS", "temperature", MODEL),
        MethodSpec("PEP", "pep", MODEL),
        MethodSpec("PEG", "peg", MODEL),
        MethodSpec("PEG + TS", "temperature", "PEG"),
        MethodSpec("MC dropout", "mc-dropout", MODEL),
        MethodSpec("Last-layer PEG", "peg", MODEL, {"params": "last_layer"}),
        MethodSpec("PEG (ascent)", "peg", MODEL, {"direction": "ascent"}),
        MethodSpec("TS → PEG", "peg", "TS"),
        MethodSpec("Laplace", "laplace", MODEL),
        MethodSpec("Vector scaling", "vector-scaling", MODEL),
        MethodSpec("Matrix scaling", "matrix-scaling", MODEL),
        MethodSpec("Dirichlet", "dirichlet", MODEL),
        MethodSpec("Hist. binning", "histogram-binning", MODEL),
        MethodSpec("Isotonic", "isotonic", MODEL),
        MethodSpec("Spline", "spline", MODEL),
        MethodSpec("Ensemble TS", "ensemble-temperature", MODEL),
        MethodSpec("Order-preserving", "order-preserving", MODEL),
        MethodSpec("PEG (kfac)", "peg", MODEL, {"precondition": "kfac"}),
        MethodSpec("PEG (diag)", "peg", MODEL, {"precondition": "diag"}),
        MethodSpec(
            "Last-layer PEG (kfac)", "peg", MODEL, {"params": "last_layer", "precondition": "kfac"}
        ),
        MethodSpec("Last-layer PEG + TS", "temperature", "Last-layer PEG"),
        MethodSpec("PEG → Matrix scaling", "matrix-scaling", "PEG"),
        MethodSpec("PEG → Dirichlet", "dirichlet", "PEG"),
        MethodSpec("PEG → Vector scaling", "vector-scaling", "PEG"),
        MethodSpec("Dirichlet → PEG", "peg", "Dirichlet"),
        MethodSpec("Matrix scaling → PEG", "peg", "Matrix scaling"),
        MethodSpec("Dirichlet → last-layer PEG", "peg", "Dirichlet", {"params": "last_layer"}),
    )
}
# the default list (the issue's): MC dropout only where the model has dropout
DEFAULTS = ("Model", "TS", "PEP", "PEG", "PEG + TS", "MC dropout", "Last-layer PEG")
# the maps of logits: the defaults (after "Model") for a model without parameters (saved
# logits through `nn.Identity()`), compare's and `AutoSelect`'s
LOGIT_METHODS = (
    "TS",
    "Vector scaling",
    "Matrix scaling",
    "Dirichlet",
    "Ensemble TS",
    "Order-preserving",
)
__all__ = [
    "AS_IS",
    "CATALOGUE",
    "DEFAULTS",
    "LOGIT_METHODS",
    "MODEL",
    "Scaled",
    "as_base",
    "has_dropout",
    "method",
    "options",
    "resolve",
]


def method(name: str, key: str, *, on: str = MODEL, **options: Any) -> MethodSpec:
    """A method for `peg.compare(methods=[...])`: registry `key` (`peg.apps.registry`: "peg",
    "pep", "temperature", "mc-dropout", ...) with `options`, fitted on `on` ("model" or the
    name of an earlier method), shown as `name`."""
    return MethodSpec(name, key, on, dict(options))


def _normal(name: str) -> str:
    """A method name as typed on a command line: any case, `->` for `→`, any spacing."""
    return " ".join(name.replace("->", "→").lower().split())


_BY_NORMAL = {_normal(name): name for name in CATALOGUE}


def typed_names() -> str:
    """The named methods as a command line takes them (quoted where they hold spaces)."""
    return ", ".join(f"'{n}'" if " " in n else n for n in CATALOGUE)


def _spec(entry: Any, where: str) -> MethodSpec:
    if isinstance(entry, MethodSpec):
        return entry
    if isinstance(entry, str):
        name = _BY_NORMAL.get(_normal(entry))
        if name is None:
            raise ValueError(
                f"{where}: unknown method {entry!r}; named methods: {list(CATALOGUE)} (any "
                "case, '->' for '→'; in Python also peg.apps.compare.method(name, key, on=..., "
                "**options))"
            )
        return CATALOGUE[name]
    if isinstance(entry, Mapping) and isinstance(entry.get("name"), str) and "method" in entry:
        options = {k: v for k, v in entry.items() if k not in ("name", "method", "on")}
        return method(entry["name"], entry["method"], on=entry.get("on", MODEL), **options)
    raise TypeError(
        f"{where}: expected a method name, a peg.apps.compare.method(...) or a mapping with "
        f"'name' and 'method' (and 'on', options), got {entry!r}"
    )


def has_dropout(model: nn.Module) -> bool:
    return bool(dropout_modules(model))


def resolve(
    methods: Sequence[Any] | None, model: nn.Module
) -> tuple[list[MethodSpec], dict[str, str]]:
    """The methods to fit, in order (a named method's base put before it when not listed), and
    the defaults left out with the reason; errors name `methods[i]`."""
    skipped: dict[str, str] = {}
    if methods is None and stateless(model):  # saved logits: the maps of logits
        entries: list[Any] = ["Model", *LOGIT_METHODS]
        skipped |= {name: NO_WEIGHTS for name in DEFAULTS if name not in entries}
    elif methods is None:
        entries = list(DEFAULTS)
        if not has_dropout(model):
            entries.remove("MC dropout")
            skipped["MC dropout"] = "the model has no dropout layer"
    elif isinstance(methods, (str, Mapping)) or not isinstance(methods, Sequence):
        raise TypeError(f"methods: expected a list of methods, got {methods!r}")
    else:
        entries = list(methods)
    if not entries:
        raise ValueError("methods: expected at least one method")
    out: list[MethodSpec] = []
    for i, entry in enumerate(entries):
        spec = _spec(entry, f"methods[{i}]")
        where = f"methods[{i}] ({spec.name})"
        names = [m.name for m in out]
        if spec.name in names:
            raise ValueError(f"{where}: listed twice (or as the base of an earlier method)")
        if spec.base != MODEL and spec.base not in names:
            if spec.base not in CATALOGUE or CATALOGUE[spec.base].base != MODEL:
                raise ValueError(
                    f"{where}: on={spec.base!r} is neither 'model' nor an earlier method"
                )
            out.append(CATALOGUE[spec.base])  # a named base, fitted first and shown
        builder = registry.entry(spec.method)
        if builder.trains or not issubclass(builder, (registry.PostHoc, registry.Base)):
            raise ValueError(
                f"{where}: {spec.method!r} is not a post-hoc method (compare fits methods on "
                "the model it is given, it trains none)"
            )
        out.append(spec)
    return _applicable(out, skipped, model)


def _applicable(
    specs: list[MethodSpec], skipped: dict[str, str], model: nn.Module
) -> tuple[list[MethodSpec], dict[str, str]]:
    """The methods that can apply to `model` (`faults.precheck`, no fitting), the others (and
    those fitted on them) added to `skipped`; a ValueError when none is left."""
    kept: list[MethodSpec] = []
    for spec in specs:
        reason = precheck(spec, model)
        if reason is None and spec.base in skipped:
            reason = f"its base, {spec.base}, is left out"
        if reason is None:
            kept.append(spec)
        else:
            skipped[spec.name] = reason
    if not kept:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise ValueError(f"methods: every method is left out ({reasons})")
    return kept, skipped


def options(spec: MethodSpec, batch_size: int, batch_fn: Any) -> dict[str, Any]:
    """The spec's options, with compare's `batch_size` and `batch_fn` for the methods that take
    them (the spec's own win)."""
    builder = registry.entry(spec.method)
    if not issubclass(builder, registry.PostHoc):
        return dict(spec.options)
    accepted = builder.method._param_names()
    shared = {"batch_size": batch_size, "batch_fn": batch_fn}
    return {k: v for k, v in shared.items() if k in accepted and v is not None} | spec.options
