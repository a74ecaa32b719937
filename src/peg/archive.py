"""The archive file format (only the format: `peg.loading` turns an archive into an ensemble).

One safetensors file whose header carries a JSON description.

Nothing is unpickled: tensors are safetensors, everything else is JSON stored under the
header's metadata key ``"peg"``::

    {"format": "peg-ensemble", "format_version": 1, "peg_version": ..., "torch_version": ...,
     "members": M, "stacked": [names], "shared": [names], "meta": {method, hyper-parameters,
     seed, ...}}

Tensor keys are ``stacked/<state-dict name>`` (`[M, *shape]`) and ``shared/<name>``. A calibrated
archive (`meta["calibration"]`, e.g. matrix scaling's) may also hold the calibration map's arrays
as ``calibration/<name>``, listed under the header's ``"calibration"`` (absent when there are
none; readers that do not know the key load the ensemble as it is). Writes go to
a temporary file in the same folder, then `os.replace`, so a crash never leaves half an archive
where a good one was.

`with_meta(entries)` is the one way for an application to store its own record with a
predictor's archive: inside the block, `write` adds `entries` to the meta of what it writes, so
the predictor's own `save` (whatever its kind: ensemble, recipe, calibrator) writes the archive
once, record included (`AutoSelect.save`'s report).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from peg._io import atomic_save_file
from peg._schema import Fields, parse_json
from peg._version import __version__
from peg.errors import ArchiveError

FORMAT = "peg-ensemble"
FORMAT_VERSION = 1
# meta["inputs"] of an archive without weights: a calibration map over saved logits (fitted
# on `nn.Identity()`), whose `stacked` and `shared` are empty (`peg.load(path)`)
LOGITS = "logits"
# what `with_meta` adds to the meta of the archives written in its block, and where they went
_ADDED: ContextVar[tuple[dict[str, Any], list[str]] | None] = ContextVar("added", default=None)


@contextmanager
def with_meta(entries: Mapping[str, Any]) -> Iterator[list[str]]:
    """Archives `write` writes inside the block gain `entries` in their meta (over keys of the
    same name); yields the list of the paths written with them (a `save` that does not go
    through `write`, Laplace's own format, adds none)."""
    written: list[str] = []
    token = _ADDED.set((dict(entries), written))
    try:
        yield written
    finally:
        _ADDED.reset(token)


def write(
    path: str | os.PathLike[str],
    stacked: Mapping[str, Tensor],
    shared: Mapping[str, Tensor],
    meta: Mapping[str, Any],
    architecture: str,
    calibration: Mapping[str, Tensor] | None = None,
) -> str:
    """Write an archive atomically: `stacked` entries `[M, *shape]`, `shared` ones, `meta` (JSON)
    and a calibration map's arrays (`calibration`, read back by `read_calibration`); returns the
    path as a string."""
    path = Path(path)
    added = _ADDED.get()
    if added is not None:
        meta = {**meta, **added[0]}
    tensors = {f"stacked/{k}": v.detach().cpu().contiguous() for k, v in stacked.items()}
    tensors |= {f"shared/{k}": v.detach().cpu().contiguous().clone() for k, v in shared.items()}
    extra = {
        f"calibration/{k}": v.detach().cpu().contiguous().clone()
        for k, v in (calibration or {}).items()
    }
    tensors |= extra
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "peg_version": __version__,
        "torch_version": torch.__version__,
        "architecture": architecture,
        # no stacked entries: a map over saved logits (`LOGITS`), one member, no weights
        "members": len(next(iter(stacked.values()))) if stacked else 1,
        "stacked": list(stacked),
        "shared": list(shared),
        "meta": dict(meta),
    }
    if extra:
        header["calibration"] = list(calibration or {})
    try:
        text = json.dumps(header, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"ensemble.meta: must be JSON-serialisable (finite numbers): {e}") from e
    atomic_save_file(tensors, {"peg": text}, path)
    if added is not None:
        added[1].append(str(path))
    return str(path)


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of a peg archive, without reading its tensors."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no peg archive at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise ArchiveError(f"{path}: not a peg archive (unreadable safetensors header: {e})") from e
    if not isinstance(metadata.get("peg"), str):
        raise ArchiveError(f"{path}: not a peg archive (no 'peg' JSON header)")
    return check_header(parse_json(metadata["peg"], str(path)), str(path))


