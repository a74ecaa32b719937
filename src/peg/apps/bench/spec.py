"""Benchmark specs: YAML files naming data, model, recipes, methods, evaluation sets and seeds.

A spec file holds one benchmark, or several under `benchmarks:` (the `quick` preset runs two).
Every field is checked before anything runs; an error names the field (`methods[3].base`) and
what was expected. Example::

    name: fashion-mnist
    data: fashion-mnist                                        # data_options: {n: 3000} for toys
    model: {name: small-cnn, width: 16}
    train: {epochs: 15, lr: 0.05, weight_decay: 5.0e-4}       # peg.train.Recipe fields
    swa: {epochs: 15, schedule: swa, swa_start: 8, swa_lr: 0.01}
    seeds: [0, 1, 2]
    train_points: 24000                                        # subsample (optional)
    methods: [Single, Temp-scaled, SWA, SWAG-Diag, SWAG, DeepEns-3, PEP-15, PEG-15,
              "PEG-15 (DeepEns-3)", "PEG-15 (SWAG-Diag)",
              {name: MC-Dropout-15, insert: 0.1}]
    shift: {rotations: [30, 60], corruptions: [gaussian_noise, contrast], severities: [3, 5]}
    ood: [mnist, notmnist]
    metrics: [nll, error, brier, ece, aurc]                    # table rows (optional)
    figures: [Single, Temp-scaled, PEG-15]                     # columns drawn (optional)
    conformal: {alpha: [0.1, 0.05], score: aps, columns: [Single, PEG-15]}   # (optional)

`metrics:` chooses the rows of the labelled sets' tables in results.md, by metric key (`ROWS`
of `peg.apps.bench.tables`: nll, error, brier, ece, mce, adaptive_ece, classwise_ece, aurc,
augrc; default nll, error, brier, ece); results.json holds every one of them whatever the
choice. `figures:` names the columns drawn in `reliability-test.png` and
`risk-coverage-test.png` (test set, first seed; default: every column).

`conformal:` adds coverage and set-size rows (conformal prediction calibrated on half the test
set, `peg.apps.conformal`) to the labelled sets' tables, for the chosen columns (default all).

Methods are written by their names in the papers' tables (`Single`, `PEG-15 (DeepEns-3)`,
`TS → PEG-15`, `Dirichlet`, `Laplace`, ...: `peg.apps.bench.names` lists them), or defined with
`method:` (a key of the method registry `peg.apps.registry`) and `base:` (`single`, `swa`,
`deepens-N`, `swag`, `swag-diag`, or the name of an earlier column: the method is then fitted
on that column's fitted predictor, `peg.apps.chain`, as `peg.compare` does); a mapping adds
options (`{name: PEG-15, eta: [0.001, 0.01, 0.1, 1], search: {holdout: 0}}`).

`train: {..., patience: P}` trains the bases until the validation loss rises: at most `epochs`,
stopping after P epochs without a lower validation NLL (on the spec's validation split) and
keeping the best epoch's weights (`peg.train.Recipe.patience`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from peg import data as datasets
from peg.apps import presets
from peg.apps._yaml import read_yaml
from peg.apps.bench.columns import (
    BASE_PATTERN,
    METHODS,
    SWAG_BASES,
    MethodSpec,
    method_column,
    root_base,
    standard_method,
)
from peg.apps.bench.tables import DEFAULT_METRICS, ROWS
from peg.apps.conformal import ConformalSpec, parse_conformal
from peg.data import corruptions
from peg.errors import SpecError
from peg.metrics.ood import OOD_SCORES
from peg.models import REGISTRY, check_arguments
from peg.train import Recipe

# re-exported: the bench modules take a spec's column types from here
__all__ = [
    "BASE_PATTERN",
    "METHODS",
    "SWAG_BASES",
    "MethodSpec",
    "Spec",
    "SpecError",
    "find_spec",
    "load_specs",
    "load_uci_spec",
    "parse_spec",
    "root_base",
    "standard_method",
]


@dataclass(frozen=True)
class Spec:
    """One benchmark (see the module docstring)."""

    name: str
    data: str
    model: dict[str, Any]
    train: Recipe
    methods: tuple[MethodSpec, ...]
    seeds: tuple[int, ...] = (0,)
    swa: Recipe | None = None
    val_fraction: float = 0.2
    train_points: int | None = None
    test_points: int | None = None
    score_points: int | None = 2000
    rotations: tuple[float, ...] = ()
    corruptions: tuple[str, ...] = ()
    severities: tuple[int, ...] = (3,)
    ood: tuple[str, ...] = ()
    ood_score: str = "entropy"
    swag_samples: int = 15
    data_options: dict[str, Any] = field(default_factory=dict)
    metrics: tuple[str, ...] = DEFAULT_METRICS
    figures: tuple[str, ...] | None = None  # columns drawn (None: all)
    conformal: ConformalSpec | None = None  # coverage / set-size rows (`peg.apps.conformal`)

    @property
    def deep_ensemble_size(self) -> int:
        """Members the deep ensemble base needs (at least 1: `single` is its first member)."""
        bases = [m.base for m in self.methods if m.base.startswith("deepens-")]
        return max([1] + [int(b.split("-")[1]) for b in bases])

    @property
    def needs_swag(self) -> bool:
        return any(m.base in SWAG_BASES for m in self.methods)

    def root(self, method: MethodSpec) -> str:
        """The base solution under `method` (`root_base`)."""
        return root_base(self.methods, method)


def _recipe(value: Any, where: str) -> Recipe:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping of peg.train.Recipe fields, got {value!r}")
    try:
        return Recipe().replace(**value)
    except (TypeError, ValueError) as e:
        raise SpecError(f"{where}.{e}") from None


def _int_or_none(value: Any, where: str, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError(f"{where}: expected a list, got {value!r}")
    return value


# ---------------------------------------------------------------- the fields of a spec file
# Each YAML field has one parser, `parse(value, where, parsed) -> {Spec field: value}` (`parsed`:
# the fields parsed before it, in this order); a field the file leaves out takes `Spec`'s
# default, declared there only. Adding a field: a `Spec` field and an entry here.
Parsed = dict[str, Any]


def _default(name: str) -> Any:
    """`Spec`'s default for its field `name`."""
    found = next(f for f in fields(Spec) if f.name == name)
    # every field has a default or a factory; dataclasses types the factory as possibly absent
    return found.default_factory() if found.default is MISSING else found.default  # type: ignore[misc]


