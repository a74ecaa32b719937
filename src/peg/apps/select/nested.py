"""`AutoSelect`'s refit of a choice and its nested cross-validation: the honest estimate of
the whole selection's score (`nested=True`: `nested_`), since the chosen candidate's CV score
is biased by having won on those folds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from peg.apps.select.cross import CrossFit
from peg.apps.select.folds import mean_se, stratified_folds
from peg.apps.select.report import choose


def refit(cross: CrossFit, specs: list[Any], name: str, idx: Tensor) -> dict[str, Any]:
    """Candidate `name` and its bases fitted on the points `idx` (name → predictor)."""
    by_name = {s.name: s for s in specs}
    chain = [by_name[name]]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    fitted: dict[str, Any] = {}
    for spec in chain:
        fitted[spec.name] = cross.fit(spec, idx, fitted)[0]
    return fitted


def nested_score(
    cross: CrossFit,
    specs: list[Any],
    skipped: dict[str, str],
    select: Callable[[list[Tensor]], CrossFit],
    *,
    cv: int,
    seed: int,
    one_se: bool,
) -> dict[str, Any]:
    """The whole selection scored by nested CV: per outer fold, select on the rest (`select`
    cross-fits the candidates on inner folds of it, as the selection itself did), refit the
    choice there, score it on the outer fold. `{"mean", "se", "chosen"}`."""
    y = cross.y
    outer = stratified_folds(y, cv, seed + 1)
    points = torch.full((len(y),), float("nan"), dtype=torch.float64)
    by_name = {s.name: s for s in specs}
    chosen: list[str] = []
    for o, held in enumerate(outer):
        rest = torch.cat([outer[j] for j in range(len(outer)) if j != o]).sort().values
        sub = select([rest[f] for f in stratified_folds(y[rest], cv, seed)])
        name = choose(sub, specs, rest, one_se, skipped)[1]
        points[held] = sub.score(by_name[name], refit(sub, specs, name, rest)[name], held)
        chosen.append(name)
    mean, se = mean_se(points)
    return {"mean": mean, "se": se, "chosen": chosen}
