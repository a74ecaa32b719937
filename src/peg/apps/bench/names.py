"""The papers' table names of methods and the method each denotes: a registry key
(`peg.apps.registry`), the base it is built on (a base solution such as `single` or
`deepens-3`, or an earlier column's name) and its options (`denoted`).

Methods are written by their names in the papers' tables, which say what they are:
`Single`, `Temp-scaled`, `SWA`, `SWAG`, `SWAG-Diag`, `DeepEns-N`, `PEP-S`, `PEG-S`,
`PEG-Unbiased` (S=30 as in Table 12), `PEG-S (DeepEns-N)` (S/N per member, Algorithm 2),
`PEG-S (SWAG-Diag)` (S=1 on each of S samples), `MC-Dropout-S`, `Packed-(α,M,γ)` (a packed
model trained with the same recipe), `EMP` and `ECMP` (the model patched with K = 5 components,
trained with the same recipe plus the Eq. (6) regulariser, 20 MC samples). Any other method:
`method:` and `base:` in the spec (`peg.apps.bench.spec`).

Variants of PEG by name: `PEG-S (ascent)` (`direction: ascent`), `PEG-S (last layer)`
(`params: last_layer`), `PEG-S + TS` (temperature scaling fitted on the column `PEG-S`'s
averaged prediction, which must come earlier) and `TS → PEG-S` (or `TS -> PEG-S`: PEG-S around
the temperature-scaled model, on the column `Temp-scaled`, which must come earlier).

`Laplace`: laplace-torch's Laplace approximation of the single model (`peg.Laplace`): last-layer
KFAC over the training split, prior precision by marginal likelihood, GLM probit predictive;
`Laplace-MC-S`: the same with S Monte Carlo samples of the GLM predictive as members.
Each registered calibrator of the single model by its table name (`table_name`, declared in its
class): `Temp-scaled`, `Vector-scaled`,
`Matrix-scaled` (Guo et al. 2017), `Dirichlet` (Kull et al. 2019, ODIR), `Hist-binned` and
`Isotonic` (Zadrozny & Elkan 2001, 2002), `Spline` (Gupta et al. 2021), `Ensemble-TS` (Zhang
et al. 2020) and `Order-preserving` (Rahimi et al. 2020); on an earlier column with `method:`
and `base:` (`{name: "PEG-15 + Dirichlet", method: dirichlet, base: PEG-15}`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from peg.errors import SpecError
from peg.methods.calibration._calibrator import calibrators, table_name
from peg.methods.calibration.temperature import TemperatureScaling as _TS


def _split_members(m: re.Match[str]) -> tuple[str, str, dict[str, Any]]:
    """`PEG-S (DeepEns-N)`: S/N members around each of the N members (Algorithm 2)."""
    total, members = int(m[2]), int(m[3])
    if total % members:
        raise SpecError(f"methods: {m[0]!r}: {total} members do not split over {members}")
    return m[1].lower(), f"deepens-{members}", {"n_members": total // members}


def _peg(m: re.Match[str], **options: Any) -> dict[str, Any]:
    return {"n_members": int(m[1]), **options}


# The papers' table names: pattern -> (registry key, base, options) of the method it denotes.
TABLE_NAMES: tuple[tuple[str, Callable[[re.Match[str]], tuple[str, str, dict[str, Any]]]], ...] = (
    ("Single", lambda m: ("base", "single", {})),
    ("SWA", lambda m: ("base", "swa", {})),
    ("SWAG", lambda m: ("base", "swag", {})),
    ("SWAG-Diag", lambda m: ("base", "swag-diag", {})),
    ("PEG-Unbiased", lambda m: ("peg", "swa", {"n_members": 30, "variant": "unbiased"})),
    (r"PEG-(\d+) \(ascent\)", lambda m: ("peg", "single", _peg(m, direction="ascent"))),
    (r"PEG-(\d+) \(last layer\)", lambda m: ("peg", "single", _peg(m, params="last_layer"))),
    (r"PEG-(\d+) \+ TS", lambda m: (_TS.method, f"PEG-{m[1]}", {})),
    (r"TS (?:→|->) PEG-(\d+)", lambda m: ("peg", table_name(_TS), _peg(m))),
    (r"DeepEns-(\d+)", lambda m: ("base", f"deepens-{m[1]}", {})),
    (r"(PEG|PEP)-(\d+)", lambda m: (m[1].lower(), "single", {"n_members": int(m[2])})),
    (r"(PEG|PEP)-(\d+) \(DeepEns-(\d+)\)", _split_members),
    (r"(PEG|PEP)-(\d+) \(SWAG-Diag\)", lambda m: (m[1].lower(), "swag-diag", {"n_members": 1})),
    (
        r"Packed-\(([\d.]+),\s*(\d+),\s*(\d+)\)",
        lambda m: (
            "packed",
            "single",
            {"alpha": float(m[1]), "num_estimators": int(m[2]), "gamma": int(m[3])},
        ),
    ),
    ("EMP|ECMP", lambda m: (m[0].lower(), "single", {})),
    (r"MC-Dropout-(\d+)", lambda m: ("mc-dropout", "single", {"n_members": int(m[1])})),
    ("Laplace", lambda m: ("laplace", "single", {})),
    (
        r"Laplace-MC-(\d+)",
        lambda m: ("laplace", "single", {"link_approx": "mc", "n_members": int(m[1])}),
    ),
)


def denoted(name: str) -> tuple[str, str, dict[str, Any]] | None:
    """(registry key, base, options) of the method a table name denotes, or None: a
    calibrator's table name (`table_name`: each registered map of the single model) or one of
    `TABLE_NAMES`."""
    for cls in calibrators():
        if name == table_name(cls):
            return cls.method, "single", {}
    for pattern, meaning in TABLE_NAMES:
        if m := re.fullmatch(pattern, name):
            return meaning(m)
    return None
