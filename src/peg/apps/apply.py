"""`peg apply`: a calibration map fitted on saved logits, applied to a new `.npy` of logits.

The map is an archive without weights (`peg.archive.LOGITS`): what `peg select --val-logits ...
--save DIR` writes as DIR/chosen.peg, or any calibrator or conformal predictor fitted on
`nn.Identity()` and saved. The logits `[N, C]` are memory-mapped (read as `peg select --val-logits`
reads them: `sources.read_npy`) and mapped in blocks of `--batch-size` rows. What is written
to `--out` (atomically: a temporary file renamed over it):

- a calibrator's archive: the calibrated probabilities `[N, C]` (float32), each block checked
  (finite, rows summing to 1) before the rename;
- a conformal predictor's archive: its prediction sets `[N, C]` (bool: class c is in row n's
  set), what it was fitted for (its probabilities are its inner map's).

The logits' rule, every calibrator's: NaN, +inf and -inf are refused, naming the row (a class
ruled out is a large negative logit, not -inf: several maps could not carry -inf to 0).

Beside `--out`, `<out>.peg.json` records what was applied to what; it is also the mark that peg
wrote `--out`: it names the file, its size and SHA-256. An existing `--out` is replaced only
where such a record matches it byte for byte (a user's file of the same name, or one changed
since, is never overwritten). Every input is checked before anything is written; a failed run
leaves neither an `--out` nor a record of its own (the record is written last, just before the
rename, and removed if the rename fails).

Its options and description are `peg.apps.arguments`'s (built without importing torch).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

MARK = ".peg.json"  # the record beside --out, and the mark that peg wrote it
MADE_BY = "peg apply"
RECORD_BYTES = 1 << 24  # a record longer than this is not one peg wrote


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    from peg.apps.compare.state import file_hash
    from peg.apps.results import writable, write_json
    from peg.utils.env import git_commit, machine
    from peg.utils.io import atomic_target

    if args.batch_size < 1:
        raise ValueError(f"--batch-size: expected an integer >= 1, got {args.batch_size}")
    path = _archive(Path(args.map))
    mapped = _load(path)
    kind = _kind(mapped)  # a map fitted on another kind than multiclass: that kind's logits
    logits = _logits(args.logits, kind)
    out, record = _target(Path(args.out), {"--logits": Path(args.logits), "map": path})
    sets = hasattr(mapped, "sets_fn")  # a conformal predictor: its sets, what it was fitted for
    n, c = len(logits), (logits.shape[1] if logits.ndim > 1 else 1)
    for start in range(0, n, args.batch_size):  # bad rows said before anything is written
        _check_rows(np.asarray(logits[start : start + args.batch_size]), start)
    writable(out.parent, "--out")
    about = {
        "contents": "sets" if sets else "probabilities",
        "command": command,
        "map": str(path),
        "logits": args.logits,
        "shape": list(logits.shape),
        "commit": git_commit(),
        "machine": machine(),
        "map_meta": getattr(mapped, "meta_", None),
    }
    written = False
    try:
        with atomic_target(out) as tmp:
            _write(mapped, logits, tmp, args.batch_size, sets)
            # the record before the rename, naming the bytes: it never vouches for other ones
            mark = {
                "made_by": MADE_BY,
                "output": out.name,
                "bytes": os.path.getsize(tmp),
                "sha256": file_hash(Path(tmp)),
            }
            write_json(record, {**mark, **about}, strict=True)
            written = True
    except BaseException:
        if written:  # the rename failed: the record must not outlive what it describes
            record.unlink(missing_ok=True)
        raise
    what = f"{n} prediction sets over {c} classes, bool" if sets else f"{n} x {c} probabilities"
    print(f"apply: wrote {out} ({what}) and {record}")
    return 0


def _archive(path: Path) -> Path:
    """The archive: `path`, or DIR/chosen.peg for a folder (`peg select --save DIR`)."""
    if path.is_dir():
        path = path / "chosen.peg"
    if not path.is_file():
        raise FileNotFoundError(f"map: no saved map at {path}")
    return path


def _load(path: Path) -> Any:
    """The map of the archive at `path`: a calibrator or a conformal classifier."""
    from peg.loading import load

    try:
        mapped = load(path)
    except TypeError as e:  # an archive with weights: it needs its model, not logits
        raise ValueError(f"map: {e}") from None
    if not hasattr(mapped, "predict_proba"):
        raise ValueError(
            f"map: {path} holds a {type(mapped).__name__}, which gives neither class "
            "probabilities nor prediction sets"
        )
    return mapped


def _kind(mapped: Any) -> Any:
    """The kind of logits `mapped` was fitted on, None where multiclass (or not a map's)."""
    kind = getattr(mapped, "kind_", None)
    return None if kind is None or kind.kind == "multiclass" else kind


def _logits(path: str, kind: Any = None) -> np.ndarray:
    """Logits `[N, C]` (floating point, C >= 2; another `kind`'s: its shape) memory-mapped
    from a `.npy`, never a pickle."""
    from peg.apps.compare.sources import read_npy

    X = read_npy(path, "--logits", mmap=True)
    if kind is not None and X.dtype.kind == "f" and X.ndim >= 1 and len(X) >= 1:
        kind.check(tuple(X.shape), "--logits")
        return X
    if X.ndim != 2 or X.dtype.kind != "f" or X.shape[1] < 2 or X.shape[0] < 1:
        raise ValueError(
            f"--logits: expected floating-point logits [N, C] with N >= 1 and C >= 2, got an "
            f"array of shape {X.shape} and dtype {X.dtype} in {path}"
        )
    return X


def _check_rows(block: np.ndarray, start: int) -> None:
    """A ValueError naming the first row of `block` (row `start` of `--logits`) with NaN or
    ±inf: the calibrators' one rule (`peg.source._values.check_finite_logits`)."""
    bad = ~np.isfinite(block)
    if bad.any():
        i = int(np.argmax(bad.reshape(len(bad), -1).any(1)))
        row = block[i]
        which = "NaN" if np.isnan(row).any() else "+inf" if np.isposinf(row).any() else "-inf"
        raise ValueError(
            f"--logits: row {start + i} holds {which}; logits must be finite (a class ruled "
            "out: a large negative logit, not -inf); nothing was written"
        )


def _write(mapped: Any, logits: np.ndarray, tmp: str, batch_size: int, sets: bool) -> None:
    """The map's probabilities (float32), or a conformal predictor's sets (bool), `[N, C]`, of
    `logits` `[N, C]` into the `.npy` at `tmp`, block by block, each checked first."""
    import torch

    n, c = len(logits), (logits.shape[1] if logits.ndim > 1 else 1)
    dtype = np.bool_ if sets else np.float32
    result = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=logits.shape)
    make = mapped.sets_fn() if sets else None  # one stream: randomised draws in row order
    for start in range(0, n, batch_size):
        block = np.asarray(logits[start : start + batch_size])
        rows = torch.from_numpy(np.array(block, dtype=np.float32))  # a writable copy
        try:
            if make is not None:
                done = make(mapped.member_logits(rows)).numpy()
            else:
                done = mapped.predict_proba(rows).numpy().astype(np.float32)
        except ValueError as e:  # the map's own account, less its name for what it was given
            said = re.sub(r"^(logits|pred|X): ", "", str(e))
            end = start + len(block) - 1
            raise ValueError(f"--logits: rows {start}–{end}: {said}; nothing was written") from None
        if done.shape != block.shape:
            raise ValueError(
                f"--logits: the map gave {done.shape[-1]} columns for logits of {c} classes; "
                "it was not fitted on logits like these; nothing was written"
            )
        if make is None and _kind(mapped) is None:  # another kind's: P(y = 1), or [B, C, *S]
            _check_probabilities(done, start)
        result[start : start + len(block)] = done
    result.flush()
    del result


