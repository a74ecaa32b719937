"""`peg apply`: a calibration map fitted on saved logits, applied to a new `.npy` of logits.

The map is an archive without weights (`peg.archive.LOGITS`): what `peg select --logits ...
--save DIR` writes as DIR/chosen.peg, or any calibrator or conformal predictor fitted on
`nn.Identity()` and saved. The logits `[N, C]` are memory-mapped and mapped in blocks of
`--batch-size` rows; the calibrated probabilities `[N, C]` (float32) go to `--out`, written
atomically (a temporary file renamed over it). Beside it, `<out>.peg.json` records what was
applied to what; it is also the mark that peg wrote `--out`: an existing `--out` without it is
never overwritten.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

DESCRIPTION = (
    "Load a calibration map fitted on saved logits (DIR/chosen.peg of `peg select --logits ... "
    "--save DIR`, or a calibrator's archive), apply it to a .npy of logits [N, C] and write the "
    "calibrated probabilities [N, C] (float32 .npy) to --out, with --out.peg.json beside it. "
    "See docs/calibration.md#saved-logits-no-model."
)
MARK = ".peg.json"  # the record beside --out, and the mark that peg wrote it


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("map", help="the saved map: a .peg archive, or the folder of peg select --save")
    p.add_argument("--logits", required=True, help="logits [N, C], a .npy (memory-mapped)")
    p.add_argument("--out", required=True, help="the probabilities [N, C], a .npy to write")
    p.add_argument("--batch-size", type=int, default=4096, help="rows per block (default: 4096)")


def run(args: argparse.Namespace, command: str, progress: bool | None) -> int:
    import torch

    from peg._env import git_commit, machine
    from peg._io import atomic_target
    from peg.apps.results import write_json
    from peg.loading import load

    if args.batch_size < 1:
        raise ValueError(f"--batch-size: expected an integer >= 1, got {args.batch_size}")
    path = _archive(Path(args.map))
    logits = _logits(args.logits)
    out, record = _target(Path(args.out))
    try:
        mapped = load(path)
    except TypeError as e:  # an archive with weights: it needs its model, not logits
        raise ValueError(f"map: {e}") from None
    n, c = logits.shape
    for start in range(0, n, args.batch_size):  # bad rows said before anything is written
        _check_finite(np.asarray(logits[start : start + args.batch_size]), start)
    # the record first: an interrupted run leaves --out marked as peg's, so a rerun replaces it
    write_json(record, {"command": command, "map": str(path), "logits": args.logits,
                        "shape": [n, c], "commit": git_commit(), "machine": machine(),
                        "map_meta": getattr(mapped, "meta_", None)}, strict=True)  # fmt: skip
    with atomic_target(out) as tmp:
        probs = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, c))
        for start in range(0, n, args.batch_size):
            block = np.asarray(logits[start : start + args.batch_size])
            rows = torch.from_numpy(np.array(block, dtype=np.float32))  # a writable copy
            probs[start : start + len(block)] = mapped.predict_proba(rows).numpy()
        probs.flush()
        del probs
    print(f"apply: wrote {out} ({n} x {c} probabilities) and {record}")
    return 0


def _archive(path: Path) -> Path:
    """The archive: `path`, or DIR/chosen.peg for a folder (`peg select --save DIR`)."""
    if path.is_dir():
        path = path / "chosen.peg"
    if not path.is_file():
        raise FileNotFoundError(f"map: no saved map at {path}")
    return path


def _logits(path: str) -> np.ndarray:
    """Logits `[N, C]` (floating point, C >= 2) memory-mapped from a `.npy`, never a pickle."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--logits: no file at {path}")
    try:
        X = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # a truncated file, a planted pickle, not a .npy
        raise ValueError(f"--logits: {path} is not a readable .npy array ({e})") from None
    if X.ndim != 2 or X.dtype.kind != "f" or X.shape[1] < 2 or X.shape[0] < 1:
        raise ValueError(
            f"--logits: expected floating-point logits [N, C] with N >= 1 and C >= 2, got an "
            f"array of shape {X.shape} and dtype {X.dtype} in {path}"
        )
    return X


def _check_finite(block: np.ndarray, start: int) -> None:
    """A ValueError naming the first row with NaN or +inf (-inf, a probability of 0, is kept)."""
    bad = np.isnan(block) | np.isposinf(block)
    if bad.any():
        row = start + int(np.argmax(bad.any(1)))
        raise ValueError(f"--logits: row {row} holds NaN or +inf; nothing was written")


def _target(out: Path) -> tuple[Path, Path]:
    """`--out` and its record; a FileExistsError for an existing `--out` peg did not write."""
    if out.suffix != ".npy":
        raise ValueError(f"--out: expected a .npy path, got {out}")
    record = out.with_name(out.name + MARK)
    if out.is_dir():
        raise ValueError(f"--out: {out} is a folder, expected a .npy file")
    if out.exists() and not record.is_file():
        raise FileExistsError(
            f"--out: {out} exists and peg did not write it (no {record.name} beside it); "
            "remove it or choose another path"
        )
    return out, record
