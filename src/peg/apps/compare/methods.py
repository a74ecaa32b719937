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
`nn.Identity()`) the defaults are "Model" and the maps of logits (`logit_methods()`, as
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
from peg.methods.calibration._calibrator import calibrators
from peg.methods.calibration.scaling import DirichletCalibration, MatrixScaling, VectorScaling
from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.dropout import dropout_modules

MODEL = "model"  # the base of a method fitted on the user's model itself

# the maps the chains are made of, by their display names
_TS, _VS = TemperatureScaling.name, VectorScaling.name
_MS, _DC = MatrixScaling.name, DirichletCalibration.name


def catalogue() -> dict[str, MethodSpec]:
    """The named methods (`CATALOGUE` at import; read again, a map registered since is in it):
    the model, the network methods and their chains, and every registered map on the model
    (`Calibrator.registry`, in its listed order; temperature scaling's right after "Model")."""
    maps = [MethodSpec(c.name, c.method, MODEL) for c in calibrators()]
    ts = next(m for m in maps if m.name == _TS)
    return {
        m.name: m
        for m in (
            MethodSpec("Model", "base", MODEL),
            ts,
            MethodSpec("PEP", "pep", MODEL),
            MethodSpec("PEG", "peg", MODEL),
            MethodSpec(f"PEG + {_TS}", ts.method, "PEG"),
            MethodSpec("MC dropout", "mc-dropout", MODEL),
            MethodSpec("Last-layer PEG", "peg", MODEL, {"params": "last_layer"}),
            MethodSpec("PEG (ascent)", "peg", MODEL, {"direction": "ascent"}),
            MethodSpec(f"{_TS} → PEG", "peg", _TS),
            MethodSpec("Laplace", "laplace", MODEL),
            *(m for m in maps if m is not ts),
            MethodSpec("PEG (kfac)", "peg", MODEL, {"precondition": "kfac"}),
            MethodSpec("PEG (diag)", "peg", MODEL, {"precondition": "diag"}),
            MethodSpec(
                "Last-layer PEG (kfac)",
                "peg",
                MODEL,
                {"params": "last_layer", "precondition": "kfac"},
            ),
            MethodSpec(f"Last-layer PEG + {_TS}", ts.method, "Last-layer PEG"),
            MethodSpec(f"PEG → {_MS}", MatrixScaling.method, "PEG"),
            MethodSpec(f"PEG → {_DC}", DirichletCalibration.method, "PEG"),
            MethodSpec(f"PEG → {_VS}", VectorScaling.method, "PEG"),
            MethodSpec(f"{_DC} → PEG", "peg", _DC),
            MethodSpec(f"{_MS} → PEG", "peg", _MS),
            MethodSpec(f"{_DC} → last-layer PEG", "peg", _DC, {"params": "last_layer"}),
        )
    }


def logit_methods() -> tuple[str, ...]:
    """The maps of logits compare and `AutoSelect` fit by default on a model without
    parameters (saved logits through `nn.Identity()`): those declaring `on_logits_default`,
    in the registry's listed order."""
    return tuple(c.name for c in calibrators() if c.on_logits_default)


CATALOGUE: dict[str, MethodSpec] = catalogue()
# the default list (the issue's): MC dropout only where the model has dropout
DEFAULTS = ("Model", _TS, "PEP", "PEG", f"PEG + {_TS}", "MC dropout", "Last-layer PEG")


def __getattr__(name: str) -> tuple[str, ...]:
    # `LOGIT_METHODS`, read when asked: a map registered after this import is in it
    if name == "LOGIT_METHODS":
        return logit_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AS_IS",
    "CATALOGUE",
    "DEFAULTS",
    "MODEL",
    "Scaled",
    "as_base",
    "catalogue",
    "has_dropout",
    "logit_methods",
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


def typed_names() -> str:
    """The named methods as a command line takes them (quoted where they hold spaces)."""
    return ", ".join(f"'{n}'" if " " in n else n for n in catalogue())


def _spec(entry: Any, where: str) -> MethodSpec:
    if isinstance(entry, MethodSpec):
        return entry
    if isinstance(entry, str):
        named = catalogue()
        name = {_normal(n): n for n in named}.get(_normal(entry))
        if name is None:
            raise ValueError(
                f"{where}: unknown method {entry!r}; named methods: {list(named)} (any "
                "case, '->' for '→'; in Python also peg.apps.compare.method(name, key, on=..., "
                "**options))"
            )
        return named[name]
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
        entries: list[Any] = ["Model", *logit_methods()]
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
    named = catalogue()
    for i, entry in enumerate(entries):
        spec = _spec(entry, f"methods[{i}]")
        where = f"methods[{i}] ({spec.name})"
        names = [m.name for m in out]
        if spec.name in names:
            raise ValueError(f"{where}: listed twice (or as the base of an earlier method)")
        if spec.base != MODEL and spec.base not in names:
            if spec.base not in named or named[spec.base].base != MODEL:
                raise ValueError(
                    f"{where}: on={spec.base!r} is neither 'model' nor an earlier method"
                )
            out.append(named[spec.base])  # a named base, fitted first and shown
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