def _name(value: Any, where: str, _: Parsed) -> Parsed:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", value):
        raise SpecError(f"{where}: expected a file-name-safe string, got {value!r}")
    return {"name": value}


def _data(value: Any, where: str, _: Parsed) -> Parsed:
    if value not in datasets.names():
        raise SpecError(f"{where}: unknown data set {value!r}; known: {datasets.names()}")
    return {"data": value}


def _data_options(value: Any, where: str, _: Parsed) -> Parsed:
    value = value or {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping, got {value!r}")
    return {"data_options": dict(value)}


def _model(value: Any, where: str, _: Parsed) -> Parsed:
    model = {"name": value} if isinstance(value, str) else value
    if not isinstance(model, dict) or model.get("name") not in REGISTRY:
        raise SpecError(f"{where}.name: unknown model {model!r}; known: {sorted(REGISTRY)}")
    try:
        check_arguments(model["name"], {k: v for k, v in model.items() if k != "name"})
    except TypeError as e:
        raise SpecError(f"{where}: {e}") from None
    return {"model": dict(model)}


def _methods(value: Any, where: str, _: Parsed) -> Parsed:
    parsed: list[MethodSpec] = []
    for i, m in enumerate(_list(value, where)):
        parsed.append(method_column(m, f"{where}[{i}]", [p.name for p in parsed]))
    if not parsed:
        raise SpecError(f"{where}: expected at least one method")
    names = [m.name for m in parsed]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: duplicate names {names}")
    return {"methods": tuple(parsed)}


def _swa(value: Any, where: str, _: Parsed) -> Parsed:
    return {"swa": None if value is None else _recipe(value, where)}


def _train(value: Any, where: str, _: Parsed) -> Parsed:
    return {"train": _recipe(value, where)}


def _seeds(value: Any, where: str, _: Parsed) -> Parsed:
    seeds = _list(value, where)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise SpecError(f"{where}: expected a non-empty list of integers, got {seeds}")
    return {"seeds": tuple(seeds)}


def _val_fraction(value: Any, where: str, _: Parsed) -> Parsed:
    if not isinstance(value, (int, float)) or not 0 < value < 1:
        raise SpecError(f"{where}: expected a number in (0, 1), got {value!r}")
    return {"val_fraction": float(value)}


def _shift(value: Any, where: str, _: Parsed) -> Parsed:
    shift = value or {}
    if not isinstance(shift, dict) or set(shift) - {"rotations", "corruptions", "severities"}:
        raise SpecError(
            f"{where}: expected a mapping with rotations, corruptions, severities; got {shift!r}"
        )
    rotations = _list(shift.get("rotations"), f"{where}.rotations")
    if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in rotations):
        raise SpecError(f"{where}.rotations: expected angles in degrees, got {rotations}")
    corrupt = _list(shift.get("corruptions"), f"{where}.corruptions")
    bad = [c for c in corrupt if c not in corruptions.CORRUPTIONS]
    if bad:
        raise SpecError(
            f"{where}.corruptions: unknown {bad}; known: {list(corruptions.CORRUPTIONS)}"
        )
    severities = _list(shift.get("severities", list(_default("severities"))), f"{where}.severities")
    if not all(s in corruptions.SEVERITIES for s in severities):
        raise SpecError(f"{where}.severities: expected values in 1..5, got {severities}")
    return {
        "rotations": tuple(float(r) for r in rotations),
        "corruptions": tuple(corrupt),
        "severities": tuple(severities),
    }


def _ood(value: Any, where: str, _: Parsed) -> Parsed:
    ood = _list(value, where)
    bad = [o for o in ood if o not in datasets.names()]
    if bad:
        raise SpecError(f"{where}: unknown data set(s) {bad}; known: {datasets.names()}")
    return {"ood": tuple(ood)}


