"""The archive file format (only the format: `peg.loading` turns an archive into an ensemble).

One safetensors file whose header carries a JSON description.

Nothing is unpickled: tensors are safetensors, everything else is JSON stored under the
header's metadata key ``"peg"``::

    {"format": "peg-ensemble", "format_version": 1, "peg_version": ..., "torch_version": ...,
     "members": M, "stacked": [names], "shared": [names], "meta": {method, hyper-parameters,
     seed, ...}, "tensors_sha256": hex, "header_sha256": hex}

`tensors_sha256` (`tensors_digest`; absent from archives written before it) is checked when the
tensors are read: bytes changed after the write (zeroed, flipped) are an `ArchiveError`, not a
model that loads and predicts something else. `header_sha256` (`header_digest`, over the
canonical JSON of the rest of the header, `tensors_sha256` included; absent from archives written
before it, which load unchecked) is checked when the header is read: a map that lives in
the header (a temperature, a conformal quantile, the score it is for, the architecture a
weightless map was fitted on) is covered as the tensors are.

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

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from peg._schema import Fields, parse_json
from peg._version import __version__
from peg.errors import ArchiveError
from peg.utils.io import atomic_save_file, target_path

FORMAT = "peg-ensemble"
FORMAT_VERSION = 1
# meta["inputs"] of an archive without weights, whose `stacked` and `shared` are empty: a
# calibration map over saved logits (fitted on `nn.Identity()`: `peg.load(path)`), or over the
# outputs of a module without weights, its architecture recorded (`peg.load(path, module)`)
LOGITS = "logits"
MODULE = "module"
WEIGHTLESS = (LOGITS, MODULE)
# the architectures of a map over saved logits: `nn.Identity()` given by the user, or the
# `SavedLogits` (an `nn.Identity`) that `fit(logits, labels)` reads them through
LOGITS_MODULES = ("Identity", "SavedLogits")
MODULE_REPR = 2000  # characters of a weightless module's `repr` (meta["module"]) kept, at most
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
    path as a string (a ValueError naming `path` for "" or a folder, before any work)."""
    path = target_path(path)
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
    header["tensors_sha256"] = tensors_digest(tensors)
    try:
        header["header_sha256"] = header_digest(header)
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
    header = parse_json(metadata["peg"], str(path))
    digest = header.get("header_sha256") if isinstance(header, dict) else None
    if isinstance(digest, str) and header_digest(header) != digest:
        raise ArchiveError(
            f"{path}: damaged peg archive (its header does not match the SHA-256 it records: "
            "changed after it was written)"
        )
    return check_header(header, str(path))


