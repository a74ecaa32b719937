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
options (`{name: PEG-15, eta: [0.001, 0.01, 0.1, 1], eta_holdout: 0}`).

`train: {..., patience: P}` trains the bases until the validation loss rises: at most `epochs`,
stopping after P epochs without a lower validation NLL (on the spec's validation split) and
keeping the best epoch's weights (`peg.train.Recipe.patience`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from peg import data as datasets
from peg.apps import presets
from peg.apps.bench.names import denoted
from peg.apps.bench.tables import DEFAULT_METRICS, ROWS
from peg.apps.conformal import ConformalSpec, parse_conformal
from peg.data import corruptions
from peg.errors import SpecError
from peg.metrics.ood import OOD_SCORES
from peg.models import REGISTRY, check_arguments
from peg.train import Recipe

# the registry keys (`peg.apps.registry`) a spec's `method:` may name
METHODS = (
    "base",
    "temperature",
    "peg",
    "pep",
    "mc-dropout",
    "random-subspace",
    "dropout-subspace",
    "packed",
    "emp",
    "ecmp",
    "laplace",
    "vector-scaling",
    "matrix-scaling",
    "dirichlet",
    "histogram-binning",
    "isotonic",
)
SWAG_BASES = ("swa", "swag", "swag-diag")  # the bases one SWAG run gives
BASE_PATTERN = re.compile(r"^(single|swa|swag|swag-diag|deepens-(\d+))$")
SPEC_FIELDS = {
    "name",
    "data",
    "data_options",
    "model",
    "train",
    "swa",
    "seeds",
    "val_fraction",
    "train_points",
    "test_points",
    "score_points",
    "methods",
    "shift",
    "ood",
    "ood_score",
    "swag_samples",
    "metrics",
    "figures",
    "conformal",
}


@dataclass(frozen=True)
class MethodSpec:
    """One column: `method` built on `base` with `options`, shown as `name`."""

    name: str
    method: str
    base: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """A file-name-safe identifier of the column (names the cache file)."""
        return re.sub(r"[^A-Za-z0-9.+-]+", "_", self.name).strip("_")


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


def standard_method(name: str, options: dict[str, Any]) -> MethodSpec | None:
    """The method a table name denotes (`PEG-15 (DeepEns-3)`, `SWAG`, ...), or None."""
    found = denoted(name)
    if found is None:
        return None
    method, base, fixed = found
    return MethodSpec(name, method, base, {**fixed, **options})


def _method(entry: Any, where: str, earlier: list[str]) -> MethodSpec:
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise SpecError(f"{where}: expected a method name or a mapping with 'name', got {entry!r}")
    options = {k: v for k, v in entry.items() if k not in ("name", "method", "base")}
    if "method" not in entry:
        found = standard_method(entry["name"], options)
        if found is None:
            raise SpecError(
                f"{where}: unknown method name {entry['name']!r}; use a table name (Single, "
                "Temp-scaled, SWA, SWAG, SWAG-Diag, DeepEns-N, PEP-S, PEG-S, PEG-Unbiased, "
                "'PEG-S (DeepEns-N)', 'PEG-S (SWAG-Diag)', MC-Dropout-S, 'Packed-(a,M,g)', EMP, "
                "ECMP, 'PEG-S (ascent)', 'PEG-S (last layer)', 'PEG-S + TS', 'TS → PEG-S', "
                "Vector-scaled, Matrix-scaled, Dirichlet, Hist-binned, Isotonic) or give "
                "method: and base:"
            )
        if not BASE_PATTERN.match(found.base) and found.base not in earlier:
            raise SpecError(
                f"{where}: {found.name!r} is fitted on the column {found.base!r}; list "
                f"{found.base!r} before it"
            )
        return found
    method, base = entry["method"], entry.get("base", "single")
    if method not in METHODS:
        raise SpecError(f"{where}.method: unknown method {method!r}; known: {list(METHODS)}")
    if not isinstance(base, str) or not (BASE_PATTERN.match(base) or base in earlier):
        raise SpecError(
            f"{where}.base: unknown base {base!r}; known: single, swa, swag, swag-diag, "
            "deepens-N, or an earlier column's name"
        )
    return MethodSpec(entry["name"], method, base, options)


def root_base(methods: tuple[MethodSpec, ...], method: MethodSpec) -> str:
    """The base solution (`single`, `swa`, `deepens-N`, ...) under `method`, following bases
    that name earlier columns."""
    by_name = {m.name: m for m in methods}
    while method.base in by_name and not BASE_PATTERN.match(method.base):
        method = by_name[method.base]
    return method.base


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


def parse_spec(raw: Any, source: str = "spec") -> Spec:
    """A validated `Spec` from a parsed YAML mapping (errors name the field)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - SPEC_FIELDS)
    if unknown:
        raise SpecError(f"{source}: unknown field(s) {unknown}; known: {sorted(SPEC_FIELDS)}")
    for required in ("name", "data", "model", "train", "methods"):
        if required not in raw:
            raise SpecError(f"{source}.{required}: missing (required)")
    name = raw["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise SpecError(f"{source}.name: expected a file-name-safe string, got {name!r}")
    data = raw["data"]
    if data not in datasets.names():
        raise SpecError(f"{source}.data: unknown data set {data!r}; known: {datasets.names()}")
    data_options = raw.get("data_options") or {}
    if not isinstance(data_options, dict):
        raise SpecError(f"{source}.data_options: expected a mapping, got {data_options!r}")
    model = raw["model"]
    model = {"name": model} if isinstance(model, str) else model
    if not isinstance(model, dict) or model.get("name") not in REGISTRY:
        raise SpecError(f"{source}.model.name: unknown model {model!r}; known: {sorted(REGISTRY)}")
    try:
        check_arguments(model["name"], {k: v for k, v in model.items() if k != "name"})
    except TypeError as e:
        raise SpecError(f"{source}.model: {e}") from None
    parsed: list[MethodSpec] = []
    for i, m in enumerate(_list(raw["methods"], f"{source}.methods")):
        parsed.append(_method(m, f"{source}.methods[{i}]", [p.name for p in parsed]))
    methods = tuple(parsed)
    if not methods:
        raise SpecError(f"{source}.methods: expected at least one method")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise SpecError(f"{source}.methods: duplicate names {names}")
    swa = _recipe(raw["swa"], f"{source}.swa") if raw.get("swa") is not None else None
    spec_seeds = _list(raw.get("seeds", [0]), f"{source}.seeds")
    integers = all(isinstance(s, int) and not isinstance(s, bool) for s in spec_seeds)
    if not spec_seeds or not integers:
        raise SpecError(f"{source}.seeds: expected a non-empty list of integers, got {spec_seeds}")
    val_fraction = raw.get("val_fraction", 0.2)
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise SpecError(f"{source}.val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    shift = raw.get("shift") or {}
    if not isinstance(shift, dict) or set(shift) - {"rotations", "corruptions", "severities"}:
        raise SpecError(
            f"{source}.shift: expected a mapping with rotations, corruptions, severities; "
            f"got {shift!r}"
        )
    rotations = _list(shift.get("rotations"), f"{source}.shift.rotations")
    if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in rotations):
        raise SpecError(f"{source}.shift.rotations: expected angles in degrees, got {rotations}")
    corrupt = _list(shift.get("corruptions"), f"{source}.shift.corruptions")
    bad = [c for c in corrupt if c not in corruptions.CORRUPTIONS]
    if bad:
        raise SpecError(
            f"{source}.shift.corruptions: unknown {bad}; known: {list(corruptions.CORRUPTIONS)}"
        )
    severities = _list(shift.get("severities", [3]), f"{source}.shift.severities")
    if not all(s in (1, 2, 3, 4, 5) for s in severities):
        raise SpecError(f"{source}.shift.severities: expected values in 1..5, got {severities}")
    ood = _list(raw.get("ood"), f"{source}.ood")
    bad = [o for o in ood if o not in datasets.names()]
    if bad:
        raise SpecError(f"{source}.ood: unknown data set(s) {bad}; known: {datasets.names()}")
    ood_score = raw.get("ood_score", "entropy")
    if ood_score not in OOD_SCORES:
        raise SpecError(
            f"{source}.ood_score: expected one of {list(OOD_SCORES)}, got {ood_score!r}"
        )
    spec_metrics = _list(raw.get("metrics", list(DEFAULT_METRICS)), f"{source}.metrics")
    known = [row[0] for row in ROWS]
    bad = [m for m in spec_metrics if m not in known]
    if bad or not spec_metrics or len(set(spec_metrics)) != len(spec_metrics):
        problem = f"unknown {bad}" if bad else f"expected distinct keys, got {spec_metrics}"
        raise SpecError(f"{source}.metrics: {problem}; known: {known}")
    figures = raw.get("figures")
    if figures is not None:
        figures = _list(figures, f"{source}.figures")
        bad = [f for f in figures if f not in names]
        if bad or not figures:
            raise SpecError(
                f"{source}.figures: expected a non-empty list of column names, unknown {bad}; "
                f"columns: {names}"
            )
    spec = Spec(
        name=name,
        data=data,
        model=dict(model),
        train=_recipe(raw["train"], f"{source}.train"),
        methods=methods,
        seeds=tuple(spec_seeds),
        swa=swa,
        val_fraction=float(val_fraction),
        train_points=_int_or_none(raw.get("train_points"), f"{source}.train_points"),
        test_points=_int_or_none(raw.get("test_points"), f"{source}.test_points"),
        score_points=_int_or_none(raw.get("score_points", 2000), f"{source}.score_points"),
        rotations=tuple(float(r) for r in rotations),
        corruptions=tuple(corrupt),
        severities=tuple(severities),
        ood=tuple(ood),
        ood_score=ood_score,
        swag_samples=_int_or_none(raw.get("swag_samples", 15), f"{source}.swag_samples") or 15,
        data_options=dict(data_options),
        metrics=tuple(spec_metrics),
        figures=None if figures is None else tuple(figures),
        conformal=parse_conformal(raw.get("conformal"), f"{source}.conformal", names),
    )
    if spec.needs_swag and spec.swa is None:
        users = [m.name for m in methods if m.base in SWAG_BASES]
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
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError:
        return None  # load_specs reports it
    if not (isinstance(raw, dict) and "uci" in raw):
        return None
    options = raw["uci"] or {}
    known = {"sets", "splits", "methods", "epochs"}
    if not isinstance(options, dict) or set(options) - known:
        raise SpecError(f"{path}.uci: expected a mapping with keys among {sorted(known)}")
    return options


def load_specs(path: str | Path) -> list[Spec]:
    """The benchmark(s) in a YAML file (`yaml.safe_load`: plain data only)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spec: no file at {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML ({e})") from None
    if isinstance(raw, dict) and "benchmarks" in raw:
        entries = _list(raw["benchmarks"], f"{path}.benchmarks")
        return [parse_spec(b, f"{path}.benchmarks[{i}]") for i, b in enumerate(entries)]
    return [parse_spec(raw, str(path))]