def _ood_score(value: Any, where: str, _: Parsed) -> Parsed:
    if value not in OOD_SCORES:
        raise SpecError(f"{where}: expected one of {list(OOD_SCORES)}, got {value!r}")
    return {"ood_score": value}


def _metrics(value: Any, where: str, _: Parsed) -> Parsed:
    chosen = _list(value, where)
    known = [row[0] for row in ROWS]
    bad = [m for m in chosen if m not in known]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        problem = f"unknown {bad}" if bad else f"expected distinct keys, got {chosen}"
        raise SpecError(f"{where}: {problem}; known: {known}")
    return {"metrics": tuple(chosen)}


def _figures(value: Any, where: str, parsed: Parsed) -> Parsed:
    if value is None:
        return {"figures": None}
    figures = _list(value, where)
    names = [m.name for m in parsed["methods"]]
    bad = [f for f in figures if f not in names]
    if bad or not figures:
        raise SpecError(
            f"{where}: expected a non-empty list of column names, unknown {bad}; columns: {names}"
        )
    return {"figures": tuple(figures)}


def _conformal(value: Any, where: str, parsed: Parsed) -> Parsed:
    names = [m.name for m in parsed["methods"]]
    return {"conformal": parse_conformal(value, where, names)}


def _points(name: str) -> Callable[[Any, str, Parsed], Parsed]:
    """The parser of a count field (train_points, ...): an integer >= 1, or null for none."""
    return lambda value, where, _: {name: _int_or_none(value, where)}


def _swag_samples(value: Any, where: str, _: Parsed) -> Parsed:
    return {"swag_samples": _int_or_none(value, where) or _default("swag_samples")}


# in the order they are checked (figures and conformal after methods: they name its columns)
FIELDS: dict[str, Callable[[Any, str, Parsed], Parsed]] = {
    "name": _name,
    "data": _data,
    "data_options": _data_options,
    "model": _model,
    "methods": _methods,
    "swa": _swa,
    "seeds": _seeds,
    "val_fraction": _val_fraction,
    "shift": _shift,
    "ood": _ood,
    "ood_score": _ood_score,
    "metrics": _metrics,
    "figures": _figures,
    "conformal": _conformal,
    "train": _train,
    "train_points": _points("train_points"),
    "test_points": _points("test_points"),
    "score_points": _points("score_points"),
    "swag_samples": _swag_samples,
}
REQUIRED = ("name", "data", "model", "train", "methods")
SPEC_FIELDS = set(FIELDS)


def parse_spec(raw: Any, source: str = "spec") -> Spec:
    """A validated `Spec` from a parsed YAML mapping (errors name the field)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - SPEC_FIELDS)
    if unknown:
        raise SpecError(f"{source}: unknown field(s) {unknown}; known: {sorted(SPEC_FIELDS)}")
    for required in REQUIRED:
        if required not in raw:
            raise SpecError(f"{source}.{required}: missing (required)")
    parsed: Parsed = {}
    for key, parse in FIELDS.items():
        if key in raw:
            parsed |= parse(raw[key], f"{source}.{key}", parsed)
    spec = Spec(**parsed)
    if spec.needs_swag and spec.swa is None:
        users = [m.name for m in spec.methods if m.base in SWAG_BASES]
        raise SpecError(f"{source}.swa: methods {users} need an SWA recipe (swa: {{...}})")
    if spec.swa is not None and spec.swa.patience is not None:
        raise SpecError(f"{source}.swa.patience: SWA and SWAG runs do not stop early")
    if spec.swa is not None and (spec.swa.swa_start is None or spec.swa.swa_lr is None):
        raise SpecError(f"{source}.swa: needs swa_start and swa_lr (and schedule: swa)")
    return spec


def find_spec(name_or_path: str | Path) -> Path:
    """A spec file: the path itself, or a preset of the package (`peg.apps.presets`) by name."""
    return presets.find(name_or_path)


def load_uci_spec(path: str | Path) -> dict[str, Any] | None:
    """The options of a UCI regression spec (`uci: {sets, splits, methods, epochs}`), or None."""
    try:
        raw = read_yaml(path)
    except ValueError:
        return None  # load_specs reports it
    if not (isinstance(raw, dict) and "uci" in raw):
        return None
    options = raw["uci"] or {}
    known = {"sets", "splits", "methods", "epochs"}
    if not isinstance(options, dict) or set(options) - known:
        raise SpecError(f"{path}.uci: expected a mapping with keys among {sorted(known)}")
    return options


def load_specs(path: str | Path) -> list[Spec]:
    """The benchmark(s) in a YAML file (`peg.apps._yaml.read_yaml`: plain data only, no
    aliases)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spec: no file at {path}")
    raw = read_yaml(path, SpecError)  # no aliases (a 396-byte bomb); errors on one line
    if isinstance(raw, dict) and "benchmarks" in raw:
        entries = _list(raw["benchmarks"], f"{path}.benchmarks")
        return [parse_spec(b, f"{path}.benchmarks[{i}]") for i, b in enumerate(entries)]
    return [parse_spec(raw, str(path))]
