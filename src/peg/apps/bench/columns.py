"""The columns of a benchmark spec: `MethodSpec` (a method of the registry on a base, with
options, shown under a name), how a spec's `methods:` entry becomes one, and the base solution
under a column (see `peg.apps.bench.spec` for the file format)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from peg.apps.bench.names import denoted
from peg.apps.registry import ELSEWHERE
from peg.errors import SpecError
from peg.methods.calibration._calibrator import calibrators, table_name

# the registry keys (`peg.apps.registry`) a spec's `method:` may name besides the calibrators'
NETWORK_METHODS = (
    "peg",
    "pep",
    "mc-dropout",
    "random-subspace",
    "dropout-subspace",
    "packed",
    "emp",
    "ecmp",
    "laplace",
)


def methods() -> tuple[str, ...]:
    """The registry keys a spec's `method:` may name: the base, every registered calibrator
    (`Calibrator.registry`, in its listed order), `NETWORK_METHODS`."""
    return ("base", *(c.method for c in calibrators()), *NETWORK_METHODS)


METHODS = methods()  # at import (`methods()` again for a calibrator registered since)
SWAG_BASES = ("swa", "swag", "swag-diag")  # the bases one SWAG run gives
BASE_PATTERN = re.compile(r"^(single|swa|swag|swag-diag|deepens-(\d+))$")


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


def standard_method(name: str, options: dict[str, Any]) -> MethodSpec | None:
    """The method a table name denotes (`PEG-15 (DeepEns-3)`, `SWAG`, ...), or None."""
    found = denoted(name)
    if found is None:
        return None
    method, base, fixed = found
    return MethodSpec(name, method, base, {**fixed, **options})


def method_column(entry: Any, where: str, earlier: list[str]) -> MethodSpec:
    """The column a spec's `methods:` entry at `where` defines (`earlier`: the names of the
    columns before it, which it may be fitted on)."""
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
                "SWA, SWAG, SWAG-Diag, DeepEns-N, PEP-S, PEG-S, PEG-Unbiased, "
                "'PEG-S (DeepEns-N)', 'PEG-S (SWAG-Diag)', MC-Dropout-S, 'Packed-(a,M,g)', EMP, "
                "ECMP, 'PEG-S (ascent)', 'PEG-S (last layer)', 'PEG-S + TS', 'TS → PEG-S', "
                f"{', '.join(map(table_name, calibrators()))}) or give method: and base:"
            )
        if not BASE_PATTERN.match(found.base) and found.base not in earlier:
            raise SpecError(
                f"{where}: {found.name!r} is fitted on the column {found.base!r}; list "
                f"{found.base!r} before it"
            )
        return found
    method, base = entry["method"], entry.get("base", "single")
    known = (*methods(), *ELSEWHERE)  # ELSEWHERE: "auto-select", registered when named
    if method not in known:
        raise SpecError(f"{where}.method: unknown method {method!r}; known: {list(known)}")
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