def check_header(header: Any, where: str) -> dict[str, Any]:
    """`header` checked against the format (`where`: the file, for the errors): every field
    `read_tensors`, `peg.load` and `Ensemble` use, of its type and range, before any is used."""
    fields = Fields(header, where)
    if header.get("format") != FORMAT:
        raise ArchiveError(f"{where}: not a peg archive (format {header.get('format')!r})")
    version = fields.integer("format_version", minimum=1, optional=True, default=1)
    if version > FORMAT_VERSION:
        raise ArchiveError(
            f"{where}: archive format version {version} is newer than this peg reads "
            f"({FORMAT_VERSION}); upgrade peg"
        )
    meta_obj = header.get("meta")
    logits = isinstance(meta_obj, dict) and meta_obj.get("inputs") == LOGITS
    fields.integer("members", minimum=1, maximum=1 if logits else None)
    stacked, shared = fields.names("stacked", non_empty=not logits), fields.names("shared")
    if logits and (stacked or shared):
        raise fields.error("stacked", "no weights in a map over saved logits", stacked or shared)
    if len(set(stacked) | set(shared)) != len(stacked) + len(shared):
        raise fields.error("stacked", "names that appear once in 'stacked' and 'shared'", stacked)
    fields.names("calibration", optional=True)
    for key in ("architecture", "peg_version", "torch_version"):
        fields.text(key, optional=True)
    meta = fields.object("meta", optional=True)
    if meta is not None:
        meta.object("calibration", optional=True)
        if meta.obj.get("recipe") is not None:  # a PEG/PEP recipe, or a `peg.train.Recipe`
            meta.object("recipe")
    return header


def read_tensors(
    path: str | os.PathLike[str], header: Mapping[str, Any], device: str | torch.device = "cpu"
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The (stacked, shared) entries of the archive whose header is `header`, on `device`."""
    tensors: dict[str, Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensors[key] = f.get_tensor(key)
    except Exception as e:
        raise ArchiveError(f"{path}: damaged or truncated peg archive ({e})") from e
    stacked = {k: tensors.get(f"stacked/{k}") for k in header["stacked"]}
    shared = {k: tensors.get(f"shared/{k}") for k in header["shared"]}
    lost = [k for k, v in (stacked | shared).items() if v is None]
    if lost:
        raise ArchiveError(f"{path}: damaged peg archive (tensors missing: {lost[:5]})")
    members = header["members"]
    wrong = [k for k, v in stacked.items() if v is not None and (v.ndim == 0 or len(v) != members)]
    if wrong:
        raise ArchiveError(
            f"{path}: damaged peg archive (stacked tensors {wrong[:5]} do not hold the header's "
            f"{members} members)"
        )
    for kind, entries in (("stacked", stacked), ("shared", shared)):
        for k, v in entries.items():
            if v is not None and v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise ArchiveError(
                    f"{path}: damaged peg archive ({kind} tensor {k!r} holds NaN or inf weights)"
                )
    return stacked, shared  # type: ignore[return-value]


def read_calibration(path: str | os.PathLike[str], header: Mapping[str, Any]) -> dict[str, Tensor]:
    """The calibration map's arrays of the archive whose header is `header` (CPU; `{}` for an
    archive without them)."""
    names = header.get("calibration") or []
    if not names:
        return {}
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(f"calibration/{k}") for k in names}
    except Exception as e:
        raise ArchiveError(f"{path}: damaged peg archive (calibration tensors: {e})") from e
