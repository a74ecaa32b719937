"""A registry of the data sets the library loads without a network: `load(name, split)`.

| name | splits | X | C | files (under a data root) or source |
|---|---|---|---|---|
| fashion-mnist | train 60k, test 10k | `[N, 1, 28, 28]` | 10 | `fashion-mnist/*-ubyte.gz` |
| mnist | test 10k (train if present) | `[N, 1, 28, 28]` | 10 | `mnist_test/` or `mnist/` |
| notmnist | test 10k (train if present) | `[N, 1, 28, 28]` | 10 | `notmnist_test/`, `notmnist/` |
| digits | train 1437, test 360 | `[N, 1, 8, 8]` | 10 | scikit-learn, stratified 80:20 |
| two-moons | train, test: 1000 each | `[N, 2]` | 2 | generated (`toy.two_moons`) |
| three-moons | train, test: 1200 each | `[N, 2]` | 3 | generated (`toy.three_moons`) |
| linear | train, test: 1000 each | `[N, 2]` | 2 | generated (`toy.linear`) |

Images are float32 in [0, 1] (pixel / 255; digits / 16), without mean/std normalisation;
labels are int64. Data roots are searched as `peg.data.roots.data_roots` says (set
`PEG_DATA_ONLY=1` to search only `root` and `$PEG_DATA`). A missing data set raises
FileNotFoundError naming it, the roots searched and what to install; nothing is downloaded.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.data import toy
from peg.data.idx import read_idx
from peg.data.roots import PathLike, find

Pair = tuple[Tensor, Tensor]

_FASHION_HINT = (
    "Install it with `apt-get install dataset-fashion-mnist` (Debian) or put the IDX files "
    "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
    "t10k-labels-idx1-ubyte.gz) under $PEG_DATA/fashion-mnist/."
)
# name: (folders tried per split, install hint)
_IDX_SETS: dict[str, tuple[dict[str, tuple[str, ...]], str]] = {
    "fashion-mnist": (
        {"train": ("fashion-mnist",), "test": ("fashion-mnist",)},
        _FASHION_HINT,
    ),
    "mnist": (
        {"train": ("mnist",), "test": ("mnist_test", "mnist")},
        "Put the MNIST IDX files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) under "
        "$PEG_DATA/mnist_test/ (the project's ../shared/data has them); a training split is "
        "read from $PEG_DATA/mnist/train-*-ubyte.gz if you have it.",
    ),
    "notmnist": (
        {"train": ("notmnist",), "test": ("notmnist_test", "notmnist")},
        "Put the notMNIST IDX files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) "
        "under $PEG_DATA/notmnist_test/ (the project's ../shared/data has them); a training "
        "split is read from $PEG_DATA/notmnist/train-*-ubyte.gz if you have it.",
    ),
}
# name: (generator, points per split)
_TOY: dict[str, tuple[Callable[..., Pair], int]] = {
    "two-moons": (toy.two_moons, 1000),
    "three-moons": (toy.three_moons, 1200),
    "linear": (toy.linear, 1000),
}
_TEST_SEED_OFFSET = 10_000
_CLASSES = {
    "fashion-mnist": 10,
    "mnist": 10,
    "notmnist": 10,
    "digits": 10,
    "two-moons": 2,
    "three-moons": 3,
    "linear": 2,
}
_SHAPES: dict[str, tuple[int, ...]] = {
    "fashion-mnist": (1, 28, 28),
    "mnist": (1, 28, 28),
    "notmnist": (1, 28, 28),
    "digits": (1, 8, 8),
    "two-moons": (2,),
    "three-moons": (2,),
    "linear": (2,),
}
_SPLITS = ("train", "test")


def names() -> list[str]:
    """Every data set `load` knows, sorted."""
    return sorted(_CLASSES)


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise ValueError(f"name: expected a data set name (str), got {type(name).__name__}")
    key = name.strip().lower().replace("_", "-")
    if key not in _CLASSES:
        raise ValueError(f"name: unknown data set {name!r}; known: {', '.join(names())}")
    return key


def num_classes(name: str) -> int:
    """Number of classes C of data set `name` (labels are 0..C-1)."""
    return _CLASSES[_canonical(name)]


def input_shape(name: str) -> tuple[int, ...]:
    """Shape of one input of data set `name`: (1, 28, 28), (1, 8, 8) or (2,)."""
    return _SHAPES[_canonical(name)]


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    return int(seed)


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int) -> np.ndarray:
    """read_idx, cached per (path, modification time, size); callers must not modify it."""
    del mtime_ns, size  # part of the cache key only
    array = read_idx(path)
    array.flags.writeable = False
    return array


def _read(path: Path) -> np.ndarray:
    st = path.stat()
    return _read_cached(str(path), st.st_mtime_ns, st.st_size)


def _load_idx(name: str, split: str, root: PathLike | Sequence[PathLike] | None) -> Pair:
    folders, hint = _IDX_SETS[name]
    prefix = "train" if split == "train" else "t10k"
    images_name = f"{prefix}-images-idx3-ubyte.gz"
    labels_name = f"{prefix}-labels-idx1-ubyte.gz"
    errors = []
    for folder in folders[split]:
        try:
            images_path = find(f"{folder}/{images_name}", root)
            labels_path = find(f"{folder}/{labels_name}", root)
            break
        except FileNotFoundError as e:
            errors.append(str(e))
    else:
        raise FileNotFoundError(
            f"data set {name!r} ({split} split) not found. {hint}\n" + "\n".join(errors)
        )
    images, labels = _read(images_path), _read(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{images_path}: expected uint8 images [N, H, W], got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1:
        raise ValueError(f"{labels_path}: expected labels [N], got shape {labels.shape}")
    if len(images) != len(labels):
        raise ValueError(
            f"{images_path.parent}: {len(images)} images but {len(labels)} labels "
            f"({images_path.name}, {labels_path.name})"
        )
    X = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return X, y


def _load_digits(split: str, seed: int) -> Pair:
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.from_numpy((d.images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(d.target.astype(np.int64))
    X_train, y_train, X_test, y_test = train_val_split(X, y, 0.2, seed=seed)
    return (X_train, y_train) if split == "train" else (X_test, y_test)


def load(
    name: str,
    split: str = "train",
    root: PathLike | Sequence[PathLike] | None = None,
    seed: int = 0,
    **options: Any,
) -> Pair:
    """Load one split of a data set as `(X, y)`.

    Args:
        name: one of `names()` ("fashion-mnist", "mnist", "notmnist", "digits", "two-moons",
            "three-moons", "linear"); case and "_" vs "-" are ignored.
        split: "train" or "test". mnist and notmnist have a test split only (unless the
            training files are present under `<root>/mnist/` or `<root>/notmnist/`).
        root: data root(s) searched before the default ones (see `peg.data.roots`).
        seed: for digits, the seed of the stratified 80:20 train/test split; for the toy sets,
            the train split is generated from `seed` and the test split from `seed + 10000`.
            Unused for the IDX data sets (their order is the files').
        **options: toy sets only, passed to the generator (e.g. `n=400, noise=0.2`).

    Returns:
        `(X, y)`: images `[N, 1, H, W]` float32 in [0, 1] or points `[N, 2]` float32, and
        labels `[N]` int64.

    Raises:
        ValueError: unknown name (the message lists the known ones), unknown split, options
            for a data set that takes none.
        FileNotFoundError: the data set's files are not under any data root; the message names
            the data set, the roots searched and what to install.
    """
    key = _canonical(name)
    if split not in _SPLITS:
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    seed = _check_seed(seed)
    if options and key not in _TOY:
        raise ValueError(
            f"options: {key} takes no options, got {sorted(options)} (only the toy sets "
            f"{sorted(_TOY)} do)"
        )
    if key in _IDX_SETS:
        return _load_idx(key, split, root)
    if key == "digits":
        return _load_digits(split, seed)
    make, n = _TOY[key]
    options.setdefault("n", n)
    return make(seed=seed if split == "train" else seed + _TEST_SEED_OFFSET, **options)


def _split_counts(counts: np.ndarray, total: int) -> np.ndarray:
    """Per-class validation counts summing to `total`, proportional to `counts` (largest
    remainder method; ties go to the earlier class)."""
    quota = counts * (total / counts.sum())
    base = np.floor(quota).astype(np.int64)
    extra = total - int(base.sum())
    if extra > 0:
        order = np.argsort(-(quota - base), kind="stable")
        base[order[:extra]] += 1
    return base


def train_val_split(
    X: Tensor | np.ndarray,
    y: Tensor | np.ndarray,
    val_fraction: float = 0.2,
    seed: int = 0,
    stratify: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Seeded split into training and validation parts, stratified by class (PEG paper: 80:20).

    The validation part holds ceil(N · val_fraction) points (scikit-learn's rounding), shared
    among the classes in proportion to their sizes (largest-remainder rounding), so every class
    is split 80:20 up to one point. Both parts keep the original order of the points.

    Args:
        X: inputs `[N, ...]`.
        y: labels `[N]` (integers; with `stratify=False` any values, e.g. regression targets).
        val_fraction: share of the points for validation, 0 < val_fraction < 1.
        seed: seed of the NumPy generator choosing the points.
        stratify: keep class proportions (needs integer labels); False: a plain random split.

    Returns:
        `(X_train, y_train, X_val, y_val)`, tensors (numpy inputs are converted).
    """
    X = torch.as_tensor(X)
    y = torch.as_tensor(y)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float, np.floating)):
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    if not 0 < float(val_fraction) < 1:
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    seed = _check_seed(seed)
    if X.ndim == 0 or y.ndim != 1:
        raise ValueError(
            f"X, y: expected X [N, ...] and y [N], got shapes {tuple(X.shape)} and {tuple(y.shape)}"
        )
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X, y: {X.shape[0]} inputs but {y.shape[0]} labels")
    n = int(y.shape[0])
    n_val = math.ceil(n * float(val_fraction) - 1e-9)  # as scikit-learn's test_size
    if not 1 <= n_val <= n - 1:
        raise ValueError(
            f"val_fraction: {val_fraction} of {n} points leaves an empty training or "
            "validation part"
        )
    rng = np.random.default_rng(seed)
    if stratify:
        if torch.is_floating_point(y) or torch.is_complex(y) or y.dtype == torch.bool:
            raise ValueError(
                f"y: stratified splitting needs integer class labels, got {y.dtype} "
                "(pass stratify=False for a plain random split)"
            )
        labels = y.cpu().numpy()
        classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        per_class = _split_counts(counts, n_val)
        chosen = []
        for c in range(len(classes)):
            members = np.flatnonzero(inverse == c)
            chosen.append(rng.permutation(members)[: per_class[c]])
        val_idx = np.sort(np.concatenate(chosen))
    else:
        val_idx = np.sort(rng.permutation(n)[:n_val])
    mask = np.ones(n, dtype=bool)
    mask[val_idx] = False
    train_idx = torch.from_numpy(np.flatnonzero(mask)).to(X.device)
    val_t = torch.from_numpy(val_idx).to(X.device)
    return X[train_idx], y[train_idx], X[val_t], y[val_t]