def header_digest(header: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no spaces, ASCII) of `header` less its
    `header_sha256`.

    Why: the tensors' digest left the header out, and for temperature scaling, ensemble
    temperature scaling and conformal prediction the map *is* the header (a conformal quantile
    edited to -5 loaded with coverage 0; a temperature scaling archive's digest was that of no
    bytes). Python's JSON writes a float as the shortest text that reads back as it, so the
    header parsed and written again gives the same bytes. As `tensors_digest`, it detects
    damage and edits, not a forger (who can rewrite both digests)."""
    body = {k: v for k, v in header.items() if k != "header_sha256"}
    # any parsed header has one (`Infinity` included: the field checks refuse it by name)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


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
    weightless = isinstance(meta_obj, dict) and meta_obj.get("inputs") in WEIGHTLESS
    fields.integer("members", minimum=1, maximum=1 if weightless else None)
    stacked, shared = fields.names("stacked", non_empty=not weightless), fields.names("shared")
    if weightless and (stacked or shared):
        raise fields.error("stacked", "no weights in a map over saved logits", stacked or shared)
    if len(set(stacked) | set(shared)) != len(stacked) + len(shared):
        raise fields.error("stacked", "names that appear once in 'stacked' and 'shared'", stacked)
    fields.names("calibration", optional=True)
    for key in ("tensors_sha256", "header_sha256"):
        fields.get(
            key,
            lambda v: isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v),
            "a SHA-256 hex digest",
            optional=True,
        )
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
    tensors = _checked_tensors(path, header, device)
    named = [(kind, k) for kind in ("stacked", "shared") for k in header[kind]]
    lost = [k for kind, k in named if f"{kind}/{k}" not in tensors]
    if lost:
        raise ArchiveError(f"{path}: damaged peg archive (tensors missing: {lost[:5]})")
    stacked = {k: tensors[f"stacked/{k}"] for k in header["stacked"]}
    shared = {k: tensors[f"shared/{k}"] for k in header["shared"]}
    members = header["members"]
    wrong = [k for k, v in stacked.items() if v.ndim == 0 or len(v) != members]
    if wrong:
        raise ArchiveError(
            f"{path}: damaged peg archive (stacked tensors {wrong[:5]} do not hold the header's "
            f"{members} members)"
        )
    for kind, entries in (("stacked", stacked), ("shared", shared)):
        for k, v in entries.items():
            if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise ArchiveError(
                    f"{path}: damaged peg archive ({kind} tensor {k!r} holds NaN or inf weights)"
                )
    return stacked, shared


# the digest hashes pieces of this many bytes on their own (in threads: hashlib releases the GIL),
# then their digests in order: the same value whatever the number of threads
DIGEST_PIECE = 1 << 26


def tensors_digest(tensors: Mapping[str, Tensor]) -> str:
    """SHA-256 over every tensor of an archive: per tensor (in name order) its name, dtype and
    shape, then the SHA-256 of each `DIGEST_PIECE`-byte piece of its bytes.

    Why: safetensors checks the layout, not the values: an archive whose bytes were zeroed
    loaded and predicted uniform probabilities. Archives written before carry none (they load
    unchecked); this guards against damage, not against a forger, who can rewrite the digest.
    The pieces are hashed in parallel (SHA-256 runs at 0.3–2 GB/s a core).
    """
    heads, pieces = [], []
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        flat = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        heads.append((f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode(), len(pieces)))
        pieces += [flat[a : a + DIGEST_PIECE] for a in range(0, len(flat), DIGEST_PIECE)]
    workers = min(len(pieces), os.cpu_count() or 1)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(lambda b: hashlib.sha256(b).digest(), pieces))
    else:
        digests = [hashlib.sha256(b).digest() for b in pieces]
    h = hashlib.sha256()
    for i, (head, first) in enumerate(heads):
        h.update(head)
        last = heads[i + 1][1] if i + 1 < len(heads) else len(digests)
        h.update(b"".join(digests[first:last]))
    return h.hexdigest()


def _checked_tensors(
    path: str | os.PathLike[str], header: Mapping[str, Any], device: str | torch.device = "cpu"
) -> dict[str, Tensor]:
    """Every tensor of the archive, checked against the header's `tensors_sha256` (when it has
    one: archives written before it load unchecked)."""
    tensors: dict[str, Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensors[key] = f.get_tensor(key)
    except Exception as e:
        raise ArchiveError(f"{path}: damaged or truncated peg archive ({e})") from e
    digest = header.get("tensors_sha256")
    if digest is not None and tensors_digest(tensors) != digest:
        raise ArchiveError(
            f"{path}: damaged peg archive (its tensors' bytes do not match the SHA-256 its header "
            "records: changed after it was written)"
        )
    return tensors


def read_calibration(path: str | os.PathLike[str], header: Mapping[str, Any]) -> dict[str, Tensor]:
    """The calibration map's arrays of the archive whose header is `header` (CPU; `{}` for an
    archive without them). A map over saved logits (no weights) is checked against the
    header's digest here, as `read_tensors` checks the others (which read the map's arrays)."""
    names = header.get("calibration") or []
    if not names:
        return {}
    if not header.get("stacked"):  # `LOGITS`: its only tensors are the map's
        tensors = _checked_tensors(path, header)
        lost = [k for k in names if f"calibration/{k}" not in tensors]
        if lost:
            raise ArchiveError(f"{path}: damaged peg archive (calibration tensors {lost} missing)")
        return {k: tensors[f"calibration/{k}"] for k in names}
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(f"calibration/{k}") for k in names}
    except Exception as e:
        raise ArchiveError(f"{path}: damaged peg archive (calibration tensors: {e})") from e
