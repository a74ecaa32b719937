"""Archives of an ensemble built around a wrapper of the user's model, loaded with the model itself.

A chained base is a module wrapping the user's model: "TS → PEG" is PEG around `Scaled(model,
T)`, "Dirichlet → PEG" around `CalibratedModel(model, C, log_probs=...)`
(`peg.methods.calibration.composed`). Their archives hold the wrapper's state dict (the model's
entries prefixed `model.`, a map's beside them) but not what is no tensor (T, `log_probs`), so
the user's own model did not load them. Now the archive's meta records the wrapper
(`"wrapped": {"kind": ..., its arguments}`, `archived_meta`, when an ensemble is saved), and
`peg.load(path, model)` wraps the model it is given the same way (`around`). The wrappers
register here where they are defined (`WRAPPERS.add`), as the calibrators register with
`peg.loading`: nothing here knows a method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from peg._schema import Fields
from peg.errors import ArchiveError
from peg.utils.registry import Registry

KEY = "wrapped"  # the archive meta's record of the wrapper
# `wrap(model, record, shapes)`: `model` in the wrapper the record's fields describe (`shapes`:
# the archive's entry name → shape, which bounds any size the record implies)
Wrap = Callable[[nn.Module, Fields, Mapping[str, tuple[int, ...]]], nn.Module]
# class name → (the class, `wrap`): instances of the class are recorded in their archives
# (`cls.wrapper_record()`: a JSON object of what is no tensor) and loaded around a bare model
# through `wrap`; `WRAPPERS.add(cls.__name__, (cls, wrap))` where the class is defined
WRAPPERS: Registry[tuple[type[nn.Module], Wrap]] = Registry("wrapper")


def _record(module: nn.Module) -> dict[str, Any] | None:
    kind = type(module).__name__
    if WRAPPERS.get(kind, (None,))[0] is not type(module):
        return None
    return {"kind": kind, **module.wrapper_record()}  # type: ignore[operator]


def archived_meta(meta: Mapping[str, Any], skeleton: nn.Module) -> dict[str, Any]:
    """`meta` as an archive of an ensemble with `skeleton` stores it: with the wrapper's record
    under `KEY` when the skeleton is a registered wrapper."""
    record = _record(skeleton)
    return dict(meta) if record is None else {**meta, KEY: record}


def around(
    model: nn.Module, meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], where: str
) -> nn.Module:
    """`model` in the wrapper the archive's `meta` records; `model` itself where there is no
    record, or where `model` is that wrapper with the same record (the way these archives
    loaded before the record). Another wrapper's record is an ArchiveError naming `model`."""
    if meta.get(KEY) is None:
        return model
    fields = Fields(meta, where, "meta.").object(KEY)
    assert fields is not None
    kind = fields.text("kind")
    if kind not in WRAPPERS:
        raise fields.error("kind", f"one of {sorted(WRAPPERS)}", kind)
    cls, wrap = WRAPPERS[kind]
    if type(model) is not cls:
        return wrap(model, fields, shapes)
    if _record(model) != dict(fields.obj):
        raise ArchiveError(
            f"model: {where} was saved around {kind} {dict(fields.obj)}, the model given is "
            f"{_record(model)}; pass the bare model, peg.load wraps it as it was saved"
        )
    return model