def _check_probabilities(probs: np.ndarray, start: int) -> None:
    """A ValueError naming the first row of `probs` `[B, C]` (row `start` of `--logits`) that
    is not a distribution: non-finite, negative, or not summing to 1."""
    from peg.metrics._inputs import PROB_ATOL

    sums = probs.sum(1, dtype=np.float64)
    bad = ~np.isfinite(sums) | (probs < 0).any(1) | (np.abs(sums - 1) > PROB_ATOL)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"--logits: row {start + i}: the map gave {probs[i].tolist()[:8]} (sum "
            f"{sums[i]:.6g}), not probabilities; nothing was written"
        )


def _target(out: Path, inputs: dict[str, Path]) -> tuple[Path, Path]:
    """`--out` and its record, checked before any work: a ValueError for another suffix, a
    folder or one of `inputs` (option: path), a NotADirectoryError for a path under a file, a
    FileExistsError for an existing `--out` that peg apply did not write (`_ours`)."""
    if out.suffix != ".npy":
        raise ValueError(f"--out: expected a .npy path, got {out}")
    record = out.with_name(out.name + MARK)
    if out.is_dir():
        raise ValueError(f"--out: {out} is a folder, expected a .npy file")
    for option, path in inputs.items():
        if out.exists() and path.exists() and os.path.samefile(out, path):
            raise ValueError(
                f"--out: {out} is the {option} file {path}; writing it would replace the input: "
                "give another path"
            )
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise NotADirectoryError(f"--out: {above} is a file, not a folder")
    if record.exists() and not record.is_file():
        raise IsADirectoryError(
            f"--out: {record} is a folder, where peg apply writes the record of {out.name}: move "
            "it away or give another path"
        )
    if out.exists():
        why = _ours(out, record)
        if why:
            raise FileExistsError(
                f"--out: {out} exists and peg apply did not write it ({why}); remove it or "
                "choose another path"
            )
    return out, record


def _ours(out: Path, record: Path) -> str:
    """The empty string where `record` is peg apply's record of the bytes now at `out` (its
    name, size and SHA-256); otherwise why not. The record is untrusted: read safely."""
    import json

    from peg.apps.compare.state import file_hash

    if not record.is_file():
        return f"no {record.name} beside it"
    try:
        with open(record, "rb") as f:
            text = f.read(RECORD_BYTES + 1)
        held = json.loads(text) if len(text) <= RECORD_BYTES else None
    except (OSError, ValueError, RecursionError):
        held = None
    if not isinstance(held, dict) or held.get("made_by") != MADE_BY:
        return f"{record.name} beside it is not a record of peg apply"
    size, digest = held.get("bytes"), held.get("sha256")
    if held.get("output") != out.name or not isinstance(size, int) or not isinstance(digest, str):
        return f"{record.name} beside it does not name this file"
    if out.stat().st_size != size or file_hash(out) != digest:
        return f"it changed since: its bytes are not those {record.name} records"
    return ""
